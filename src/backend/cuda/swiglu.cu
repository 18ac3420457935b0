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
  out[idx] = silu_times(gate[r * ld_in + i], up[r * ld_in + i]);
}

// The same with 16-byte accesses (dim and ld_in multiples of 4, 16-byte aligned rows): the
// op is a pure stream (two reads, one write), so wider accesses are what it needs.
__global__ void swiglu4_kernel(const float4* __restrict__ gate, const float4* __restrict__ up, int64_t ld4,
                               float4* __restrict__ out, int n_rows, int dim4) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_rows) * dim4) return;
  const int64_t r = idx / dim4, i = idx % dim4;
  const float4 g = gate[r * ld4 + i], u = up[r * ld4 + i];
  out[idx] = make_float4(silu_times(g.x, u.x), silu_times(g.y, u.y), silu_times(g.z, u.z), silu_times(g.w, u.w));
}

// SwiGLU straight into the 16-bit activations of the tensor-core GEMM that follows (dense
// [n_rows, dim]): the same values as swiglu then convert_rows, without the f32 round trip.
__global__ void swiglu4_to16_kernel(const float4* __restrict__ gate, const float4* __restrict__ up, int64_t ld4,
                                    uint2* __restrict__ out, int n_rows, int dim4, bool to_bf16) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_rows) * dim4) return;
  const int64_t r = idx / dim4, i = idx % dim4;
  const float4 g = gate[r * ld4 + i], u = up[r * ld4 + i];
  const uint32_t lo = f32_to_16bits(silu_times(g.x, u.x), to_bf16) |
                      static_cast<uint32_t>(f32_to_16bits(silu_times(g.y, u.y), to_bf16)) << 16;
  const uint32_t hi = f32_to_16bits(silu_times(g.z, u.z), to_bf16) |
                      static_cast<uint32_t>(f32_to_16bits(silu_times(g.w, u.w), to_bf16)) << 16;
  out[idx] = make_uint2(lo, hi);
}

__global__ void swiglu_to16_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t ld_in,
                                   uint16_t* __restrict__ out, int n_rows, int dim, bool to_bf16) {
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= static_cast<int64_t>(n_rows) * dim) return;
  const int64_t r = idx / dim, i = idx % dim;
  out[idx] = f32_to_16bits(silu_times(gate[r * ld_in + i], up[r * ld_in + i]), to_bf16);
}

// The four-element kernels apply: widths and strides multiples of 4, inputs 16-byte aligned,
// the output aligned to its four elements' bytes.
bool four_wide(const float* gate, const float* up, int64_t ld_in, int dim, const void* out, size_t out_align) {
  auto at = [](const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  return dim % 4 == 0 && ld_in % 4 == 0 && at(gate, 16) && at(up, 16) && at(out, out_align);
}
}  // namespace

void launch_swiglu_to16(const float* gate, const float* up, int64_t ld_in, uint16_t* out, int n_rows, int dim,
                        bool to_bf16, cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(n_rows) * dim;
  if (n <= 0) return;
  if (four_wide(gate, up, ld_in, dim, out, 8))
    swiglu4_to16_kernel<<<blocks_for(n / 4, 256), 256, 0, s>>>(reinterpret_cast<const float4*>(gate),
                                                               reinterpret_cast<const float4*>(up), ld_in / 4,
                                                               reinterpret_cast<uint2*>(out), n_rows, dim / 4, to_bf16);
  else
    swiglu_to16_kernel<<<blocks_for(n, 256), 256, 0, s>>>(gate, up, ld_in, out, n_rows, dim, to_bf16);
  TESSERA_CUDA_CHECK_LAUNCH("swiglu_to16");
}

void launch_swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim, cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(n_rows) * dim;
  if (n <= 0) return;
  if (four_wide(gate, up, ld_in, dim, out, 16))
    swiglu4_kernel<<<blocks_for(n / 4, 256), 256, 0, s>>>(reinterpret_cast<const float4*>(gate),
                                                          reinterpret_cast<const float4*>(up), ld_in / 4,
                                                          reinterpret_cast<float4*>(out), n_rows, dim / 4);
  else
    swiglu_kernel<<<blocks_for(n, 256), 256, 0, s>>>(gate, up, ld_in, out, n_rows, dim);
  TESSERA_CUDA_CHECK_LAUNCH("swiglu");
}

}  // namespace tessera::cuda
