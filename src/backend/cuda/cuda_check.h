#pragma once
// Every CUDA runtime and cuBLASLt call goes through one of these: a failure becomes a
// tessera::Error naming the call, the file and line, and the driver's message.
#include <cuda_runtime.h>

#include <cstdlib>

#include "core/error.h"

namespace tessera::cuda {

// An A/B switch of the environment, on unless the variable starts with '0'. Callers keep
// the answer in a function-local static: it is read once.
inline bool env_switch_on(const char* name) {
  const char* env = std::getenv(name);
  return !(env && env[0] == '0');
}

[[noreturn]] void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line);
[[noreturn]] void throw_cublas_error(int status, const char* what, const char* file, int line);

}  // namespace tessera::cuda

#define TESSERA_CUDA_CHECK(call)                                                           \
  do {                                                                                     \
    const cudaError_t tessera_err_ = (call);                                               \
    if (tessera_err_ != cudaSuccess)                                                       \
      ::tessera::cuda::throw_cuda_error(tessera_err_, #call, __FILE__, __LINE__);          \
  } while (0)

// After a kernel launch: a bad configuration shows here, a fault at the next synchronize.
#define TESSERA_CUDA_CHECK_LAUNCH(name) TESSERA_CUDA_CHECK(cudaPeekAtLastError())
