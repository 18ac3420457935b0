// x += y over n floats.
#include <algorithm>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {
__global__ void add_kernel(float* x, const float* __restrict__ y, int64_t n) {
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}
}  // namespace

void launch_add(float* x, const float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  launch_pdl(add_kernel, dim3(std::min<unsigned>(blocks_for(n, 256), 65535u)), dim3(256), 0, s, x, y, n);
  TESSERA_CUDA_CHECK_LAUNCH("add");
}

}  // namespace tessera::cuda
