// x[r, :dim] += bias (Qwen2's Q/K/V biases).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
__global__ void add_bias_kernel(float* x, int64_t ld, const float* __restrict__ bias, int n_rows, int dim) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_rows) * dim) return;
  const int64_t r = idx / dim, i = idx % dim;
  x[r * ld + i] += bias[i];
}
}  // namespace

void launch_add_bias(float* x, int64_t ld, const float* bias, int n_rows, int dim, cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(n_rows) * dim;
  if (n <= 0) return;
  add_bias_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, ld, bias, n_rows, dim);
  TESSERA_CUDA_CHECK_LAUNCH("add_bias");
}

}  // namespace tessera::cuda
