#!/usr/bin/env bash
# Fails when a file under src/ includes a header of a layer its library does not list
# (cmake/layers.cmake; rules in docs/design/layers.md). Run by `make test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/check_layers.py "$@"
