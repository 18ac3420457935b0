#pragma once
// What the tensor- and pipeline-parallel executors share (docs/design/parallel.md): one rank of
// a ParallelRanks group, the sampling rank, runs a ModelExecutor over its model, KV cache and
// backend (the logits it sees are the model's whole vocabulary: rank 0's after the head's
// all-gather, or the last pipeline stage's), which holds the sequences' sampling state; the
// other ranks run their own ModelRunner and keep their part of each of the engine's host swap
// slots. Swaps move every rank's part. KV export/import for disaggregation is refused. Each
// rank's objects are made, used and freed on its own thread.
#include <memory>
#include <span>
#include <string>

#include "engine/executor.h"
#include "engine/executor_model.h"
#include "engine/parallel_ranks.h"

namespace tessera {

class ParallelExecutor : public Executor {
 public:
  // Every rank's KV cache exists (rank_kv_spec of one pool). n_host_blocks: the engine's host
  // slots for swap preemption (each rank allocates its part of every slot).
  ParallelExecutor(ParallelRanks& ranks, int sampling_rank, int max_batch_tokens, int max_logits_rows,
                   int n_host_blocks);
  ~ParallelExecutor() override;

  void add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) override {
    sampler_->add_sequence(seq, params, prompt);
  }
  void remove_sequence(SeqId seq) override { sampler_->remove_sequence(seq); }
  size_t n_sequences() const override { return sampler_->n_sequences(); }
  int max_batch_tokens() const override { return sampler_->max_batch_tokens(); }
  int max_logits_rows() const override { return sampler_->max_logits_rows(); }
  int n_host_blocks() const override { return sampler_->n_host_blocks(); }
  void swap_out(std::span<const BlockSwap> swaps) override { swap(swaps, true); }
  void swap_in(std::span<const BlockSwap> swaps) override { swap(swaps, false); }
  // Disaggregation: no staging layout joins the ranks' parts (kv_spec() stays null).
  std::string kv_transfer_refusal() const override;

 protected:
  ParallelRanks& ranks_;
  const int sampling_rank_;
  std::unique_ptr<ModelExecutor> sampler_;  // the sampling rank's
  // Per rank: a rank that computes logits it does not sample (a tensor-parallel rank other
  // than the sampling one) reads back only their argmax; the rows are dropped.
  struct Scratch {
    std::vector<float> logits;  // [rows, n_vocab]
    std::vector<uint8_t> argmax_only;
    std::vector<int32_t> argmax;
  };
  std::vector<Scratch> scratch_;  // [size]

 private:
  // Every rank moves its part of the blocks: out (device -> host slot) or in.
  void swap(std::span<const BlockSwap> swaps, bool out);
};

}  // namespace tessera
