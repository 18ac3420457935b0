// The stand-in of a build without NCCL (cmake/nccl.cmake): it says so.
#include "core/error.h"
#include "parallel/nccl/nccl_comm.h"

namespace tessera {

std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend, const RendezvousOptions& r) {
  fail(
      "tensor parallelism across processes needs NCCL: this build has none (configure with -DTESSERA_CUDA=ON "
      "and NCCL installed, e.g. /usr/local/cuda/lib/libnccl.so)");
}

std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::span<Backend* const> backends) {
  fail("tensor parallelism over ", backends.size(),
       " GPUs needs NCCL: this build has none (configure with -DTESSERA_CUDA=ON and NCCL installed, e.g. "
       "/usr/local/cuda/lib/libnccl.so)");
}

bool nccl_compiled() { return false; }

}  // namespace tessera
