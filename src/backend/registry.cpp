#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace tessera {

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.device == "cpu") return std::make_unique<CpuBackend>(options.threads);
  if (options.device.rfind("cuda", 0) == 0)
    fail("device '", options.device, "': this build of tessera was not compiled with CUDA");
  fail("unknown device '", options.device, "' (known: cpu, cuda)");
}

}  // namespace tessera
