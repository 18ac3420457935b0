#!/usr/bin/env bash
# One run on the GPU machine (docs/design/cuda-backend.md): build tessera + tessera_tests
# with every core, run the CUDA conformance tests, compute-sanitizer (memcheck, racecheck)
# on the attention tests, serving through the engine on the GPU (generate --batch, bench
# offline), then the Llama-3.1-8B-shape benchmarks; a short table comes last. With a real
# GGUF model brought in parts (GPU_CHECK_MODEL_PARTS, below): CPU/CUDA parity on it,
# `tessera serve --device cuda` over HTTP (tools/gpu/serve_check.sh) and `bench model` on it.
# GPU_CHECK_PROFILE=1: per-op device time of each bench phase; GPU_CHECK_BASELINE=DIR: the
# CUDA bench of another build (DIR/tessera_tests) and of this one, alternately, in this call.
# Logs go to $OUT (or ./gpu-check-out). Under 10 minutes on an H200.
#
#   scripts/gpu-check.sh                  configure and build in build-gpu/, then check
#   scripts/gpu-check.sh --prebuilt DIR   use DIR/tessera and DIR/tessera_tests (built
#                                         elsewhere with CUDA; DIR/lib holds extra .so files)
#   scripts/gpu-check.sh --prebuilt-if-usable DIR   the same when they start here, else build
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
PREBUILT=""
PREBUILT_IF_USABLE=""
if [[ "${1:-}" == "--prebuilt" ]]; then PREBUILT=$2; fi
if [[ "${1:-}" == "--prebuilt-if-usable" ]]; then PREBUILT_IF_USABLE=$2; fi
log() { echo "[gpu-check $(date +%T)] $*"; }
status=0

nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv 2>&1 |
  tee "$OUT/nvidia-smi.txt"

# cuBLASLt from the toolkit or from the Python wheels, whichever the machine has.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia.cublas, os; print(os.path.dirname(nvidia.cublas.__file__) + "/lib")' 2>/dev/null); do
  [[ -e "$d/libcublasLt.so.13" ]] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done

# Binaries built on another machine run here only when this image's libraries suit them.
if [[ -n "$PREBUILT_IF_USABLE" ]]; then
  if [[ -x "$PREBUILT_IF_USABLE/tessera" ]] && LD_LIBRARY_PATH=$PWD/$PREBUILT_IF_USABLE/lib:${LD_LIBRARY_PATH:-} \
       "$PREBUILT_IF_USABLE/tessera_tests" --gtest_list_tests >/dev/null 2>&1; then
    log "using the carried binaries ($PREBUILT_IF_USABLE)"
    PREBUILT=$PREBUILT_IF_USABLE
  else
    log "no usable carried binaries in $PREBUILT_IF_USABLE: building here"
  fi
fi

if [[ -z "$PREBUILT" ]]; then
  log "configure + build (tessera, tessera_tests) with $(nproc) cores"
  t0=$(date +%s)
  if ! cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DTESSERA_CUDA=ON >"$OUT/configure.log" 2>&1; then
    tail -20 "$OUT/configure.log"; log "configure failed"; exit 1
  fi
  if ! cmake --build build-gpu -j"$(nproc)" --target tessera tessera_tests >"$OUT/build.log" 2>&1; then
    grep -E "error|FAILED" "$OUT/build.log" | head -30; log "build failed"; exit 1
  fi
  log "built in $(( $(date +%s) - t0 )) s"
  BIN=build-gpu/bin
else
  BIN=$PREBUILT
  [[ -d "$PREBUILT/lib" ]] && export LD_LIBRARY_PATH="$PWD/$PREBUILT/lib:${LD_LIBRARY_PATH:-}"
fi
export TESSERA_FIXTURES_DIR=$PWD/tests/fixtures

# A real GGUF model, brought to this machine in parts (one transfer carries at most 64 MiB):
# GPU_CHECK_MODEL_PARTS="part1 part2" (concatenated in order), GPU_CHECK_MODEL_SHA256 = the
# whole file's sha256. Then the conformance tests include CudaRealModel (CPU vs CUDA parity),
# and `tessera serve --device cuda` and `tessera bench model` run on it below.
REAL_MODEL=""
if [[ -n "${GPU_CHECK_MODEL_PARTS:-}" ]]; then
  model_dir=${GPU_CHECK_MODEL_DIR:-/root/tessera-models}
  mkdir -p "$model_dir"
  # shellcheck disable=SC2086
  cat $GPU_CHECK_MODEL_PARTS >"$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf"
  got=$(sha256sum "$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)
  if [[ "$got" == "${GPU_CHECK_MODEL_SHA256:-}" ]]; then
    log "real model reassembled, sha256 matches ($got)"
    REAL_MODEL=$model_dir/SmolLM2-135M-Instruct.Q4_1.gguf
    export TESSERA_CACHE=$model_dir
  else
    log "real model: sha256 $got does not match ${GPU_CHECK_MODEL_SHA256:-<none>}; skipped"
    status=1
  fi
fi

log "conformance tests"
timeout ${GPU_CHECK_TEST_TIMEOUT:-240} "$BIN/tessera_tests" --gtest_filter="${GPU_CHECK_TEST_FILTER:-Cuda*:-CudaBench*}" 2>&1 | tee "$OUT/conformance.log" |
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|parity|Failure|error|Expected|Which is|rel_err" | head -80
grep -q "FAILED TEST" "$OUT/conformance.log" && status=1
conf=$(grep -E "^\[  PASSED  \]|^\[  FAILED  \]" "$OUT/conformance.log" | tr '\n' ' ')

# Serving on the GPU through the engine (dummy weights: KV on the device, argmax readback,
# padded graph decode): the offline benchmark at 128 concurrent sequences. (generate needs a
# tokenizer, which dummy weights lack, and no real model travels to this machine.)
if [[ "${GPU_CHECK_SERVING:-1}" == 1 ]]; then
  log "serving: tessera bench offline on cuda"
  timeout 240 "$BIN/tessera" bench offline --model dummy:llama-3.1-8b:bf16 --device cuda \
    --requests ${GPU_CHECK_OFFLINE_REQUESTS:-256} -p 512 -n 128 -C ${GPU_CHECK_OFFLINE_C:-128} \
    --max-num-batched-tokens 4096 >"$OUT/bench-offline.log" 2>&1
  rc=$?
  offline_rc=$rc
  grep -E "^\||\[bench\]|rror" "$OUT/bench-offline.log" | tail -8
  [[ $rc -ne 0 ]] && status=1
fi

if [[ -n "$REAL_MODEL" ]]; then
  log "serving a real model: tessera serve --device cuda, chat + streamed completion, SIGTERM"
  timeout 180 tools/gpu/serve_check.sh "$BIN/tessera" "$REAL_MODEL" "$OUT" 2>&1 | tee "$OUT/serve-check.log"
  serve_rc=${PIPESTATUS[0]}
  [[ $serve_rc -ne 0 ]] && status=1
  log "benchmark: tessera bench model on the real model"
  timeout 120 "$BIN/tessera" bench model --model "$REAL_MODEL" --device cuda -p 512 -n 128 -r 3 \
    >"$OUT/bench-model-real.log" 2>&1
  grep -E "^\||rror" "$OUT/bench-model-real.log"
fi

# Knobs for partial runs: GPU_CHECK_SANITIZERS="memcheck racecheck", GPU_CHECK_BENCH_MODEL=1,
# GPU_CHECK_SERVING=1, GPU_CHECK_TEST_FILTER (the conformance tests' gtest filter).
for tool in ${GPU_CHECK_SANITIZERS-memcheck racecheck}; do
  log "compute-sanitizer $tool on the attention tests and the row argmax"
  timeout ${GPU_CHECK_SANITIZER_TIMEOUT:-120} compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/tessera_tests" \
    --gtest_filter="${GPU_CHECK_SANITIZER_FILTER:-CudaAttention.*:CudaFusedAttention.*:CudaServing.Argmax*}" \
    >"$OUT/sanitizer-$tool.log" 2>&1
  rc=$?
  tail -3 "$OUT/sanitizer-$tool.log"
  # Which kernels the reports name (the device tool brings back few files: say it here).
  grep -E "^=========" "$OUT/sanitizer-$tool.log" | grep -oE " at [A-Za-z_][A-Za-z0-9_]*\+0x" |
    sed -E 's/^ at //; s/\+0x$//' | sort | uniq -c | sort -rn | head -8 | sed "s/^/  $tool report in: /" |
    tee -a "$OUT/sanitizer-kernels.txt"
  eval "san_$tool=$rc"
  [[ $rc -ne 0 ]] && status=1
done

if [[ "${GPU_CHECK_BENCH_MODEL:-1}" == 1 ]]; then
  log "benchmark: tessera bench model (batch 1, prefill 512, decode 128)"
  timeout 200 "$BIN/tessera" bench model --model dummy:llama-3.1-8b:bf16 --device cuda -p 512 -n 128 -r 2 \
    >"$OUT/bench-model.log" 2>&1
  grep -E "^\|" "$OUT/bench-model.log"
fi

if [[ "${GPU_CHECK_BENCH_CUDA:-1}" == 1 ]]; then
  log "benchmark: CUDA bench (batch 1, prefill 512, 128 sequences at 512-640 context, with floors)"
  TESSERA_CUDA_BENCH=1 timeout 300 "$BIN/tessera_tests" --gtest_filter='CudaBench*' >"$OUT/bench-cuda.log" 2>&1
  grep -E "^\[bench\]|Failure|error" "$OUT/bench-cuda.log"
fi

# Per-op device time of each benchmark phase (TESSERA_CUDA_DIAG=profile: events around every
# op, graphs off), for docs/benchmarks/gpu.md.
if [[ "${GPU_CHECK_PROFILE:-0}" == 1 ]]; then
  log "profile: per-op device time of the CUDA bench phases"
  TESSERA_CUDA_DIAG=profile TESSERA_CUDA_BENCH=1 timeout 300 "$BIN/tessera_tests" --gtest_filter='CudaBench*' \
    >"$OUT/bench-profile.log" 2>&1
  grep -E "^\[profile\]|^\|" "$OUT/bench-profile.log" | head -120
fi

# A change measured against another build in the same call (machines differ by a few percent
# at batch 1): GPU_CHECK_BASELINE=DIR (a tessera_tests built elsewhere, e.g. from main) and this
# build's CUDA bench alternately, GPU_CHECK_BASELINE_REPS (2) times each;
# GPU_CHECK_BASELINE_BENCH=b1 benches batch-1 decode alone.
ab_i=0
if [[ -n "${GPU_CHECK_BASELINE:-}" ]]; then
  for ((rep = 0; rep < ${GPU_CHECK_BASELINE_REPS:-2}; ++rep)); do
    for side in "$GPU_CHECK_BASELINE" "$BIN"; do
      ab_i=$((ab_i + 1))
      log "benchmark $ab_i: $side"
      TESSERA_CUDA_BENCH=${GPU_CHECK_BASELINE_BENCH:-1} timeout 200 "$side/tessera_tests" --gtest_filter='CudaBench*' \
        >"$OUT/bench-cuda-ab$ab_i.log" 2>&1
      echo "$side" >>"$OUT/bench-cuda-ab$ab_i.log"
    done
  done
fi

echo
echo "== gpu-check summary =="
echo "conformance: $conf"
echo "compute-sanitizer: memcheck rc=${san_memcheck:-?}, racecheck rc=${san_racecheck:-?} (0 = clean)"
[[ -f "$OUT/sanitizer-kernels.txt" ]] && cat "$OUT/sanitizer-kernels.txt"
echo "serving: bench offline rc=${offline_rc:-?}"
if [[ -n "$REAL_MODEL" ]]; then
  grep -E "^\[real-parity\]" "$OUT/conformance.log"
  grep -E "^serve-check" "$OUT/serve-check.log"
  grep -E "^\|" "$OUT/bench-model-real.log"
fi
grep -E "^\|" "$OUT/bench-offline.log" 2>/dev/null | tail -3
grep -E "^\||^ceilings" "$OUT/bench-cuda.log"
for ((i = 1; i <= ab_i; ++i)); do
  f=$OUT/bench-cuda-ab$i.log
  echo "bench $i, $(tail -1 "$f"):"
  grep -E "^\| [a-zA-Z]" "$f" | grep -v "^| test |"
done
exit $status
