// Matrix-vector and small-batch products (decode) reading the weights in their stored
// format: one warp per output feature, each lane decoding 8 consecutive elements per step
// (16-byte loads for bf16/f16), the x rows read through L1 (they are reused by every warp).
// Up to kGemvMaxTargets weights sharing the input run in one launch (Q/K/V, gate/up). At
// batch 1 a warp takes two features (gemv_pair_kernel).
#include <cstdlib>

#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_decode.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 8;

struct Targets {
  const uint8_t* w[kGemvMaxTargets];
  float* y[kGemvMaxTargets];
  int64_t ldy[kGemvMaxTargets];
  int64_t row_end[kGemvMaxTargets];  // cumulative rows: target i owns [row_end[i-1], row_end[i])
  int64_t row_bytes;
  int n;
};

// NR: rows of x computed at once (1, or up to kGemvMaxRows with n_rows guarding the rest).
template <DType T, int NR, bool kVecX>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const float* __restrict__ x, int n_rows, int64_t ldx,
                                                             int64_t cols, Targets tg) {
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
      if constexpr (kVecX) {
        // Two 16-byte loads: scalar loads here cost 4x the L1 wavefronts of the weight load.
        const float4 a = __ldg(reinterpret_cast<const float4*>(xr)), b = __ldg(reinterpret_cast<const float4*>(xr + 4));
        x8[0] = a.x; x8[1] = a.y; x8[2] = a.z; x8[3] = a.w; x8[4] = b.x; x8[5] = b.y; x8[6] = b.z; x8[7] = b.w;
      } else {
#pragma unroll
        for (int k = 0; k < 8; ++k) x8[k] = __ldg(xr + k);
      }
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

// Batch 1 (the decode that matters most): each warp takes R output features (4 by default;
// 2 → 4 measured 137 → 144 tok/s, 8 was slower: 132), so one
// pair of x loads (through L1) feeds R independent weight loads, cutting the L1 traffic
// per weight byte and multiplying the loads in flight per lane. Each feature's sum is formed
// in the same order as gemv_kernel's, so the results are the same bits.
// MINB: __launch_bounds__' blocks per SM. With 1 (the default) ptxas gives the 4-feature
// kernel 154 registers (72 without the argument) and more loads in flight: 164 → 184 tok/s
// at batch 1 (8B bf16, H200). TESSERA_CUDA_GEMV_MINB=4 caps it at 64 (spills: 141).
template <DType T, int kRowsPerWarp, int MINB>
__global__ void __launch_bounds__(kWarps * 32, MINB) gemv_pair_kernel(const float* __restrict__ x, int64_t cols,
                                                                       Targets tg) {
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

// TESSERA_CUDA_GEMV_PAIRS=0 selects the one-feature-per-warp kernel at batch 1 (A/B runs).
bool pairs_enabled() {
  static const bool on = env_switch_on("TESSERA_CUDA_GEMV_PAIRS");
  return on;
}

// Features per warp at batch 1: 4 by default; for A/B runs TESSERA_CUDA_GEMV_ROWS=2, or =auto
// (4 for launches of at least 16384 rows, else 2: more warps for the short matrices; 180
// against 184 tok/s).
int rows_per_warp(int64_t total_rows) {
  static const int r = [] {
    const char* env = std::getenv("TESSERA_CUDA_GEMV_ROWS");
    return env && env[0] == '2' ? 2 : env && env[0] == 'a' ? 0 : 4;
  }();
  return r ? r : total_rows >= 16384 ? 4 : 2;
}

// TESSERA_CUDA_GEMV_MINB=4: the 4-feature kernel with registers capped for 4 blocks per SM
// (A/B runs; slower).
bool capped_registers() {
  static const bool on = [] {
    const char* env = std::getenv("TESSERA_CUDA_GEMV_MINB");
    return env && env[0] == '4';
  }();
  return on;
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
  const bool pairs = n_rows == 1 && vec_x && pairs_enabled();
  const int rpw = rows_per_warp(total);
  const unsigned pair_grid = blocks_for((total + rpw - 1) / rpw, kWarps);
  return dispatch_weight_type(type, [&]<DType T>() {
    if (pairs && rpw == 4 && capped_registers())
      gemv_pair_kernel<T, 4, 4><<<pair_grid, kWarps * 32, 0, s>>>(x, cols, tg);
    else if (pairs && rpw == 4)
      gemv_pair_kernel<T, 4, 1><<<pair_grid, kWarps * 32, 0, s>>>(x, cols, tg);
    else if (pairs)
      gemv_pair_kernel<T, 2, 1><<<pair_grid, kWarps * 32, 0, s>>>(x, cols, tg);
    else if (n_rows == 1 && vec_x)
      gemv_kernel<T, 1, true><<<grid, kWarps * 32, 0, s>>>(x, n_rows, ldx, cols, tg);
    else if (n_rows == 1)
      gemv_kernel<T, 1, false><<<grid, kWarps * 32, 0, s>>>(x, n_rows, ldx, cols, tg);
    else
      gemv_kernel<T, kGemvMaxRows, false><<<grid, kWarps * 32, 0, s>>>(x, n_rows, ldx, cols, tg);
    TESSERA_CUDA_CHECK_LAUNCH("gemv");
  });
}

}  // namespace tessera::cuda
