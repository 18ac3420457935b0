// NCCL collectives on the CUDA backend's stream. Compiled here, run only on a machine with
// two or more GPUs (docs/design/parallel.md says what has been run).
#include "parallel/nccl/nccl_comm.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "backend/cuda/cuda_backend.h"
#include "core/error.h"

namespace tessera {

namespace {

void nccl_check(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) fail("nccl: ", what, ": ", ncclGetErrorString(rc));
}
void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) fail("nccl: ", what, ": ", cudaGetErrorString(rc));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(CudaBackend& be, const RendezvousOptions& r)
      : be_(be), rank_(r.global_rank()), size_(r.world_size()) {
    node_ = r.node_rank;
    cuda_check(cudaSetDevice(be.device()), "cudaSetDevice");
    ncclUniqueId id{};
    std::string blob;
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      blob.assign(reinterpret_cast<const char*>(&id), sizeof(id));
    }
    blob = rendezvous_broadcast(r, blob);
    TESSERA_CHECK(blob.size() == sizeof(id), "nccl: rank 0 sent a unique id of ", blob.size(), " bytes, expected ",
                  sizeof(id));
    std::memcpy(&id, blob.data(), sizeof(id));
    nccl_check(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    cuda_check(cudaMalloc(&token_, sizeof(float)), "cudaMalloc (barrier token)");
  }
  // A communicator ncclCommInitAll made (rank `rank` of `size`, on be's device); owns it.
  NcclCommunicator(CudaBackend& be, ncclComm_t comm, int rank, int size)
      : be_(be), rank_(rank), size_(size), comm_(comm) {
    cuda_check(cudaSetDevice(be.device()), "cudaSetDevice");
    cuda_check(cudaMalloc(&token_, sizeof(float)), "cudaMalloc (barrier token)");
  }
  ~NcclCommunicator() override {
    if (token_) cudaFree(token_);
    if (comm_) ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override {
    return "nccl " + std::to_string(rank_) + "/" + std::to_string(size_) + " (node " + std::to_string(node_) +
           ", cuda:" + std::to_string(be_.device()) + ")";
  }

  void all_reduce_sum(float* data, int64_t n) override {
    if (n == 0) return;
    nccl_check(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat, ncclSum, comm_, be_.stream()),
               "ncclAllReduce");
  }
  void all_gather(const float* send, float* recv, int64_t n) override {
    if (n == 0) return;
    nccl_check(ncclAllGather(send, recv, static_cast<size_t>(n), ncclFloat, comm_, be_.stream()), "ncclAllGather");
  }
  void broadcast(void* data, int64_t bytes, int root) override {
    TESSERA_CHECK(root >= 0 && root < size_, "broadcast: root ", root, " is not a rank of a group of ", size_);
    if (bytes == 0) return;
    nccl_check(ncclBroadcast(data, data, static_cast<size_t>(bytes), ncclChar, root, comm_, be_.stream()),
               "ncclBroadcast");
  }
  void barrier() override {
    nccl_check(ncclAllReduce(token_, token_, 1, ncclFloat, ncclSum, comm_, be_.stream()), "ncclAllReduce (barrier)");
    be_.synchronize();
  }
  // NCCL matches a send with the peer's recv on the streams (sizes must agree: a mismatch
  // hangs or corrupts, as for the collectives).
  void send(const float* data, int64_t n, int peer) override {
    TESSERA_CHECK(peer >= 0 && peer < size_ && peer != rank_, "send: rank ", rank_, " to rank ", peer);
    if (n == 0) return;
    nccl_check(ncclSend(data, static_cast<size_t>(n), ncclFloat, peer, comm_, be_.stream()), "ncclSend");
  }
  void recv(float* data, int64_t n, int peer) override {
    TESSERA_CHECK(peer >= 0 && peer < size_ && peer != rank_, "recv: rank ", rank_, " from rank ", peer);
    if (n == 0) return;
    nccl_check(ncclRecv(data, static_cast<size_t>(n), ncclFloat, peer, comm_, be_.stream()), "ncclRecv");
  }

 private:
  CudaBackend& be_;
  const int rank_, size_;
  int node_ = 0;
  ncclComm_t comm_ = nullptr;
  float* token_ = nullptr;  // device: the barrier's one-element all-reduce
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Backend& backend, const RendezvousOptions& r) {
  r.validate();
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  TESSERA_CHECK(cuda != nullptr, "nccl: the communicator needs a CUDA backend, not '", backend.name(), "'");
  return std::make_unique<NcclCommunicator>(*cuda, r);
}

std::vector<std::unique_ptr<Communicator>> make_nccl_group(std::span<Backend* const> backends) {
  const int n = static_cast<int>(backends.size());
  std::vector<CudaBackend*> cuda(n);
  std::vector<int> devices(n);
  for (int r = 0; r < n; ++r) {
    cuda[r] = dynamic_cast<CudaBackend*>(backends[r]);
    TESSERA_CHECK(cuda[r] != nullptr, "nccl: rank ", r, " needs a CUDA backend, not '", backends[r]->name(), "'");
    devices[r] = cuda[r]->device();
    for (int q = 0; q < r; ++q)
      TESSERA_CHECK(devices[q] != devices[r], "nccl: ranks ", q, " and ", r, " are both on cuda:", devices[r]);
  }
  // The communicators' setup switches devices; the caller's thread keeps its own.
  int caller_device = 0;
  cuda_check(cudaGetDevice(&caller_device), "cudaGetDevice");
  struct Restore {
    int device;
    ~Restore() { cudaSetDevice(device); }
  } restore{caller_device};
  std::vector<ncclComm_t> comms(n, nullptr);
  nccl_check(ncclCommInitAll(comms.data(), n, devices.data()), "ncclCommInitAll");
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) {
    try {
      out.push_back(std::make_unique<NcclCommunicator>(*cuda[r], comms[r], r, n));
    } catch (...) {
      for (int q = r; q < n; ++q) ncclCommDestroy(comms[q]);  // not owned by a communicator yet
      throw;
    }
  }
  return out;
}

bool nccl_compiled() { return true; }

}  // namespace tessera
