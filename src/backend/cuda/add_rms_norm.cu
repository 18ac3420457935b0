// Fused residual add + RMSNorm, one block per row: x += residual; out = rms_norm(x) * w.
// One read of x and residual, one write of x and out.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
__global__ void add_rms_norm_kernel(float* __restrict__ x, const float* __restrict__ residual,
                                    const float* __restrict__ w, float* __restrict__ out, int dim, float eps) {
  float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  const float* rr = residual + static_cast<int64_t>(blockIdx.x) * dim;
  float* o = out + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = xr[i] + rr[i];
    xr[i] = v;
    ss += v * v;
  }
  ss = block_sum(ss);  // its barrier also orders the writes of x above before the reads below
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * w[i];
}
}  // namespace

void launch_add_rms_norm(float* x, const float* residual, const float* w, float* out, int n_rows, int dim, float eps,
                         cudaStream_t s) {
  if (n_rows <= 0) return;
  add_rms_norm_kernel<<<n_rows, 256, 0, s>>>(x, residual, w, out, dim, eps);
  TESSERA_CUDA_CHECK_LAUNCH("add_rms_norm");
}

}  // namespace tessera::cuda
