// Embedding gather: out[i, :] = table[ids[i] - first, :] decoded to f32, from any weight
// format; ids outside the table's rows give zeros (a vocabulary-parallel slice).
#include "backend/cuda/kernels.h"
#include "backend/cuda/quant_decode.cuh"

namespace tessera::cuda {

namespace {
template <DType T>
__global__ void embed_kernel(const uint8_t* __restrict__ table, int64_t row_bytes, int64_t cols, int64_t rows,
                             int64_t first, const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int i = blockIdx.y;
  const int64_t id = static_cast<int64_t>(ids[i]) - first;
  if (id < 0 || id >= rows) {
    for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < cols;
         e += static_cast<int64_t>(gridDim.x) * blockDim.x)
      out[i * cols + e] = 0.0f;
    return;
  }
  const uint8_t* row = table + id * row_bytes;
  for (int64_t e = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * 8; e < cols;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x * 8) {
    float v[8];
    decode8<T>(row, e, v);
#pragma unroll
    for (int k = 0; k < 8; ++k) out[i * cols + e + k] = v[k];
  }
}
}  // namespace

void launch_embed(const WeightMatrix& table, const int32_t* ids, int n, float* out, cudaStream_t s, int64_t first_id) {
  if (n <= 0) return;
  TESSERA_CHECK(table.cols % 8 == 0, "cuda embed: width ", table.cols, " is not a multiple of 8");
  const int threads = 128;
  const dim3 grid(blocks_for(table.cols / 8, threads), n);
  const bool ok = dispatch_weight_type(table.dtype, [&]<DType T>() {
    embed_kernel<T><<<grid, threads, 0, s>>>(static_cast<const uint8_t*>(table.data), table.row_bytes(), table.cols,
                                             table.rows, first_id, ids, out);
  });
  TESSERA_CHECK(ok, "cuda embed: no decoder for table type ", dtype_name(table.dtype));
  TESSERA_CUDA_CHECK_LAUNCH("embed");
}

}  // namespace tessera::cuda
