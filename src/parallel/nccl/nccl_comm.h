#pragma once
// NCCL communicators for tensor parallelism across processes (one per GPU) and nodes,
// bootstrapped by the TCP rendezvous (parallel/rendezvous.h). Defined by nccl_comm.cpp in a
// build with the CUDA backend and NCCL, by nccl_unavailable.cpp (which says so) otherwise.
// Not run in CI: it needs two GPUs (docs/design/parallel.md).
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "parallel/communicator.h"
#include "parallel/rendezvous.h"

namespace tessera {

// This process's rank of the world `r` describes, on `backend` (a CUDA backend: collectives
// are queued on its stream, on its device). Global rank 0 makes the ncclUniqueId and hands
// it out through the rendezvous; every rank then joins with ncclCommInitRank. Throws naming
// the problem (no NCCL in this build, not a CUDA backend, a rendezvous or NCCL error).
std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend, const RendezvousOptions& r);
// One process driving every GPU of the group from its own thread (tessera's in-process tensor
// parallelism on CUDA): backends[r] is rank r's CUDA backend; ncclCommInitAll makes the N
// communicators at once (no rendezvous). Each is then used only from rank r's thread. Throws
// naming the problem (no NCCL in this build, a backend that is not CUDA, two ranks on one
// device, an NCCL error).
std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::span<Backend* const> backends);
// Whether this build contains the NCCL communicator.
bool nccl_compiled();

}  // namespace tessera
