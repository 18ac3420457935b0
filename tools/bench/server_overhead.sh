#!/usr/bin/env bash
# What the HTTP server adds over the engine alone (issue 4's speed criterion): the same
# workload — R requests of P prompt tokens and N output tokens, all arriving at once, at most
# C in flight — once through the engine in-process (`tessera bench offline`) and once through
# `tessera serve` driven by `tessera bench serve` (streaming /v1/completions), alternating
# REPS times, then `tessera bench compare` on each pair. Same binary, model, threads and
# engine flags on both sides.
#
#   tools/bench/server_overhead.sh --out docs/benchmarks/server-overhead [--reps 2]
#
# Options: --model M [smollm2-135m]  --threads T [2]  --requests R [64]  --concurrency C [64]
#          -p P [128]  -n N [128]  --reps K [2]  --tessera BIN [build/bin/tessera]  --port [8183]
set -euo pipefail
MODEL=smollm2-135m THREADS=2 R=64 C=64 P=128 N=128 REPS=2 TESSERA=build/bin/tessera PORT=8183 OUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --model) MODEL="$2"; shift 2 ;;
    --threads) THREADS="$2"; shift 2 ;;
    --requests) R="$2"; shift 2 ;;
    --concurrency) C="$2"; shift 2 ;;
    -p) P="$2"; shift 2 ;;
    -n) N="$2"; shift 2 ;;
    --reps) REPS="$2"; shift 2 ;;
    --tessera) TESSERA="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$OUT" ]] || { echo "--out DIR is required" >&2; exit 2; }
[[ -x "$TESSERA" ]] || { echo "tessera binary $TESSERA not found (build it first)" >&2; exit 2; }
mkdir -p "$OUT"
ENGINE_FLAGS=(--model "$MODEL" -t "$THREADS" --max-num-seqs "$C")
SERVER_PID=""
stop_server() {
  if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID"; wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
trap stop_server EXIT

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')  commit: $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $(nproc) cores; load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "workload: $R requests, $P prompt + $N output tokens, all at t=0, at most $C in flight; threads $THREADS; model $MODEL"
} | tee "$OUT/conditions.txt"

for rep in $(seq 1 "$REPS"); do
  echo "== rep $rep: engine alone (bench offline)" >&2
  "$TESSERA" bench offline "${ENGINE_FLAGS[@]}" -C "$C" --requests "$R" -p "$P" -n "$N" \
    --out "$OUT/engine-$rep.json" | tee "$OUT/engine-$rep.txt"

  echo "== rep $rep: through the server (serve + bench serve)" >&2
  "$TESSERA" serve "${ENGINE_FLAGS[@]}" --host 127.0.0.1 --port "$PORT" >"$OUT/serve-$rep.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 240); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "server exited:" >&2; tail -20 "$OUT/serve-$rep.log" >&2; exit 1; }
    sleep 0.5
  done
  "$TESSERA" bench serve --base-url "http://127.0.0.1:$PORT" --endpoint completions --workload synthetic \
    --input-len "$P" --output-len "$N" --num-requests "$R" --request-rate inf --max-concurrency "$C" \
    --warmup 1 --out "$OUT/server-$rep.json" | tee "$OUT/server-$rep.txt"
  stop_server

  "$TESSERA" bench compare "$OUT/engine-$rep.json" "$OUT/server-$rep.json" | tee "$OUT/compare-$rep.md"
done
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/conditions.txt"
