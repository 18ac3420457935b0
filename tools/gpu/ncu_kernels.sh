#!/usr/bin/env bash
# Nsight Compute on one launch each of the three kernels that dominate the CUDA bench
# (graphs off so every launch is visible: TESSERA_CUDA_DIAG=profile turns them off, and its
# events are no kernels, so the skip counts hold; --clock-control none: the card as found):
#   gemv_pair_kernel             the gate/up product of batch-1 decode, step 1, layer 0
#   attention_prefill_mma_kernel prefill 512, repetition 1, layer 16
#   attention_decode_split decode at 128 sequences, step 1, layer 5
# The skip counts follow the bench's order (tests/unit/cuda/cuda_bench_test.cpp).
#   tools/gpu/ncu_kernels.sh BUILD_BIN_DIR OUTDIR
set -uo pipefail
BIN=$1 OUTDIR=$2
run() {  # name regex, launches to skip, output file
  TESSERA_CUDA_BENCH=1 TESSERA_CUDA_DIAG=profile timeout 240 ncu --clock-control none -k "regex:$1" --launch-skip "$2" \
    -c 1 --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section LaunchStats "$BIN/tessera_tests" --gtest_filter='CudaBench*' >"$OUTDIR/$3" 2>&1
  echo "== $1 (skip $2)"
  grep -E "^  [A-Za-z].*(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per Thread|Warp Cycles Per Issued|No Eligible|L1/TEX Hit Rate|L2 Hit Rate|Block Limit)" \
    "$OUTDIR/$3" | sed 's/  */ /g'
}
run gemv_pair_kernel 137 ncu-gemv.txt
run attention_prefill_mma_kernel 48 ncu-prefill.txt
run attention_decode_split 4165 ncu-decode.txt
