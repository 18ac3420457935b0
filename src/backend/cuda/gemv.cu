// Matrix-vector and small-batch products (decode) reading the weights in their stored
// format: one warp per output feature, each lane decoding 8 consecutive elements per step
// (16-byte loads for bf16/f16), the x rows read through L1 (they are reused by every warp).
// Up to kGemvMaxTargets weights sharing the input run in one launch (Q/K/V, gate/up). At
// batch 1 a warp takes several features (gemv_pair_kernel). Batch 1 with bf16/f16 weights
// normally takes the bulk kernel (gemv_bulk.cu) instead.
#include "backend/cuda/cuda_tuning.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_decode.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 8;

using Targets = GemvRowTargets;

// NR: rows of x computed at once (1, or up to kGemvMaxRows with n_rows guarding the rest).
template <DType T, int NR>
__global__ void __launch_bounds__(kWarps * 32)
    gemv_kernel(const float* __restrict__ x, int n_rows, int64_t ldx, int64_t cols, Targets tg) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  int ti = 0;
  while (ti < tg.n - 1 && row >= tg.row_end[ti]) ++ti;
  if (row >= tg.row_end[ti]) return;
  const int64_t r = row - (ti ? tg.row_end[ti - 1] : 0);
  const uint8_t* wr = tg.w[ti] + r * tg.row_bytes;
  float acc[NR];
#pragma unroll
  for (int t = 0; t < NR; ++t) acc[t] = 0.0f;
#pragma unroll 4
  for (int64_t e = lane * 8; e < cols; e += 256) {
    float w8[8];
    decode8<T>(wr, e, w8);
#pragma unroll
    for (int t = 0; t < NR; ++t) {
      if (NR > 1 && t >= n_rows) break;
      const float* xr = x + t * ldx + e;
      float x8[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) x8[k] = __ldg(xr + k);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[t] = fmaf(w8[k], x8[k], acc[t]);
    }
  }
#pragma unroll
  for (int t = 0; t < NR; ++t) {
    if (NR > 1 && t >= n_rows) break;
    const float v = warp_sum(acc[t]);
    if (lane == 0) tg.y[ti][t * tg.ldy[ti] + r] = v;
  }
}

// Batch 1 with x 16-byte aligned: each warp takes kRowsPerWarp output features, so one pair
// of 16-byte x loads (through L1; scalar loads cost 4x the L1 wavefronts of the weight load)
// feeds kRowsPerWarp independent weight loads, cutting the L1 traffic per weight byte and
// multiplying the loads in flight per lane. Each feature's sum is formed in the same order as
// gemv_kernel's, so the results are the same bits. CudaTuning::kGemvMinBlocksPerSm in
// __launch_bounds__ lets ptxas give the kernel 154 registers and deeper unrolling.
template <DType T, int kRowsPerWarp>
__global__ void __launch_bounds__(kWarps * 32, CudaTuning::kGemvMinBlocksPerSm)
    gemv_pair_kernel(const float* __restrict__ x, int64_t cols, Targets tg) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5)) * kRowsPerWarp;
  const int64_t total = tg.row_end[tg.n - 1];
  if (row0 >= total) return;
  const uint8_t* wr[kRowsPerWarp];
  int ti[kRowsPerWarp];
  int64_t r[kRowsPerWarp];
  bool live[kRowsPerWarp];
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const int64_t row = min(row0 + k, total - 1);  // a missing second row recomputes the first
    live[k] = row0 + k < total;
    int t = 0;
    while (t < tg.n - 1 && row >= tg.row_end[t]) ++t;
    ti[k] = t;
    r[k] = row - (t ? tg.row_end[t - 1] : 0);
    wr[k] = tg.w[t] + r[k] * tg.row_bytes;
  }
  float acc[kRowsPerWarp] = {};
#pragma unroll 4
  for (int64_t e = lane * 8; e < cols; e += 256) {
    float w8[kRowsPerWarp][8];
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k) decode8<T>(wr[k], e, w8[k]);
    const float* xr = x + e;
    const float4 a = __ldg(reinterpret_cast<const float4*>(xr)), b = __ldg(reinterpret_cast<const float4*>(xr + 4));
    const float x8[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
    for (int k = 0; k < kRowsPerWarp; ++k)
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[k] = fmaf(w8[k][j], x8[j], acc[k]);
  }
#pragma unroll
  for (int k = 0; k < kRowsPerWarp; ++k) {
    const float v = warp_sum(acc[k]);
    if (lane == 0 && live[k]) tg.y[ti[k]][r[k]] = v;
  }
}

}  // namespace

bool launch_gemv(DType type, const float* x, int n_rows, int64_t ldx, int64_t cols, const GemvTarget* targets,
                 int n_targets, cudaStream_t s) {
  TESSERA_CHECK(n_rows >= 1 && n_rows <= kGemvMaxRows && n_targets >= 1 && n_targets <= kGemvMaxTargets,
                "cuda gemv: ", n_rows, " rows / ", n_targets, " targets out of range");
  TESSERA_CHECK(cols % 8 == 0, "cuda gemv: width ", cols, " is not a multiple of 8");
  Targets tg{};
  tg.n = n_targets;
  tg.row_bytes = dtype_row_bytes(type, cols);
  int64_t total = 0;
  for (int i = 0; i < n_targets; ++i) {
    tg.w[i] = static_cast<const uint8_t*>(targets[i].w);
    tg.y[i] = targets[i].y;
    tg.ldy[i] = targets[i].ldy;
    total += targets[i].rows;
    tg.row_end[i] = total;
  }
  const unsigned grid = blocks_for(total, kWarps);
  const bool vec_x = reinterpret_cast<uintptr_t>(x) % 16 == 0 && ldx % 4 == 0;
  constexpr int kRpw = CudaTuning::kGemvFeaturesPerWarp;
  const unsigned pair_grid = blocks_for((total + kRpw - 1) / kRpw, kWarps);
  return dispatch_weight_type(type, [&]<DType T>() {
    if (n_rows == 1 && vec_x)
      gemv_pair_kernel<T, kRpw><<<pair_grid, kWarps * 32, 0, s>>>(x, cols, tg);
    else if (n_rows == 1)
      gemv_kernel<T, 1><<<grid, kWarps * 32, 0, s>>>(x, n_rows, ldx, cols, tg);
    else
      gemv_kernel<T, kGemvMaxRows><<<grid, kWarps * 32, 0, s>>>(x, n_rows, ldx, cols, tg);
    TESSERA_CUDA_CHECK_LAUNCH("gemv");
  });
}

}  // namespace tessera::cuda
