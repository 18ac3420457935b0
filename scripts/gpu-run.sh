#!/usr/bin/env bash
# The command a session sends to the lent GPU machine (docs/design/cuda-backend.md, gpu-check):
# sets up the PCRE2 files carried in .gpu/deps (the GPU image lacks them), then runs
# scripts/gpu-check.sh with the binaries built on the dev machine when they were carried
# (build/bin, with build/bin/lib) and start there, else building there.
#
#   device run, carry [".gpu/deps", "build/bin"]:  GPU_CHECK_...=... bash scripts/gpu-run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ -d .gpu/deps ]]; then
  sed -i "s|DEPSDIR|$PWD/.gpu/deps|g" .gpu/deps/lib/pkgconfig/libpcre2-8.pc
  export PKG_CONFIG_PATH=$PWD/.gpu/deps/lib/pkgconfig
  export LD_LIBRARY_PATH=$PWD/.gpu/deps/lib:${LD_LIBRARY_PATH:-}
fi
OUT=${OUT:-$PWD/gpu-check-out} exec bash scripts/gpu-check.sh --prebuilt-if-usable build/bin
