// Weights decoded to bf16 for the tensor-core GEMM at large batch: a quantized matrix is
// expanded once per matmul into a scratch buffer, then multiplied by cuBLASLt. Costs one
// read of the stored bytes plus a write and read of 2 bytes per weight, amortized over the
// batch's rows (see docs/design/cuda-backend.md).
#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_decode.cuh"

namespace tessera::cuda {

namespace {
template <DType T>
__global__ void dequant_bf16_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int64_t cols, int64_t n_groups,
                                    uint16_t* __restrict__ out) {
  for (int64_t g = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; g < n_groups;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = g / (cols / 8), e = (g % (cols / 8)) * 8;
    float v[8];
    decode8<T>(w + r * row_bytes, e, v);
    uint32_t packed[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i]));
      const uint16_t hi = __bfloat16_as_ushort(__float2bfloat16_rn(v[2 * i + 1]));
      packed[i] = lo | (static_cast<uint32_t>(hi) << 16);
    }
    *reinterpret_cast<uint4*>(out + r * cols + e) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
  }
}
}  // namespace

bool launch_dequant_bf16(DType type, const void* w, int64_t rows, int64_t cols, uint16_t* out, cudaStream_t s) {
  TESSERA_CHECK(cols % 8 == 0, "cuda dequant: width ", cols, " is not a multiple of 8");
  const int64_t n_groups = rows * (cols / 8);
  if (n_groups == 0) return true;
  const unsigned grid = std::min<unsigned>(blocks_for(n_groups, 256), 132u * 16u);
  return dispatch_weight_type(type, [&]<DType T>() {
    dequant_bf16_kernel<T>
        <<<grid, 256, 0, s>>>(static_cast<const uint8_t*>(w), dtype_row_bytes(type, cols), cols, n_groups, out);
    TESSERA_CUDA_CHECK_LAUNCH("dequant_bf16");
  });
}

}  // namespace tessera::cuda
