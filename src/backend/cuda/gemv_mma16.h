#pragma once
// Skinny products of 16-bit weights on tensor cores, the weights read once (gemv_mma16.cu).
// Included by cuda_backend.cpp and the kernel's file only (kernels.h stays untouched, so a
// change here recompiles two files).
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace tessera::cuda {

// The rows of x a launch takes, per weight type: one n8 tile of the m16n8k16 product for
// bf16/f16, two for FP8W, two to four for W4G/W8G. Outside them the alternatives measured
// faster on an H100 (bf16 past 8 rows: cuBLASLt; FP8W past 16: W8A8; W4G/W8G up to 8: the dp4a
// kernel at 2-4 rows, and 5-8 not yet measured; docs/benchmarks/weight-quant.md, "Skinny
// tensor-core products"), so the kernels stop there: these are the dispatch's ranges.
constexpr int kMma16MaxRows = 8;
constexpr int kFp8MmaMaxRows = 16;
constexpr int kGqMmaMinRows = 9;
constexpr int kGqMmaMaxRows = 32;

// Whether launch_gemv_mma16 takes n_rows rows of x, `cols` wide, and these weights of type
// `type` (BF16, F16: 1..kMma16MaxRows rows; FP8W: 1..kFp8MmaMaxRows), cols a multiple of 8 (16
// for FP8W: rows of whole 16-byte units), 16-byte aligned weights (x must be 16-byte aligned too).
bool gemv_mma16_applies(DType type, int n_rows, int64_t cols, const void* w);

// y_i[t * ldy_i + r] = x[t, :] · W_i[r, :] for t < n_rows, every target of type `type`,
// `cols` wide; x is [n_rows][cols], bf16 for BF16 weights, f16 for F16 and FP8W (whose
// targets carry their per-row scales). f32 accumulation on tensor cores (mma.sync m16n8k16).
// Up to kGemvMaxTargets targets in one launch, launched as a programmatic dependent launch
// (the first weight loads go out before the wait).
void launch_gemv_mma16(DType type, const uint16_t* x, int n_rows, int64_t cols, const GemvTarget* targets,
                       int n_targets, cudaStream_t s);

// The same for group-quantized weights (W4G/W8G, core/group_quant.h) without an act-order
// permutation, `cols` a multiple of 32, kGqMmaMinRows..kGqMmaMaxRows rows (gemv_gq_mma.cu): the codes decoded to f16 in
// registers, (code - zero) * scale, feeding f16 tensor cores; x is f16 [n_rows][cols].
bool gemv_gq_mma_applies(int n_rows, const WeightMatrix& w);
void launch_gemv_gq_mma(const uint16_t* x, int n_rows, const MatmulTarget* targets, int n_targets, cudaStream_t s);

}  // namespace tessera::cuda
