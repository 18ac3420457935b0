#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test tessera. Idempotent:
# a second run installs nothing and returns quickly.
set -euo pipefail
need=()
for pkg in cmake ninja-build g++ pkg-config libgtest-dev nlohmann-json3-dev libpcre2-dev \
           libcli11-dev libssl-dev libxxhash-dev libboost-dev python3 python3-venv ccache clang-format \
           chromium chromium-driver; do  # the last two: the web page's e2e test (tests/e2e)
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "bootstrap: installing ${need[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi
