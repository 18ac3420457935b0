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
    out[i] = to_bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
  }
}
}  // namespace

void launch_convert_rows(const float* x, int n_rows, int64_t ldx, int64_t cols, uint16_t* out, bool to_bf16,
                         cudaStream_t s) {
  const int64_t n = static_cast<int64_t>(n_rows) * cols;
  if (n <= 0) return;
  convert_rows_kernel<<<std::min<unsigned>(blocks_for(n, 256), 132u * 16u), 256, 0, s>>>(x, ldx, cols, n, out,
                                                                                        to_bf16);
  TESSERA_CUDA_CHECK_LAUNCH("convert_rows");
}

}  // namespace tessera::cuda
