#!/bin/bash
# batch-1 decode: plain vs model drafters (draft_model = the same GGUF cut to L layers, and
# early_exit L), alternating per repetition, through the engine. Run from the repo root.
BIN=${BIN:-build/bin/tessera}
M=$HOME/.cache/tessera/models/SmolLM2-135M-Instruct.Q4_1.gguf
K=${K:-4}
spec() {
  case $1 in
    dm*) echo "{\"method\": \"draft_model\", \"model\": \"$M\", \"num_speculative_tokens\": $K, \"draft_layers\": ${1#dm}}" ;;
    ee*) echo "{\"method\": \"early_exit\", \"num_speculative_tokens\": $K, \"draft_layers\": ${1#ee}}" ;;
  esac
}
for rep in ${REPS:-1 2 3}; do
for p in ${PROMPTS:-copy chat}; do
  for mode in ${MODES:-plain dm6 dm10 ee6 ee10}; do
    if [ $mode = plain ]; then extra=(--engine); else extra=(--speculative-config "$(spec $mode)"); fi
    $BIN generate -m $M -f docs/benchmarks/spec-decode/$p.txt --special -n 160 --temp 0 --threads ${THREADS:-2} "${extra[@]}" \
      > ${OUT:-/tmp}/out_${p}_${mode}_$rep.txt 2> ${OUT:-/tmp}/err_${p}_${mode}_$rep.txt
    echo "$p $mode rep$rep: $(grep '\[tessera\] prompt' ${OUT:-/tmp}/err_${p}_${mode}_$rep.txt)"
  done
done
done
