// FP8 W8A8 past the decode sizes: the activations quantized per row (token) to E4M3 for the
// cuBLASLt FP8 GEMM (gemm_lt.cpp), the epilogue that applies the per-channel x per-token scales
// to its unscaled f32 product, and the bf16 decode for the shapes cuBLASLt's FP8 kernels refuse
// (output rows not a multiple of 16, an output not 16-byte aligned).
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/gemm_fp8.h"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 256;

// One block per row: amax, then codes = e4m3(x / scale) with scale = amax / 448 (RN,
// saturating: the hardware conversion with __NV_SATFINITE), columns [cols, ldq) zero.
__global__ void __launch_bounds__(kThreads)
    quantize_rows_e4m3_kernel(const float* __restrict__ x, int64_t ldx, int cols, uint8_t* __restrict__ xq, int64_t ldq,
                              float* __restrict__ sx) {
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * ldx;
  float amax = 0.0f;
  for (int j = threadIdx.x; j < cols; j += kThreads) amax = fmaxf(amax, fabsf(xr[j]));
  __shared__ float red[kThreads / 32];
  amax = warp_max(amax);
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
  __syncthreads();
  amax = red[0];
#pragma unroll
  for (int w = 1; w < kThreads / 32; ++w) amax = fmaxf(amax, red[w]);
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  uint8_t* q = xq + static_cast<int64_t>(blockIdx.x) * ldq;
  for (int j = threadIdx.x; j < ldq; j += kThreads)
    q[j] = j < cols ? static_cast<uint8_t>(__nv_cvt_float_to_fp8(xr[j] / scale, __NV_SATFINITE, __NV_E4M3)) : 0;
  if (threadIdx.x == 0) sx[blockIdx.x] = scale;
}

__global__ void scale_outer_kernel(float* __restrict__ y, int64_t ldy, int n_rows, int64_t rows,
                                   const float* __restrict__ sw, const float* __restrict__ sx) {
  const int64_t n = static_cast<int64_t>(n_rows) * rows;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / rows, r = i % rows;
    y[t * ldy + r] *= sw[r] * sx[t];
  }
}

// out[r * cols + j] = bf16(e4m3(code[r, j]) * scale[r]), a thread per element.
__global__ void dequant_fp8_bf16_kernel(const uint8_t* __restrict__ codes, int64_t row_bytes,
                                        const float* __restrict__ scales, int64_t rows, int64_t cols,
                                        uint16_t* __restrict__ out) {
  const int64_t n = rows * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, j = i % cols;
    const __half_raw h = __nv_cvt_fp8_to_halfraw(codes[r * row_bytes + j], __NV_E4M3);
    out[i] = f32_to_16bits(half_bits_to_f32(h.x) * scales[r], true);
  }
}

}  // namespace

void launch_dequant_fp8_bf16(const WeightMatrix& w, uint16_t* out, cudaStream_t s) {
  TESSERA_CHECK(is_fp8_weight(w.dtype) && w.rows > 0 && w.cols > 0, "cuda dequant_fp8: not an FP8W weight");
  const int64_t n = w.rows * w.cols;
  const unsigned grid = std::min<unsigned>(blocks_for(n, 256), 132u * 16u);
  dequant_fp8_bf16_kernel<<<grid, 256, 0, s>>>(static_cast<const uint8_t*>(w.data), w.row_bytes(), w.fp8_scales(),
                                               w.rows, w.cols, out);
  TESSERA_CUDA_CHECK_LAUNCH("dequant_fp8_bf16");
}

void launch_quantize_rows_e4m3(const float* x, int n_rows, int64_t ldx, int64_t cols, uint8_t* xq, int64_t ldq,
                               float* sx, cudaStream_t s) {
  TESSERA_CHECK(n_rows >= 1 && cols >= 1 && ldx >= cols && ldq >= cols && ldq % 16 == 0 && cols <= (1 << 30),
                "cuda quantize_rows_e4m3: bad shape (", n_rows, " x ", cols, ", ldx ", ldx, ", ldq ", ldq, ")");
  quantize_rows_e4m3_kernel<<<n_rows, kThreads, 0, s>>>(x, ldx, static_cast<int>(cols), xq, ldq, sx);
  TESSERA_CUDA_CHECK_LAUNCH("quantize_rows_e4m3");
}

void launch_scale_outer(float* y, int64_t ldy, int n_rows, int64_t rows, const float* sw, const float* sx,
                        cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(n_rows) * rows;
  const unsigned grid = std::min<unsigned>(blocks_for(n, 256), 132u * 16u);
  scale_outer_kernel<<<grid, 256, 0, s>>>(y, ldy, n_rows, rows, sw, sx);
  TESSERA_CUDA_CHECK_LAUNCH("scale_outer");
}

}  // namespace tessera::cuda
