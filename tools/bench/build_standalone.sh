#!/usr/bin/env bash
# Builds the matmul unit tests and benchmark without CMake, from the sources they need only
# (core + backend/cpu): for machines that lack the engine's other build dependencies.
# Usage: tools/bench/build_standalone.sh OUT_DIR   (then OUT_DIR/matmul_tests, OUT_DIR/matmul_bench)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: build_standalone.sh OUT_DIR}
mkdir -p "$out/obj"
cxx="${CXX:-g++} -std=c++20 -O3 -DNDEBUG -I$src/src -I$src/tests -DTESSERA_FIXTURES_DIR=\"$src/tests/fixtures\""
pids=()
for f in "$src"/src/core/*.cpp "$src"/src/backend/cpu/*.cpp; do
  case "$f" in
    *_avx512.cpp) fl="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mavx2 -mfma -mf16c" ;;
    *_avx2.cpp) fl="-mavx2 -mfma -mf16c -mbmi2" ;;
    *) fl="" ;;
  esac
  $cxx $fl -c "$f" -o "$out/obj/$(basename "$f" .cpp).o" & pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
$cxx -c "$src/tests/unit/backend/matmul_test.cpp" -o "$out/matmul_test.o"
$cxx "$out/matmul_test.o" "$out"/obj/*.o -lgtest -lgtest_main -lpthread -o "$out/matmul_tests"
if [ -f "$src/tools/bench/matmul_bench.cpp" ]; then
  $cxx "$src/tools/bench/matmul_bench.cpp" "$out"/obj/*.o -lpthread -o "$out/matmul_bench"
fi
