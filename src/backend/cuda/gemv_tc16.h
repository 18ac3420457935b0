#pragma once
// Products of 2–8 input rows with 16-bit weights (bf16, f16) on the tensor cores, reading the
// weights once at close to the copy rate (gemv_tc16.cu). What a verification step of a few
// draft tokens, and decode at batch 2–8, runs: cuBLASLt's GEMMs reach about 64 % of the copy
// rate at these shapes, the batch-1 bulk kernel 97 %.
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace tessera::cuda {

constexpr int kGemvTc16MaxRows = 8;  // input rows: the n of one m16n8k16 tile

// y_i[t * ldy_i + r] = x16[t, :] · W_i[r, :] for t < n_rows (2..kGemvTc16MaxRows), f32
// accumulation over the 16-bit products. x16: the input rows already rounded to the weights'
// 16-bit type, dense [n_rows, cols] (the same input cuBLASLt takes). Every target has that
// type and `cols` columns, weights 16-byte aligned. False (nothing launched) when the shape
// does not fit: cols not a multiple of 32, more than kGemvMaxTargets targets, n_rows out of
// range, misaligned pointers.
bool launch_gemv_tc16(bool bf16, const uint16_t* x16, int n_rows, int64_t cols, const GemvTarget* targets,
                      int n_targets, int sm_count, cudaStream_t s);

}  // namespace tessera::cuda
