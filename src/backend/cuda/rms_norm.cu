// RMSNorm, one block per row: out = x / sqrt(mean(x^2) + eps) * w.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
__global__ void rms_norm_kernel(const float* x, const float* __restrict__ w, float* out, int dim, float eps) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * w[i];  // out may alias x
}
}  // namespace

void launch_rms_norm(const float* x, const float* w, float* out, int n_rows, int dim, float eps, cudaStream_t s) {
  if (n_rows <= 0) return;
  launch_pdl(rms_norm_kernel, dim3(n_rows), dim3(256), 0, s, x, w, out, dim, eps);
  TESSERA_CUDA_CHECK_LAUNCH("rms_norm");
}

}  // namespace tessera::cuda
