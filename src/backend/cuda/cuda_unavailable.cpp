// Built instead of the CUDA backend when CMake finds no CUDA compiler (TESSERA_CUDA=OFF).
#include "backend/cuda/cuda_factory.h"
#include "core/error.h"

namespace tessera {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  fail("device '", options.device, "': this build of tessera was not compiled with CUDA");
}

int cuda_device_count() { return 0; }
bool cuda_compiled() { return false; }

DeviceCeilings measure_cuda_ceilings(Backend&) { fail("this build of tessera was not compiled with CUDA"); }
std::string cuda_profile_take(Backend&) { return {}; }
std::shared_ptr<void> cuda_pinned_host(size_t) { fail("this build of tessera was not compiled with CUDA"); }

}  // namespace tessera
