#pragma once
// Warp-level tensor-core and shared-memory helpers of the attention kernels (sm_80+ PTX:
// ldmatrix, mma.sync m16n8k16 f16 -> f32, cp.async). Included by .cu files only.
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_common.cuh"

namespace tessera::cuda {

__device__ __forceinline__ void ldmatrix_x4(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t addr, uint32_t& r0, uint32_t& r1, uint32_t& r2,
                                                  uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// d += a · b, m16n8k16, f16 operands, f32 accumulators.
__device__ __forceinline__ void mma_f16(float* d, const uint32_t* a, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem));
}

// One online-softmax step (base 2) of a warp's m16 × (8·NT) score fragments, FlashAttention-2
// style: rows fr (elements 0, 1 of each n8 tile) and fr + 8 (elements 2, 3), masked scores
// already -inf. Updates the running max m and this lane's share of the row sums l, turns s
// into probabilities, and gives the factors c that rescale the previous O rows.
template <int NT>
__device__ __forceinline__ void online_softmax_step(float (&s)[NT][4], float& m_a, float& m_b, float& l_a, float& l_b,
                                                    float& c_a, float& c_b) {
  float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
    mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
  }
  mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
  mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
  mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
  mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
  const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
  // A row with nothing visible yet keeps a finite reference so exp2 gives 0, not NaN.
  const float ref_a = new_a == -INFINITY ? 0.0f : new_a, ref_b = new_b == -INFINITY ? 0.0f : new_b;
  c_a = exp2f(m_a - ref_a);
  c_b = exp2f(m_b - ref_b);
  m_a = new_a;
  m_b = new_b;
  float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    s[n][0] = exp2f(s[n][0] - ref_a);
    s[n][1] = exp2f(s[n][1] - ref_a);
    s[n][2] = exp2f(s[n][2] - ref_b);
    s[n][3] = exp2f(s[n][3] - ref_b);
    sum_a += s[n][0] + s[n][1];
    sum_b += s[n][2] + s[n][3];
  }
  l_a = l_a * c_a + sum_a;
  l_b = l_b * c_b + sum_b;
}

}  // namespace tessera::cuda
