#pragma once
// One 32-column block of activations quantized for the integer decode kernels (Q8Rows,
// kernels.h), by the warp that holds it (lane j: column 32b + j, 0 past the row's end), with the
// CPU backend's Q8 numerics bit for bit (backend/cpu/matmul_kernels_scalar.cpp,
// quantize_q8_scalar): d = fp16(amax / 127), q = nearbyint(v * 127 / amax) (ties to even), and
// the block's sum of q for the zero points. Shared by quantize_q8.cu and the kernels that write
// their output straight in this form (add_rms_norm.cu), so every producer gives the same bytes.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

// Every lane of the warp calls it (full-warp shuffles).
__device__ __forceinline__ void q8_store_block(float v, const Q8Rows& out, int64_t t, int b, int lane) {
  const float amax = warp_max(fabsf(v));
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
  const int q = __float2int_rn(__fmul_rn(v, id));
  int sum = q;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const int n_blocks = static_cast<int>(out.ld / 32);
  out.q[t * out.ld + b * 32 + lane] = static_cast<int8_t>(q);
  if (lane == 0) {
    const float d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    out.meta[t * n_blocks + b] = make_int2(__float_as_int(d), sum);
  }
}

// The same numerics with 16 columns a thread: lanes 2i and 2i + 1 hold the two halves of one
// 32-column block (c = 2b and 2b + 1, columns 16c..16c + 15; zeros past the row's end). Every
// lane of the warp calls it (full-warp shuffles); `store` false: a lane with no block this round.
__device__ __forceinline__ void q8_store_half_block(const float (&v)[16], const Q8Rows& out, int64_t t, int c,
                                                    bool store) {
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) amax = fmaxf(amax, fabsf(v[i]));
  amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
  uint32_t packed[4];
  int sum = 0;
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t word = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int q = __float2int_rn(__fmul_rn(v[4 * w + i], id));
      sum += q;
      word |= (static_cast<uint32_t>(q) & 0xFFu) << (8 * i);
    }
    packed[w] = word;
  }
  sum += __shfl_xor_sync(0xffffffffu, sum, 1);
  if (!store) return;
  *reinterpret_cast<uint4*>(out.q + t * out.ld + 16 * c) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  if ((c & 1) == 0) {
    const float d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    out.meta[t * (out.ld / 32) + c / 2] = make_int2(__float_as_int(d), sum);
  }
}

}  // namespace tessera::cuda
