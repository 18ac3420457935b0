// The backend registry: the one place that knows every backend (CPU, CUDA), so the
// backends themselves never depend on each other (docs/design/layers.md).
#include "backend/backend.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cuda/cuda_factory.h"
#include "backend/query_observer.h"
#include "core/error.h"

namespace tessera {

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.device == "cpu") return std::make_unique<CpuBackend>(options.threads);
  if (options.device == "cuda" || options.device.rfind("cuda:", 0) == 0) return make_cuda_backend(options);
  fail("unknown device '", options.device, "' (known: cpu, cuda, cuda:N)");
}

bool observe_queries(Backend& backend, QueryObserver f) {
  auto* cpu = dynamic_cast<CpuBackend*>(&backend);
  if (!cpu) return false;
  cpu->set_query_observer(std::move(f));
  return true;
}

}  // namespace tessera
