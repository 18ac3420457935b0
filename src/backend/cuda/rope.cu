// Rotary position embedding in place, one thread per (row, head, rotated pair).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
// One thread per (row, head, rotated pair). The angle's cos/sin are computed in double (as
// the CPU's table is) by every head's thread: a decode step has one row, so spreading the
// heads over threads (instead of one thread walking 32 heads through dependent loads and
// stores) is what fills the GPU; the double sincos costs far less than that latency chain.
__global__ void rope_kernel(float* __restrict__ x, int n_rows, int64_t ld, int n_heads,
                            const int32_t* __restrict__ positions, int head_dim, int half, bool neox,
                            const double* __restrict__ inv_freq) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_rows) * n_heads * half) return;
  const int i = static_cast<int>(idx % half);
  const int64_t rh = idx / half;
  const int h = static_cast<int>(rh % n_heads), r = static_cast<int>(rh / n_heads);
  float* v = x + r * ld + static_cast<int64_t>(h) * head_dim;
  const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
  float a = v[ia], b = v[ib];
  rope_rotate(a, b, positions[r], inv_freq[i]);
  v[ia] = a;
  v[ib] = b;
}
}  // namespace

void launch_rope(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* positions, int head_dim, int rot_dim,
                 bool neox, const double* inv_freq, cudaStream_t s) {
  const int half = rot_dim / 2;
  if (n_rows <= 0 || half <= 0 || n_heads <= 0) return;
  const int64_t n = static_cast<int64_t>(n_rows) * n_heads * half;
  launch_pdl(rope_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, s, x, n_rows, ld, n_heads, positions, head_dim, half,
             neox, inv_freq);
  TESSERA_CUDA_CHECK_LAUNCH("rope");
}

}  // namespace tessera::cuda
