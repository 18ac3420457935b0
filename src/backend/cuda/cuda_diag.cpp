// The one place src/backend/cuda reads the environment (cuda_diag.h).
#include "backend/cuda/cuda_diag.h"

#include <cstdlib>

namespace tessera::cuda {

const Diagnostics& diagnostics() {
  static const Diagnostics d = parse_diagnostics(std::getenv("TESSERA_CUDA_DIAG"));
  return d;
}

}  // namespace tessera::cuda
