#pragma once
// Loads shared by the decode-size kernels that stream quantized codes (gemv_gq.cu, gemv_fp8.cu):
// the codes once, bypassing L1, and the f32 activations through L1 (every warp reads them).
#include <cstdint>

namespace tessera::cuda {

// 16 code bytes, read once: not kept in L1 (the x rows live there).
__device__ __forceinline__ uint4 load_codes(const uint8_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// x[c..c+3] of one row; past `cols` zero (only in the last, partial step).
template <bool kFull, bool kVecX>
__device__ __forceinline__ float4 load_x4(const float* xr, int c, int cols) {
  if constexpr (kFull && kVecX) {
    return __ldg(reinterpret_cast<const float4*>(xr + c));
  } else {
    float4 v;
    v.x = (kFull || c + 0 < cols) ? __ldg(xr + c + 0) : 0.0f;
    v.y = (kFull || c + 1 < cols) ? __ldg(xr + c + 1) : 0.0f;
    v.z = (kFull || c + 2 < cols) ? __ldg(xr + c + 2) : 0.0f;
    v.w = (kFull || c + 3 < cols) ? __ldg(xr + c + 3) : 0.0f;
    return v;
  }
}

__device__ __forceinline__ uint32_t word_of(const uint4& q, int i) {
  return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

// acc[t][k] += v[k][0..4) . x[t][c..c+4) for the NR rows of x (those below n_rows) and the R
// weight rows of a warp: one x load feeds R weight rows.
template <int NR, int R, bool kFull, bool kVecX>
__device__ __forceinline__ void fma_x4(const float* __restrict__ x, int n_rows, int64_t ldx, int cols, int c,
                                       const float (&v)[R][4], float (&acc)[NR][R]) {
#pragma unroll
  for (int t = 0; t < NR; ++t) {
    if (NR > 1 && t >= n_rows) break;
    const float4 xv = load_x4<kFull, kVecX>(x + t * ldx, c, cols);
#pragma unroll
    for (int k = 0; k < R; ++k) {
      float p = acc[t][k];
      p = fmaf(v[k][0], xv.x, p);
      p = fmaf(v[k][1], xv.y, p);
      p = fmaf(v[k][2], xv.z, p);
      acc[t][k] = fmaf(v[k][3], xv.w, p);
    }
  }
}

}  // namespace tessera::cuda
