// Activations f32 → bf16 or f16 (dense [n_rows, cols]) for the tensor-core GEMM.
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
__global__ void convert_rows_kernel(const float* __restrict__ x, int64_t ldx, int64_t cols, int64_t n,
                                    uint16_t* __restrict__ out, bool to_bf16) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[(i / cols) * ldx + i % cols];
    out[i] = f32_to_16bits(v, to_bf16);
  }
}

// Four elements per thread (cols a multiple of 4, aligned rows): the scalar kernel's 64-bit
// index arithmetic per element made it slower than the stream it is.
__global__ void convert_rows4_kernel(const float4* __restrict__ x, int64_t ld4, int64_t cols4, int64_t n4,
                                     uint2* __restrict__ out, bool to_bf16) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = x[(i / cols4) * ld4 + i % cols4];
    auto h = [&](float f) { return static_cast<uint32_t>(f32_to_16bits(f, to_bf16)); };
    out[i] = make_uint2(h(v.x) | h(v.y) << 16, h(v.z) | h(v.w) << 16);
  }
}
}  // namespace

void launch_convert_rows(const float* x, int n_rows, int64_t ldx, int64_t cols, uint16_t* out, bool to_bf16,
                         cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(n_rows) * cols;
  if (n <= 0) return;
  if (cols % 4 == 0 && ldx % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 8 == 0) {
    convert_rows4_kernel<<<std::min<unsigned>(blocks_for(n / 4, 256), 132u * 16u), 256, 0, s>>>(
        reinterpret_cast<const float4*>(x), ldx / 4, cols / 4, n / 4, reinterpret_cast<uint2*>(out), to_bf16);
    TESSERA_CUDA_CHECK_LAUNCH("convert_rows");
    return;
  }
  convert_rows_kernel<<<std::min<unsigned>(blocks_for(n, 256), 132u * 16u), 256, 0, s>>>(x, ldx, cols, n, out, to_bf16);
  TESSERA_CUDA_CHECK_LAUNCH("convert_rows");
}

}  // namespace tessera::cuda
