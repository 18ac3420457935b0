#!/usr/bin/env bash
# What the fuzz and sanitizer builds need beyond scripts/bootstrap.sh: Debian's clang (libFuzzer
# and the sanitizer runtimes come with it). Idempotent.
set -euo pipefail
bash "$(dirname "$0")/bootstrap.sh"
need=()
for pkg in clang libclang-rt-dev; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
# Older Debian ships the runtimes inside libclang-common-*-dev instead of libclang-rt-dev.
if [[ " ${need[*]} " == *" libclang-rt-dev "* ]] && ! apt-cache show libclang-rt-dev >/dev/null 2>&1; then
  need=("${need[@]/libclang-rt-dev/}")
fi
need=(${need[@]})
if [ ${#need[@]} -gt 0 ]; then
  echo "fuzz-deps: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
