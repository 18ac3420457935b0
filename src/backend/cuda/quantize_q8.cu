// Activations quantized per 32 columns for the integer decode kernels (gemv_gq.cu), with the
// CPU backend's Q8 numerics bit for bit (backend/cpu/matmul_kernels_scalar.cpp,
// quantize_q8_scalar): d = fp16(amax / 127), q = nearbyint(x * 127 / amax) (ties to even),
// and the block's sum of q for the zero points. Act-order weights read x in their stored
// column order: the gather is folded in here.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {

// One warp per (row, 32-column block): lane j quantizes column 32b + j (0 past `cols`).
__global__ void quantize_q8_rows_kernel(const float* __restrict__ x, int n_rows, int64_t ldx, int cols,
                                        const int32_t* __restrict__ perm, Q8Rows out) {
  const int lane = threadIdx.x & 31;
  const int n_blocks = out.ld / 32;
  const int64_t item = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (item >= static_cast<int64_t>(n_rows) * n_blocks) return;
  const int t = static_cast<int>(item / n_blocks), b = static_cast<int>(item % n_blocks);
  const int j = b * 32 + lane;
  const float v = j < cols ? x[t * ldx + (perm ? perm[j] : j)] : 0.0f;
  float amax = fabsf(v);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
  const int q = __float2int_rn(__fmul_rn(v, id));
  int sum = q;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  out.q[t * out.ld + j] = static_cast<int8_t>(q);
  if (lane == 0) {
    const float d = __half2float(__float2half_rn(__fdiv_rn(amax, 127.0f)));
    out.meta[t * n_blocks + b] = make_int2(__float_as_int(d), sum);
  }
}

}  // namespace

Q8Rows q8_rows_view(void* buf, int n_rows, int64_t cols) {
  Q8Rows r;
  r.ld = (cols + 31) / 32 * 32;
  r.q = static_cast<int8_t*>(buf);
  r.meta = reinterpret_cast<int2*>(static_cast<uint8_t*>(buf) + (n_rows * r.ld + 255) / 256 * 256);
  return r;
}

size_t q8_rows_bytes(int n_rows, int64_t cols) {
  const int64_t ld = (cols + 31) / 32 * 32;
  return static_cast<size_t>((n_rows * ld + 255) / 256 * 256 + n_rows * (ld / 32) * 8);
}

void launch_quantize_q8_rows(const float* x, int n_rows, int64_t ldx, int64_t cols, const int32_t* perm, Q8Rows out,
                             cudaStream_t s) {
  TESSERA_CHECK(x && n_rows >= 1 && cols >= 1 && ldx >= cols && cols <= (int64_t{1} << 30),
                "cuda quantize_q8: bad shape (", n_rows, " rows, ", cols, " columns, stride ", ldx, ")");
  TESSERA_CHECK(out.ld == (cols + 31) / 32 * 32 && reinterpret_cast<uintptr_t>(out.q) % 16 == 0,
                "cuda quantize_q8: output not laid out by q8_rows_view");
  const int64_t warps = n_rows * (out.ld / 32);
  quantize_q8_rows_kernel<<<blocks_for(warps * 32, 256), 256, 0, s>>>(x, n_rows, ldx, static_cast<int>(cols), perm,
                                                                      out);
  TESSERA_CUDA_CHECK_LAUNCH("quantize_q8_rows");
}

}  // namespace tessera::cuda
