// Row argmax for greedy sampling on the device: only the token ids cross the bus. Same rule
// as the CPU sampler: the first index of the largest value (lowest id on ties, -0 == +0);
// -1 when the row holds a NaN or +inf or only -inf, so that the host copies that row and
// the sampler reports the problem with its own message.
#include <climits>
#include <cmath>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/kernels.h"

namespace tessera::cuda {

namespace {

constexpr int kThreads = 1024;

struct Best {
  float v;
  int i;  // INT_MAX = none yet
};

__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

__global__ void __launch_bounds__(kThreads) row_argmax(const float* __restrict__ x, int n_cols, int32_t* out) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n_cols;
  Best best{-INFINITY, INT_MAX};
  bool bad = false;
  // Each thread scans ascending indices, so its first maximum is its lowest index.
  for (int i = threadIdx.x; i < n_cols; i += kThreads) {
    const float v = row[i];
    if (isnan(v) || v == INFINITY)
      bad = true;
    else if (v > best.v)
      best = {v, i};
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const Best other{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)};
    best = better(best, other);
  }
  bad = __any_sync(0xffffffffu, bad);
  __shared__ Best warp_best[kThreads / 32];
  __shared__ int warp_bad[kThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_best[warp] = best;
    warp_bad[warp] = bad;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    Best b = warp_best[0];
    int any_bad = warp_bad[0];
    for (int w = 1; w < kThreads / 32; ++w) {
      b = better(b, warp_best[w]);
      any_bad |= warp_bad[w];
    }
    out[blockIdx.x] = (any_bad || b.i == INT_MAX) ? -1 : b.i;
  }
}

}  // namespace

void launch_row_argmax(const float* x, int n_rows, int n_cols, int32_t* out, cudaStream_t s) {
  if (n_rows <= 0) return;
  row_argmax<<<n_rows, kThreads, 0, s>>>(x, n_cols, out);
  TESSERA_CUDA_CHECK_LAUNCH("row_argmax");
}

}  // namespace tessera::cuda
