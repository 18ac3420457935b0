#pragma once
// The TCP rendezvous that starts a multi-process group (NCCL's bootstrap, docs/design/parallel.md):
// global rank 0 listens on master_addr:master_port and hands a blob (NCCL's ncclUniqueId) to
// every other rank, which connects, says who it is, and receives it. torchrun's
// --nnodes / --node-rank / --master-addr / --master-port semantics: the world is nnodes nodes
// of ranks_per_node ranks each, and a rank's global number is node_rank * ranks_per_node + local_rank.
#include <string>

namespace tessera {

struct RendezvousOptions {
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  int nnodes = 1;
  int node_rank = 0;
  int ranks_per_node = 1;
  int local_rank = 0;
  double timeout_s = 300;  // for every rank to arrive (rank 0) or for rank 0 to answer (the others)

  int world_size() const { return nnodes * ranks_per_node; }
  int global_rank() const { return node_rank * ranks_per_node + local_rank; }
  // Throws naming the first field out of range (a port outside 1..65535, node_rank >= nnodes, ...).
  void validate() const;
};

// Rank 0 sends `blob` to every other rank and returns it once all world_size - 1 have it;
// another rank returns what rank 0 sent (its own `blob` is ignored). Throws tessera::Error
// naming the problem: the timeout (with the ranks that did not arrive), a peer that claims a
// different world size, a rank out of range or seen twice, a connection that breaks.
std::string rendezvous_broadcast(const RendezvousOptions& o, const std::string& blob);

}  // namespace tessera
