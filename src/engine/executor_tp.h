#pragma once
// The tensor-parallel executor (docs/design/parallel.md, "Engine"): one step of the one
// scheduler runs on every rank of a ParallelRanks group. Rank 0 samples (ParallelExecutor):
// its ModelExecutor runs the forward (whose all-gathered logits are whole on every rank), then
// grammar masks, sampling and log-probabilities from its logits. Ranks 1..N-1 run the same
// batch through their own ModelRunner (their logits are dropped: argmax-only readback). Every
// KV operation is applied on every rank, to that rank's heads: copy-on-write block copies,
// and swaps to the host tier, where each rank keeps its heads of each of the engine's host
// slots. The block tables are the engine's, shared by all ranks (prefix-cache hits and
// sliding-window pools need nothing per rank).
#include <vector>

#include "engine/executor_ranks.h"

namespace tessera {

class TensorParallelExecutor final : public ParallelExecutor {
 public:
  TensorParallelExecutor(ParallelRanks& ranks, int max_batch_tokens, int max_logits_rows, int n_host_blocks)
      : ParallelExecutor(ranks, 0, max_batch_tokens, max_logits_rows, n_host_blocks) {}

  void execute(const StepInput& input, StepOutput& output) override;
};

}  // namespace tessera
