// Gemma 3's element-wise ops: GeGLU (gelu-tanh gate), the per-head RMSNorm of Q and K
// (QK-norm), and the embedding scale.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemma_kernels.h"

namespace tessera::cuda {

namespace {
// gelu_tanh(g) * u with tanh(|a|) = (1 - e^-2|a|) / (1 + e^-2|a|): no overflow for large |g|
// (the CPU's formula).
__device__ __forceinline__ float gelu_tanh_times(float g, float u) {
  const float a = 0.7978845608028654f * (g + 0.044715f * g * g * g);
  const float e = __expf(-2.0f * fabsf(a));
  const float t = (1.0f - e) / (1.0f + e);
  return 0.5f * g * (1.0f + (a >= 0 ? t : -t)) * u;
}

__global__ void geglu_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t ld_in,
                             float* __restrict__ out, int n_rows, int dim) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_rows) * dim) return;
  const int64_t r = idx / dim, i = idx % dim;
  out[idx] = gelu_tanh_times(gate[r * ld_in + i], up[r * ld_in + i]);
}

// One block per (row, head): x_h = x_h / rms(x_h) * w, in place.
__global__ void rms_norm_heads_kernel(float* x, int64_t ld, int n_heads, int head_dim, const float* __restrict__ w,
                                      float eps) {
  pdl_wait();
  pdl_trigger();
  float* v = x + static_cast<int64_t>(blockIdx.x) * ld + static_cast<int64_t>(blockIdx.y) * head_dim;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) ss += v[i] * v[i];
  ss = block_sum(ss);  // every thread has read its elements before any writes (the sum syncs)
  const float inv = rsqrtf(ss / static_cast<float>(head_dim) + eps);
  for (int i = threadIdx.x; i < head_dim; i += blockDim.x) v[i] = v[i] * inv * w[i];
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  pdl_wait();
  pdl_trigger();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] *= s;
}
}  // namespace

void launch_geglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim, cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(n_rows) * dim;
  if (n <= 0) return;
  launch_pdl(geglu_kernel, dim3(blocks_for(n, 256)), dim3(256), 0, s, gate, up, ld_in, out, n_rows, dim);
  TESSERA_CUDA_CHECK_LAUNCH("geglu");
}

void launch_rms_norm_heads(float* x, int64_t ld, int n_rows, int n_heads, int head_dim, const float* w, float eps,
                           cudaStream_t s) {
  if (n_rows <= 0 || n_heads <= 0) return;
  TESSERA_CHECK(n_heads <= 65535, "rms_norm_heads: ", n_heads, " heads");
  const int threads = std::min(256, (head_dim + 31) / 32 * 32);
  launch_pdl(rms_norm_heads_kernel, dim3(n_rows, n_heads), dim3(threads), 0, s, x, ld, n_heads, head_dim, w, eps);
  TESSERA_CUDA_CHECK_LAUNCH("rms_norm_heads");
}

void launch_scale(float* x, float scale, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(scale_kernel, dim3(std::min<unsigned>(blocks_for(n, 256), 65535u)), dim3(256), 0, s, x, scale, n);
  TESSERA_CUDA_CHECK_LAUNCH("scale");
}

}  // namespace tessera::cuda
