// dst[i, :] = src[rows[i], :] (the rows whose logits are wanted).
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
__global__ void gather_rows_kernel(const float* __restrict__ src, int64_t ld, const int32_t* __restrict__ rows, int dim,
                                   float* __restrict__ dst) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const float* s = src + static_cast<int64_t>(rows[blockIdx.y]) * ld;
  float* d = dst + static_cast<int64_t>(blockIdx.y) * dim;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < dim; i += gridDim.x * blockDim.x) d[i] = s[i];
}
}  // namespace

void launch_gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst, cudaStream_t s) {
  if (n <= 0 || dim <= 0) return;
  launch_pdl(gather_rows_kernel, dim3(dim3(blocks_for(dim, 256), n)), dim3(256), 0, s, src, ld, rows, dim, dst);
  TESSERA_CUDA_CHECK_LAUNCH("gather_rows");
}

}  // namespace tessera::cuda
