#!/usr/bin/env bash
# Creates (or reuses) the Python venv for the end-to-end tests: build/venv-e2e with the
# pinned packages of tests/e2e/requirements.txt. Idempotent: when the venv exists and was
# built from the same requirements, it returns at once without touching the network.
# Usage: scripts/test-venv.sh [BUILD_DIR]   (prints the venv's python on the last line)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-$root/build}"
venv="$build_dir/venv-e2e"
requirements="$root/tests/e2e/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$requirements" | cut -d' ' -f1)"

if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "$venv/bin/python"
  exit 0
fi
echo "test-venv: creating $venv" >&2
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements" >&2
echo "$want" > "$stamp"
echo "$venv/bin/python"
