#!/usr/bin/env bash
# Sanitizer runs for CI (.ci/run), each in its own build directory, CUDA off, -O1 with line
# tables only (-g1). GCC, the project's compiler: Debian's clang 14 rejects the cpu-feature
# names the CPU kernels ask __builtin_cpu_supports about ("f16c"), so it cannot build src/.
#   scripts/ci-sanitizers.sh asan        AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer)
#                                        on the memory-owning and parsing layers' tests
#                                        (build-asan/bin/tessera_memory_tests, cmake/sanitizers.cmake)
#   scripts/ci-sanitizers.sh tsan        ThreadSanitizer on the engine, scheduler, HTTP and API-server
#                                        tests (build-tsan/bin/tessera_concurrency_tests)
#   scripts/ci-sanitizers.sh             both, one after the other (what CI runs)
#   scripts/ci-sanitizers.sh asan-suite  ASan+UBSan on the whole unit suite (build-asan/bin/tessera_tests;
#                                        about 30 minutes cold: per session, not in CI)
# Extra arguments after the mode go to the test binary (e.g. --gtest_filter=Http*).
# Any report fails the run: the sanitizers halt on the first error. Suppressions are only for
# third-party code and live in tests/sanitizers/*.supp, each with its reason.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="${JOBS:-2}"
bash "$root/scripts/bootstrap.sh"  # g++ brings libasan, libubsan and libtsan

# configure DIR SANITIZERS: a Sanitize build type adds no flags of its own, so -O1 stays.
configure() {
  local dir="$1" sanitize="$2"
  local flags="-O1 -g1 -fno-omit-frame-pointer -fsanitize=$sanitize -fno-sanitize-recover=all"
  # GCC warns on every std::atomic_thread_fence (Boost.Asio's fenced blocks) that TSan does not
  # model fences; said once here instead of a thousand lines of build log.
  [ "$sanitize" = thread ] && flags="$flags -Wno-tsan"
  # -Werror off here: GCC 12's -O1 + sanitizer instrumentation gives false -Wstringop-overflow
  # (e.g. tests/unit/format/gguf_test.cpp); the Release build enforces warnings.
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Sanitize -DTESSERA_CUDA=OFF -DTESSERA_WERROR=OFF \
      -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
      -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$sanitize" >/dev/null
  fi
}

# run_asan BINARY [gtest args...]
run_asan() {
  local dir="$root/build-asan" binary="$1"
  shift
  configure "$dir" address,undefined
  cmake --build "$dir" -j "$jobs" --target "$binary"
  echo "ci-sanitizers: ASan+UBSan $binary"
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1" \
    LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
    "$dir/bin/$binary" --gtest_brief=1 "$@"
}

run_tsan() {
  local dir="$root/build-tsan"
  configure "$dir" thread
  # Only the test binary: none of its tests run the command line.
  cmake --build "$dir" -j "$jobs" --target tessera_concurrency_tests
  echo "ci-sanitizers: TSan engine/scheduler/HTTP tests"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/sanitizers/tsan.supp" \
    "$dir/bin/tessera_concurrency_tests" --gtest_brief=1 "$@"
}

mode="${1:-all}"
shift || true
case "$mode" in
  asan) run_asan tessera_memory_tests "$@" ;;
  asan-suite) run_asan tessera_tests "$@" ;;
  tsan) run_tsan "$@" ;;
  all) run_asan tessera_memory_tests "$@"; run_tsan "$@" ;;
  *) echo "usage: scripts/ci-sanitizers.sh [asan|tsan|all|asan-suite] [gtest args...]" >&2; exit 2 ;;
esac
