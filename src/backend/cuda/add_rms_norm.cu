// Fused residual add + RMSNorm, one block per row: x += residual; out = rms_norm(x) * w.
// One read of x and residual, one write of x and out.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/q8_producers.h"
#include "backend/cuda/q8_rows.cuh"

namespace tessera::cuda {

namespace {

// x_out = x + residual over one row (T: float or float4, n elements of T), returning the
// block's 1 / rms of the sums (dim floats) with eps. Squares summed per element in order, a
// float4's four at once; block_sum's barrier also orders the x_out writes before the block
// reads them back. x_out is a buffer of its own (the in-place kernels keep their loops).
__device__ __forceinline__ float squares(float v) { return v * v; }
__device__ __forceinline__ float squares(float4 v) { return v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w; }
__device__ __forceinline__ float add(float a, float b) { return a + b; }
__device__ __forceinline__ float4 add(float4 a, float4 b) {
  return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

template <class T>
__device__ __forceinline__ float add_residual_inv_rms(const T* __restrict__ x, const T* __restrict__ residual,
                                                      T* __restrict__ x_out, int n, int dim, float eps) {
  float ss = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const T v = add(x[i], residual[i]);
    x_out[i] = v;
    ss += squares(v);
  }
  ss = block_sum(ss);
  return rsqrtf(ss / static_cast<float>(dim) + eps);
}

__global__ void add_rms_norm_kernel(float* __restrict__ x, const float* __restrict__ residual,
                                    const float* __restrict__ w, float* __restrict__ out, int dim, float eps) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
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

// The same with 16-byte accesses (dim a multiple of 4, aligned rows); the second pass
// re-reads what this thread wrote (from L1). The sum of squares is grouped by four.
__global__ void add_rms_norm4_kernel(float4* __restrict__ x, const float4* __restrict__ residual,
                                     const float4* __restrict__ w, float4* __restrict__ out, int dim4, float eps) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  float4* xr = x + static_cast<int64_t>(blockIdx.x) * dim4;
  const float4* rr = residual + static_cast<int64_t>(blockIdx.x) * dim4;
  float4* o = out + static_cast<int64_t>(blockIdx.x) * dim4;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim4; i += blockDim.x) {
    const float4 a = xr[i], b = rr[i];
    const float4 v = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
    xr[i] = v;
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  ss = block_sum(ss);
  const float inv = rsqrtf(ss / static_cast<float>(4 * dim4) + eps);
  for (int i = threadIdx.x; i < dim4; i += blockDim.x) {
    const float4 v = xr[i], g = w[i];
    o[i] = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
  }
}

// x_out = x + residual into its own buffer and the norm as f32 or 16-bit values (the input of
// the product that follows, Backend::add_rms_norm_matmul); one block per row.
__global__ void add_rms_norm_into_kernel(const float* __restrict__ x, const float* __restrict__ residual,
                                         const float* __restrict__ w, float* __restrict__ x_out,
                                         float* __restrict__ out32, uint16_t* __restrict__ out16, bool to_bf16, int dim,
                                         float eps) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * dim;
  const float inv = add_residual_inv_rms(x + row, residual + row, x_out + row, dim, dim, eps);
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const float o = x_out[row + i] * inv * w[i];
    if (out16)
      out16[row + i] = f32_to_16bits(o, to_bf16);
    else
      out32[row + i] = o;
  }
}

// The same with 16-byte accesses (dim a multiple of 4, aligned rows), as add_rms_norm4_kernel:
// the 128-row decode runs it before each GEMM (64 times a step).
__global__ void add_rms_norm_into4_kernel(const float4* __restrict__ x, const float4* __restrict__ residual,
                                          const float4* __restrict__ w, float4* __restrict__ x_out,
                                          float4* __restrict__ out32, uint2* __restrict__ out16, bool to_bf16, int dim4,
                                          float eps) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * dim4;
  const float inv = add_residual_inv_rms(x + row, residual + row, x_out + row, dim4, 4 * dim4, eps);
  for (int i = threadIdx.x; i < dim4; i += blockDim.x) {
    const float4 v = x_out[row + i], g = w[i];
    const float4 o = make_float4(v.x * inv * g.x, v.y * inv * g.y, v.z * inv * g.z, v.w * inv * g.w);
    if (out16) {
      const uint32_t lo = f32_to_16bits(o.x, to_bf16) | static_cast<uint32_t>(f32_to_16bits(o.y, to_bf16)) << 16;
      const uint32_t hi = f32_to_16bits(o.z, to_bf16) | static_cast<uint32_t>(f32_to_16bits(o.w, to_bf16)) << 16;
      out16[row + i] = make_uint2(lo, hi);
    } else {
      out32[row + i] = o;
    }
  }
}

// x_out = x + residual, and the norm quantized per 32 columns straight into the integer
// decode kernels' input (q8_rows.cuh): one block per row. The values quantized are
// add_rms_norm_into_kernel's f32 outputs, bit for bit. A single block carries a whole decode
// row, so every thread must keep its loads independent: the vector kernel gives each thread
// 16 columns (four 16-byte loads of x_out and of w in flight, a lane pair per 32-column block);
// the scalar one (any width) a warp per block, one block after another.
__global__ void add_rms_norm_q8_kernel(const float* __restrict__ x, const float* __restrict__ residual,
                                       const float* __restrict__ w, float* __restrict__ x_out, int dim, float eps,
                                       Q8Rows out) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int64_t row = static_cast<int64_t>(blockIdx.x) * dim;
  const float inv = add_residual_inv_rms(x + row, residual + row, x_out + row, dim, dim, eps);
  const int lane = threadIdx.x & 31, n_blocks = static_cast<int>(out.ld / 32);
  for (int b = threadIdx.x >> 5; b < n_blocks; b += blockDim.x >> 5) {
    const int j = b * 32 + lane;
    q8_store_block(j < dim ? x_out[row + j] * inv * w[j] : 0.0f, out, blockIdx.x, b, lane);
  }
}

// dim a multiple of 16, rows 16-byte aligned.
__global__ void add_rms_norm_q8_vec_kernel(const float4* __restrict__ x, const float4* __restrict__ residual,
                                           const float4* __restrict__ w, float4* __restrict__ x_out, int dim, float eps,
                                           Q8Rows out) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int dim4 = dim / 4;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * dim4;
  const float inv = add_residual_inv_rms(x + row, residual + row, x_out + row, dim4, dim, eps);
  // Chunks of 16 columns, [0, ld / 16): those past dim (half of a last block) quantize zeros.
  const int n_chunks = static_cast<int>(out.ld / 16), lane = threadIdx.x & 31;
  for (int c0 = threadIdx.x - lane; c0 < n_chunks; c0 += blockDim.x) {  // whole warps a round
    const int c = c0 + lane;
    float v[16];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int i = 4 * c + k;  // float4 index in the row
      float4 xo = make_float4(0.0f, 0.0f, 0.0f, 0.0f), g = xo;
      if (c < n_chunks && i < dim4) {
        xo = x_out[row + i];
        g = w[i];
      }
      v[4 * k + 0] = xo.x * inv * g.x;
      v[4 * k + 1] = xo.y * inv * g.y;
      v[4 * k + 2] = xo.z * inv * g.z;
      v[4 * k + 3] = xo.w * inv * g.w;
    }
    q8_store_half_block(v, out, blockIdx.x, c, c < n_chunks);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
}  // namespace

void launch_add_rms_norm_into(const float* x, const float* residual, const float* w, float* x_out, float* out32,
                              uint16_t* out16, bool to_bf16, int n_rows, int dim, float eps, cudaStream_t s) {
  if (n_rows <= 0) return;
  // 16-bit rows of dim/4 uint2 need 8-byte alignment; 16 asked of every pointer for simplicity.
  if (dim % 4 == 0 && aligned16(x) && aligned16(residual) && aligned16(w) && aligned16(x_out) &&
      aligned16(out32 ? static_cast<const void*>(out32) : out16))
    launch_pdl(add_rms_norm_into4_kernel, dim3(n_rows), dim3(256), 0, s, reinterpret_cast<const float4*>(x),
               reinterpret_cast<const float4*>(residual), reinterpret_cast<const float4*>(w),
               reinterpret_cast<float4*>(x_out), reinterpret_cast<float4*>(out32), reinterpret_cast<uint2*>(out16),
               to_bf16, dim / 4, eps);
  else
    launch_pdl(add_rms_norm_into_kernel, dim3(n_rows), dim3(256), 0, s, x, residual, w, x_out, out32, out16, to_bf16,
               dim, eps);
  TESSERA_CUDA_CHECK_LAUNCH("add_rms_norm_into");
}

void launch_add_rms_norm_q8(const float* x, const float* residual, const float* w, float* x_out, int n_rows, int dim,
                            float eps, Q8Rows out, cudaStream_t s) {
  if (n_rows <= 0) return;
  TESSERA_CHECK(out.ld == (dim + 31) / 32 * 32 && reinterpret_cast<uintptr_t>(out.q) % 16 == 0,
                "cuda add_rms_norm_q8: output not laid out by q8_rows_view");
  if (dim % 16 == 0 && aligned16(x) && aligned16(residual) && aligned16(w) && aligned16(x_out))
    launch_pdl(add_rms_norm_q8_vec_kernel, dim3(n_rows), dim3(256), 0, s, reinterpret_cast<const float4*>(x),
               reinterpret_cast<const float4*>(residual), reinterpret_cast<const float4*>(w),
               reinterpret_cast<float4*>(x_out), dim, eps, out);
  else
    launch_pdl(add_rms_norm_q8_kernel, dim3(n_rows), dim3(256), 0, s, x, residual, w, x_out, dim, eps, out);
  TESSERA_CUDA_CHECK_LAUNCH("add_rms_norm_q8");
}

void launch_add_rms_norm(float* x, const float* residual, const float* w, float* out, int n_rows, int dim, float eps,
                         cudaStream_t s) {
  if (n_rows <= 0) return;
  const bool vec = dim % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(residual) % 16 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0;
  if (vec)
    launch_pdl(add_rms_norm4_kernel, dim3(n_rows), dim3(256), 0, s, reinterpret_cast<float4*>(x),
               reinterpret_cast<const float4*>(residual), reinterpret_cast<const float4*>(w),
               reinterpret_cast<float4*>(out), dim / 4, eps);
  else
    launch_pdl(add_rms_norm_kernel, dim3(n_rows), dim3(256), 0, s, x, residual, w, out, dim, eps);
  TESSERA_CUDA_CHECK_LAUNCH("add_rms_norm");
}

}  // namespace tessera::cuda
