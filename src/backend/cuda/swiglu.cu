// SwiGLU: out = silu(gate) * up, element-wise over [n_rows, dim].
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
__global__ void swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t ld_in,
                              float* __restrict__ out, int n_rows, int dim) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_rows) * dim) return;
  const int64_t r = idx / dim, i = idx % dim;
  const float g = gate[r * ld_in + i];
  // silu(g) = g / (1 + e^-g), through e^-|g| so large |g| never overflows
  const float e = __expf(-fabsf(g));
  const float sig = g >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
  out[idx] = g * sig * up[r * ld_in + i];
}
}  // namespace

void launch_swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim, cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(n_rows) * dim;
  if (n <= 0) return;
  swiglu_kernel<<<blocks_for(n, 256), 256, 0, s>>>(gate, up, ld_in, out, n_rows, dim);
  TESSERA_CUDA_CHECK_LAUNCH("swiglu");
}

}  // namespace tessera::cuda
