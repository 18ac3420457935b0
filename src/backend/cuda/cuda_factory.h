#pragma once
// The registry's only view of the CUDA backend: defined by cuda_backend.cpp in a build with
// CUDA, and by cuda_unavailable.cpp (which says so) in one without.
#include <memory>
#include <string>

#include "backend/backend.h"

namespace tessera {

// Makes the backend for device "cuda" or "cuda:N"; throws naming the problem (no CUDA in
// this build, no such device, a driver error).
std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options);
// CUDA devices visible to this process; 0 when there are none or the build has no CUDA.
int cuda_device_count();
// Whether this build contains the CUDA backend.
bool cuda_compiled();

// The device's two ceilings, measured on `backend` (a CUDA backend): a 2 GiB device-to-device
// copy (bytes read + written per second, best of 5) and an 8192^3 bf16 product through
// cuBLASLt on random data (FLOP/s, best of 5). For the floors printed beside benchmarks.
struct DeviceCeilings {
  double copy_bytes_per_s = 0;
  double bf16_flops_per_s = 0;
};
DeviceCeilings measure_cuda_ceilings(Backend& backend);
// With TESSERA_CUDA_DIAG=profile (backend/cuda/cuda_diag.h): the per-op device-time table of `backend` (a CUDA backend)
// since the last call, then reset; "" when profiling is off or for any other backend.
std::string cuda_profile_take(Backend& backend);
// Page-locked host memory (fast device→host copies), freed with the handle.
std::shared_ptr<void> cuda_pinned_host(size_t bytes);

}  // namespace tessera
