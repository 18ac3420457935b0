// Rotary position embedding in place. One thread per (row, rotated pair): the angle and its
// cos/sin are computed once in double (as the CPU's table is) and applied to every head.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
__global__ void rope_kernel(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* __restrict__ positions,
                            int head_dim, int half, bool neox, const double* __restrict__ inv_freq) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_rows) * half) return;
  const int r = static_cast<int>(idx / half), i = static_cast<int>(idx % half);
  double sd, cd;
  sincos(static_cast<double>(positions[r]) * inv_freq[i], &sd, &cd);
  const float c = static_cast<float>(cd), s = static_cast<float>(sd);
  float* row = x + r * ld;
  for (int h = 0; h < n_heads; ++h) {
    float* v = row + static_cast<int64_t>(h) * head_dim;
    const int ia = neox ? i : 2 * i, ib = neox ? i + half : 2 * i + 1;
    const float a = v[ia], b = v[ib];
    v[ia] = a * c - b * s;
    v[ib] = a * s + b * c;
  }
}
}  // namespace

void launch_rope(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* positions, int head_dim, int rot_dim,
                 bool neox, const double* inv_freq, cudaStream_t s) {
  const int half = rot_dim / 2;
  if (n_rows <= 0 || half <= 0) return;
  rope_kernel<<<blocks_for(static_cast<int64_t>(n_rows) * half, 256), 256, 0, s>>>(x, n_rows, ld, n_heads, positions,
                                                                                  head_dim, half, neox, inv_freq);
  TESSERA_CUDA_CHECK_LAUNCH("rope");
}

}  // namespace tessera::cuda
