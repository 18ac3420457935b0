#!/bin/bash
# batch-1 decode with and without prompt lookup, alternating, through the engine.
BIN=${BIN:-build/bin/tessera}
M=$HOME/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf
SPEC='{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
for rep in ${REPS:-1 2}; do
for p in copy chat; do
  for mode in plain spec; do
    if [ $mode = plain ]; then extra=(--engine); else extra=(--speculative-config "$SPEC"); fi
    $BIN generate -m $M -f docs/benchmarks/spec-decode/$p.txt --special -n 160 --temp 0 --threads ${THREADS:-2} "${extra[@]}" \
      > ${OUT:-/tmp}/out_${p}_${mode}_$rep.txt 2> ${OUT:-/tmp}/err_${p}_${mode}_$rep.txt
    echo "$p $mode rep$rep: $(grep '\[tessera\] prompt' ${OUT:-/tmp}/err_${p}_${mode}_$rep.txt)"
  done
done
done
