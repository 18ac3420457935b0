#!/usr/bin/env bash
# The first real serving comparison: the same two workloads against llama.cpp's server
# (python -m llama_cpp.server, from llama-cpp-python[server]) and `tessera serve`, on the same
# GGUF with the same thread count, one server at a time. Writes every JSON and HTML report and
# the compare tables into the output directory.
#
#   tools/bench/compare_llama_server.sh --venv /tmp/llamaref/venv --out docs/benchmarks/serve-2026-11
#
# Options (defaults in brackets):
#   --venv DIR          Python venv with llama-cpp-python[server]               [required]
#   --out DIR           output directory                                         [required]
#   --model GGUF        model file   [$HOME/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf]
#   --tessera BIN       tessera binary                                           [build/bin/tessera]
#   --threads N         threads for both servers                                 [2]
#   --rates LIST        request rates of the ShareGPT-like sweep (req/s)         [0.25,0.5,1,2]
#   --num-requests N    requests per rate (ShareGPT-like)                        [40]
#   --scale S           length scale of the ShareGPT-like mix                    [0.25]
#   --prefix-rate R     request rate of the shared-prefix workload               [1]
#   --prefix-questions Q  questions per system prompt (4 system prompts)         [8]
#   --slo-ttft-ms X     SLO for goodput: TTFT                                    [2000]
#   --slo-tpot-ms Y     SLO for goodput: TPOT                                    [100]
#   --ctx N             context of both servers                                  [4096]
#   --only llama|tessera  run one side only (the compare tables need both)
# Environment: TESSERA_SERVE_ARGS is appended to `tessera serve` (engine flags).
set -euo pipefail

VENV="" OUT="" MODEL="${TESSERA_CACHE:-$HOME/.cache/tessera/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
TESSERA="build/bin/tessera" THREADS=2 RATES="0.25,0.5,1,2" NUM=40 SCALE=0.25 PREFIX_RATE=1
SLO_TTFT=2000 SLO_TPOT=100 CTX=4096 ONLY="" PREFIX_Q=8
LLAMA_PORT=8181 TESSERA_PORT=8182
while [[ $# -gt 0 ]]; do
  case "$1" in
    --venv) VENV="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --model) MODEL="$2"; shift 2 ;;
    --tessera) TESSERA="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --rates) RATES="$2"; shift 2 ;;
    --num-requests) NUM="$2"; shift 2 ;;
    --scale) SCALE="$2"; shift 2 ;;
    --prefix-rate) PREFIX_RATE="$2"; shift 2 ;;
    --prefix-questions) PREFIX_Q="$2"; shift 2 ;;
    --slo-ttft-ms) SLO_TTFT="$2"; shift 2 ;;
    --slo-tpot-ms) SLO_TPOT="$2"; shift 2 ;;
    --ctx) CTX="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    -h|--help) sed -n '2,28p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$OUT" ]] || { echo "--out DIR is required" >&2; exit 2; }
[[ -f "$MODEL" ]] || { echo "model $MODEL not found" >&2; exit 2; }
[[ -x "$TESSERA" ]] || { echo "tessera binary $TESSERA not found (build it first)" >&2; exit 2; }
if [[ "$ONLY" != "tessera" ]]; then
  [[ -x "$VENV/bin/python" ]] || { echo "--venv $VENV has no bin/python" >&2; exit 2; }
  "$VENV/bin/python" -c "import llama_cpp.server.app" 2>/dev/null ||
    { echo "llama_cpp.server is not importable in $VENV: pip install 'llama-cpp-python[server]'" >&2; exit 2; }
fi
mkdir -p "$OUT"
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
CORPUS="$REPO/tests/fixtures/text/licenses_gpl3_apache2.txt"
SERVER_PID=""

stop_server() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT

wait_ready() {  # port, log
  for _ in $(seq 1 240); do
    if curl -sf "http://127.0.0.1:$1/v1/models" >/dev/null 2>&1; then return 0; fi
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then echo "server exited; log: $2" >&2; tail -20 "$2" >&2; exit 1; fi
    sleep 0.5
  done
  echo "server on port $1 not ready after 120 s; log: $2" >&2
  exit 1
}

# Runs both workloads against the server on $1, writing $OUT/<name>_{sharegpt,prefix}.{json,html}.
run_workloads() {
  local port="$1" name="$2" extra="$3"
  # No --model: each server is asked for its own name (/v1/models); they name the same file
  # differently (llama_cpp.server: the path; tessera: the model's name from its metadata).
  local common=(--base-url "http://127.0.0.1:$port" --endpoint chat
                --tokenizer-model "$MODEL" --corpus "$CORPUS" --seed 1 --warmup 2
                --slo-ttft-ms "$SLO_TTFT" --slo-tpot-ms "$SLO_TPOT")
  [[ -n "$extra" ]] && common+=(--extra-body "$extra")
  echo "== $name: ShareGPT-like mix at $RATES req/s" >&2
  "$TESSERA" bench serve "${common[@]}" --workload sharegpt --scale "$SCALE" --num-requests "$NUM" \
    --rate-sweep "$RATES" --out "$OUT/${name}_sharegpt.json" --html "$OUT/${name}_sharegpt.html" \
    | tee "$OUT/${name}_sharegpt.md"
  echo "== $name: shared prefix (4 system prompts x $PREFIX_Q questions) at $PREFIX_RATE req/s" >&2
  "$TESSERA" bench serve "${common[@]}" --workload shared_prefix --num-prefixes 4 --questions-per-prefix "$PREFIX_Q" \
    --prefix-len 256 --input-len uniform:16:48 --output-len 32 --request-rate "$PREFIX_RATE" \
    --out "$OUT/${name}_prefix.json" --html "$OUT/${name}_prefix.html" | tee "$OUT/${name}_prefix.md"
}

if [[ "$ONLY" != "tessera" ]]; then
  log="$OUT/llama_server.log"
  # --interrupt_requests False: by default llama_cpp.server aborts the stream in progress when
  # another request arrives, which turns every overlapping request into a failure.
  "$VENV/bin/python" -m llama_cpp.server --model "$MODEL" --n_threads "$THREADS" --n_threads_batch "$THREADS" \
    --n_ctx "$CTX" --interrupt_requests False --host 127.0.0.1 --port "$LLAMA_PORT" >"$log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$LLAMA_PORT" "$log"
  # llama_cpp.server ignores ignore_eos: ban SmolLM2's end tokens (<|endoftext|> 0, <|im_end|> 2)
  # so outputs run to max_tokens like on tessera.
  run_workloads "$LLAMA_PORT" llama '{"logit_bias": {"0": -100, "2": -100}}'
  stop_server
fi

if [[ "$ONLY" != "llama" ]]; then
  log="$OUT/tessera_server.log"
  # shellcheck disable=SC2086
  "$TESSERA" serve --model "$MODEL" --threads "$THREADS" --ctx "$CTX" --host 127.0.0.1 --port "$TESSERA_PORT" \
    ${TESSERA_SERVE_ARGS:-} >"$log" 2>&1 &
  SERVER_PID=$!
  wait_ready "$TESSERA_PORT" "$log"
  run_workloads "$TESSERA_PORT" tessera ""
  stop_server
fi

if [[ -z "$ONLY" ]]; then
  for w in sharegpt prefix; do
    "$TESSERA" bench compare "$OUT/llama_$w.json" "$OUT/tessera_$w.json" --names llama.cpp,tessera \
      | tee "$OUT/compare_$w.md"
  done
fi
echo "reports in $OUT" >&2
