#pragma once
// Every CUDA runtime and cuBLASLt call goes through one of these: a failure becomes a
// tessera::Error naming the call, the file and line, and the driver's message. Also the
// host-side helpers the backend's files share (rounding).
#include <cuda_runtime.h>

#include <cstddef>

#include "core/error.h"

namespace tessera::cuda {

inline size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

inline int next_pow2(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// The widest block table a decode graph key stands for: a batch's width rounded up to a
// power of two. Choices made from it (the attention's splits) are the same for every forward
// of one key.
inline int graph_table_width(int max_blocks) { return next_pow2(max_blocks > 1 ? max_blocks : 1); }

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* what, const char* file, int line);

}  // namespace tessera::cuda

#define TESSERA_CUDA_CHECK(call)                                                                                 \
  do {                                                                                                           \
    const cudaError_t tessera_err_ = (call);                                                                     \
    if (tessera_err_ != cudaSuccess) ::tessera::cuda::throw_cuda_error(tessera_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad configuration shows here, a fault at the next synchronize.
#define TESSERA_CUDA_CHECK_LAUNCH(name) TESSERA_CUDA_CHECK(cudaPeekAtLastError())
