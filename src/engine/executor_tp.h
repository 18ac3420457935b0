#pragma once
// The tensor-parallel executor (docs/design/parallel.md, "Engine"): one step of the one
// scheduler runs on every rank of a ParallelRanks group. Rank 0 runs a ModelExecutor
// over its shard, its KV cache and its backend: the forward (whose all-gathered logits are
// whole on every rank), then grammar masks, sampling and log-probabilities from its logits.
// Ranks 1..N-1 run the same batch through their own ModelRunner (their logits are dropped:
// argmax-only readback). Every KV operation is applied on every rank, to that rank's heads:
// copy-on-write block copies, and swaps to the host tier, where each rank keeps its heads of
// each of the engine's host slots. The block tables are the engine's, shared by all ranks
// (prefix-cache hits and sliding-window pools need nothing per rank). KV export/import for
// disaggregation is refused.
#include <memory>
#include <vector>

#include "engine/executor.h"
#include "engine/executor_model.h"
#include "engine/parallel_ranks.h"

namespace tessera {

class TensorParallelExecutor final : public Executor {
 public:
  // Every rank's KV cache exists (rank_kv_spec of one pool). n_host_blocks: the engine's host
  // slots for swap preemption (each rank allocates its heads' part of every slot).
  TensorParallelExecutor(ParallelRanks& ranks, int max_batch_tokens, int max_logits_rows, int n_host_blocks);
  ~TensorParallelExecutor() override;

  void add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) override;
  void remove_sequence(SeqId seq) override;
  size_t n_sequences() const override { return rank0_->n_sequences(); }
  void execute(const StepInput& input, StepOutput& output) override;
  int max_batch_tokens() const override { return rank0_->max_batch_tokens(); }
  int max_logits_rows() const override { return rank0_->max_logits_rows(); }
  int n_host_blocks() const override { return rank0_->n_host_blocks(); }
  void swap_out(std::span<const BlockSwap> swaps) override { swap(swaps, true); }
  void swap_in(std::span<const BlockSwap> swaps) override { swap(swaps, false); }
  // Disaggregation: no staging layout joins the ranks' heads (kv_spec() stays null).
  std::string kv_transfer_refusal() const override;

 private:
  // Every rank moves its heads of the blocks: out (device -> host slot) or in.
  void swap(std::span<const BlockSwap> swaps, bool out);

  ParallelRanks& ranks_;
  std::unique_ptr<ModelExecutor> rank0_;
  struct Scratch {              // a rank 1..N-1's logits readback, dropped
    std::vector<float> logits;  // [rows, n_vocab]
    std::vector<uint8_t> argmax_only;
    std::vector<int32_t> argmax;
  };
  std::vector<Scratch> scratch_;  // [size]
};

}  // namespace tessera
