#!/usr/bin/env bash
# `tessera serve --device cuda` end to end on the GPU machine (scripts/gpu-check.sh runs it
# when a real model is there): start the server, one chat completion and one streamed
# completion over HTTP, check the answers and the usage counts (serve_check.py), then
# SIGTERM and a clean exit. Exit status 0 only when everything held.
#   tools/gpu/serve_check.sh TESSERA_BINARY MODEL.gguf OUTDIR
set -uo pipefail
BIN=$1 MODEL=$2 OUTDIR=$3
PORT=${SERVE_CHECK_PORT:-18431}
here=$(dirname "$0")
"$BIN" serve --model "$MODEL" --device cuda --host 127.0.0.1 --port "$PORT" --drain-timeout 5 \
  >"$OUTDIR/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 240); do
  grep -q "serving" "$OUTDIR/serve.log" && break
  kill -0 $pid 2>/dev/null || break
  sleep 0.25
done
if ! grep -q "serving" "$OUTDIR/serve.log"; then
  echo "serve-check: the server did not start"; tail -5 "$OUTDIR/serve.log"; kill -9 $pid 2>/dev/null; exit 1
fi
python3 "$here/serve_check.py" "http://127.0.0.1:$PORT" "$OUTDIR"
check=$?
kill -TERM $pid
timeout 30 tail --pid=$pid -f /dev/null
wait $pid
rc=$?
grep -q "stopped" "$OUTDIR/serve.log" && stopped=1 || stopped=0
echo "serve-check: answers ok=$([[ $check == 0 ]] && echo yes || echo no), exit status after SIGTERM $rc, 'stopped' logged=$stopped"
[[ $check == 0 && $rc == 0 && $stopped == 1 ]]
