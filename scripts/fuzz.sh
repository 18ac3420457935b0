#!/usr/bin/env bash
# libFuzzer targets of tests/fuzz (clang, ASan + UBSan, -O1 -gline-tables-only), built in
# build-fuzz/ from their own small CMake project. Results: docs/benchmarks/fuzzing.md.
#   scripts/fuzz.sh smoke [seconds]        every target for SECONDS (default 20) from its seeds (CI)
#   scripts/fuzz.sh long [seconds]         every target for SECONDS (default 1800), corpus kept
#   scripts/fuzz.sh run <target> <seconds> one target, corpus kept in build-fuzz/corpus/<target>
#   scripts/fuzz.sh repro <target> <file>  run one input (a crash file) through a target
#   scripts/fuzz.sh build                  build the targets only
# Crash files land in build-fuzz/crashes/<target>/; each becomes a gtest and a fix.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FUZZ_BUILD_DIR:-$root/build-fuzz}"
targets=(gguf_reader safetensors_header http_request request_params jinja_template tokenizer_roundtrip)

usage() {
  sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

build_targets() {
  bash "$root/scripts/fuzz-deps.sh"
  if [ ! -f "$build/build.ninja" ]; then
    cmake -S "$root/tests/fuzz" -B "$build" -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ >/dev/null
  fi
  cmake --build "$build" -j "${JOBS:-2}"
}

known_target() {
  local t
  for t in "${targets[@]}"; do [ "$t" = "$1" ] && return 0; done
  echo "fuzz: unknown target '$1' (one of: ${targets[*]})" >&2
  exit 2
}

# run_target TARGET SECONDS CORPUS_DIR: fuzz from the committed seeds plus CORPUS_DIR (new
# inputs go there), with the target's dictionary; prints one summary line.
run_target() {
  local t="$1" seconds="$2" corpus="$3"
  local crashes="$build/crashes/$t" log="$build/logs/$t.log"
  mkdir -p "$corpus" "$crashes" "$build/logs"
  local start=$SECONDS rc=0
  # -rss_limit_mb: the tokenizer targets map two model files; ASan's shadow adds to it.
  ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$build/bin/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 -max_len=16384 \
    -dict="$root/tests/fuzz/dict/$t.dict" -artifact_prefix="$crashes/" -print_final_stats=1 \
    "$corpus" "$root/tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  local execs cov
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo '?')"
  cov="$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 | grep -o '[0-9]*' || echo '?')"
  printf 'fuzz: %-20s %4ss  %10s runs  cov %6s  %s\n' "$t" "$((SECONDS - start))" "$execs" "$cov" \
    "$([ $rc -eq 0 ] && echo ok || echo "FOUND (rc $rc): $log")"
  if [ $rc -ne 0 ]; then
    grep -E 'ERROR|runtime error|SUMMARY|Test unit written' "$log" | head -n 8 >&2 || true
  fi
  return $rc
}

cmd="${1:-}"
case "$cmd" in
  build)
    build_targets
    ;;
  smoke | long)
    seconds="${2:-$([ "$cmd" = smoke ] && echo 20 || echo 1800)}"
    build_targets
    failed=0
    for t in "${targets[@]}"; do
      # smoke: a scratch corpus each time, so CI results do not depend on earlier runs.
      corpus="$build/corpus/$t"
      [ "$cmd" = smoke ] && corpus="$build/smoke-corpus/$t" && rm -rf "$corpus"
      run_target "$t" "$seconds" "$corpus" || failed=1
    done
    exit $failed
    ;;
  run)
    [ $# -eq 3 ] || usage
    known_target "$2"
    build_targets
    run_target "$2" "$3" "$build/corpus/$2"
    ;;
  repro)
    [ $# -eq 3 ] || usage
    known_target "$2"
    [ -f "$3" ] || { echo "fuzz: no such input file: $3" >&2; exit 2; }
    build_targets
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" "$build/bin/${2}_fuzz" -timeout=10 "$3"
    ;;
  *)
    usage
    ;;
esac
