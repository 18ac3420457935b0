#!/usr/bin/env bash
# Builds XGrammar's C++ core (structured output, src/grammar/) from its pinned PyPI source
# distribution into a cache outside the repository, without its Python bindings. Idempotent:
# once built, it prints the install prefix and returns at once without the network.
# Usage: scripts/xgrammar-deps.sh   (prints the install prefix on the last line)
# Cold: about 5 minutes on 2 cores (docs/design/structured-output.md).
set -euo pipefail
version=0.2.9
sha256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
cache="${TESSERA_CACHE_ROOT:-$HOME/.cache/tessera}/xgrammar"
src="$cache/xgrammar-$version"
build="$cache/build-$version"
prefix="$cache/install-$version"
stamp="$prefix/.built-$sha256"
jobs="${XGRAMMAR_JOBS:-2}"

if [ -f "$stamp" ] && [ -f "$prefix/lib/libxgrammar.a" ]; then
  echo "$prefix"
  exit 0
fi
mkdir -p "$cache"
sdist="$cache/xgrammar-$version.tar.gz"
if [ ! -f "$sdist" ] || [ "$(sha256sum "$sdist" | cut -d' ' -f1)" != "$sha256" ]; then
  rm -f "$sdist"
  # pip needs a venv of its own on Debian (the system Python is externally managed).
  if [ ! -x "$cache/pip-venv/bin/pip" ]; then
    python3 -m venv "$cache/pip-venv" >&2
  fi
  echo "xgrammar-deps: downloading xgrammar==$version (source distribution)" >&2
  # --no-binary for xgrammar only: its build tools may come as wheels (faster metadata).
  "$cache/pip-venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    --no-binary xgrammar "xgrammar==$version" -d "$cache" >&2
fi
got="$(sha256sum "$sdist" | cut -d' ' -f1)"
if [ "$got" != "$sha256" ]; then
  echo "xgrammar-deps: $sdist has sha256 $got, expected $sha256" >&2
  exit 1
fi
rm -rf "$src" "$build" "$prefix"
tar -xzf "$sdist" -C "$cache"
mkdir -p "$build"
# The build directory's config.cmake wins over the sdist's (which turns the Python bindings on).
cat > "$build/config.cmake" <<'EOF'
set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)
set(XGRAMMAR_BUILD_CXX_TESTS OFF)
set(XGRAMMAR_ENABLE_CPPTRACE OFF)
set(XGRAMMAR_ENABLE_COVERAGE OFF)
set(XGRAMMAR_ENABLE_INTERNAL_CHECK OFF)
EOF
echo "xgrammar-deps: building the C++ library with $jobs jobs" >&2
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -fno-lto: its flags ask for LTO, whose objects a non-LTO link of tessera could not use;
# -Wno-error: a newer compiler's new warning must not fail the build.
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" "${launcher[@]}" >&2
cmake --build "$build" -j "$jobs" --target xgrammar >&2
cmake --install "$build" >&2
touch "$stamp"
echo "$prefix"
