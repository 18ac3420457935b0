#!/usr/bin/env bash
# The command a session sends to the lent GPU machine (docs/design/cuda-backend.md, gpu-check):
# sets up the PCRE2 files carried in .gpu/deps (the GPU image lacks them), uses the binaries
# built on the dev machine when they were carried (build/bin, with build/bin/lib) and start
# there, else builds there, then runs scripts/gpu-check.sh with the environment given.
#
#   device run, carry [".gpu/deps", "build/bin"]:  GPU_CHECK_...=... bash scripts/gpu-run.sh
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ -d .gpu/deps ]]; then
  sed -i "s|DEPSDIR|$PWD/.gpu/deps|g" .gpu/deps/lib/pkgconfig/libpcre2-8.pc
  export PKG_CONFIG_PATH=$PWD/.gpu/deps/lib/pkgconfig
  export LD_LIBRARY_PATH=$PWD/.gpu/deps/lib:${LD_LIBRARY_PATH:-}
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null); do
  [[ -e "$d/libcublasLt.so.13" ]] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
args=()
if [[ -x build/bin/tessera_tests && -x build/bin/tessera ]] &&
   LD_LIBRARY_PATH=$PWD/build/bin/lib:$LD_LIBRARY_PATH build/bin/tessera_tests --gtest_list_tests >/dev/null 2>&1; then
  echo "[gpu-run] using the carried binaries (build/bin)"
  args=(--prebuilt build/bin)
else
  echo "[gpu-run] no usable carried binaries: building here"
fi
OUT=${OUT:-$PWD/gpu-check-out} exec bash scripts/gpu-check.sh "${args[@]}"
