#!/usr/bin/env bash
# Runs the end-to-end suite (ctest's "e2e" test): makes the pinned venv, then pytest on
# tests/e2e against BUILD_DIR/bin/tessera. Exit 77 (ctest: skipped) when the model file
# is missing, which is the only reason to skip.
# Usage: tests/e2e/run.sh [BUILD_DIR] [pytest args...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build_dir="$(cd "${1:-$root/build}" && pwd)"
shift || true
model="${TESSERA_CACHE:-$HOME/.cache/tessera/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
if [ ! -f "$model" ]; then
  echo "e2e: skipped, model file missing: $model (make model)"
  exit 77
fi
python="$("$root/scripts/test-venv.sh" "$build_dir" | tail -n 1)"
export PYTHONDONTWRITEBYTECODE=1  # keep the source tree clean
export TESSERA_BIN="${TESSERA_BIN:-$build_dir/bin/tessera}"
cd "$root/tests/e2e"
exec "$python" -m pytest -p no:cacheprovider -q -ra "$@" .
