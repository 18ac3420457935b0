#pragma once
// The real executor: swap moves and copy-on-write block copies on the KV storage, one
// forward of the step's variable-length batch, then one Sampler per sequence over its
// logits row, and the log-probabilities requests asked for. Works on any backend: KV moves
// go through the backend's copy ops; grammar token masks are applied to the logits on the
// backend (rows only one target reads); rows that only need an argmax (greedy, no penalties,
// bias or logprobs) are reduced on the backend and only their ids come back. The forward
// itself (input staging, graph padding and replay, logits readback) is the ModelRunner's.
#include <memory>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "core/function_ref.h"
#include "engine/executor.h"
#include "engine/model_runner.h"
#include "grammar/grammar.h"
#include "kv/kv_cache.h"
#include "kv/kv_host_ops.h"
#include "model/model.h"
#include "sample/sampler.h"

namespace tessera {

class ModelExecutor final : public Executor {
 public:
  // model was built for max_batch_tokens tokens and max_logits_rows logits rows per
  // forward (create_model's arguments). kv is the cache the engine's block ids index (on
  // `backend`). n_host_blocks: slots of the host tier for swap preemption (0 = none).
  // pad_block: a KV block the engine never hands out, written by the padding sequences of
  // decode steps the runner pads to a graph size (-1 = never pad); pad_local_block: the same
  // in the local layers' pool of a cache with a local group.
  ModelExecutor(Model& model, KvCache& kv, Backend& backend, int max_batch_tokens, int max_logits_rows,
                int n_host_blocks = 0, int pad_block = -1, int pad_local_block = -1);

  void add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) override;
  void remove_sequence(SeqId seq) override;
  size_t n_sequences() const override { return samplers_.size(); }
  void execute(const StepInput& input, StepOutput& output) override;
  int max_batch_tokens() const override { return max_batch_tokens_; }
  int max_logits_rows() const override { return max_logits_rows_; }
  bool supports_draft_trees() const override;
  int n_host_blocks() const override { return host_ ? host_->n_slots() : 0; }
  void swap_out(std::span<const BlockSwap> swaps) override;
  void swap_in(std::span<const BlockSwap> swaps) override;
  const KvCacheSpec* kv_spec() const override { return &kv_.spec(); }
  std::shared_ptr<HostKvTier> make_staging(int n_blocks) override;
  void export_blocks(std::span<const int32_t> blocks, HostKvTier& staging) override;
  void import_blocks(std::span<const int32_t> blocks, const HostKvTier& staging) override;

 private:
  // Whether row sampling for this target is exactly the argmax of the raw row.
  bool argmax_is_enough(const SampleTarget& t) const;
  // Speculative target: verifies its draft against rows t.row .. t.row + draft.size() and
  // appends the emitted tokens (accepted prefix + replacement or bonus), recording each.
  void verify_draft(const SampleTarget& t, Sampler& sampler, FunctionRef<std::span<float>(int32_t)> row_of,
                    std::vector<int32_t>& tokens);
  // The same for a tree (t.draft_parents); returns the kept path's nodes, in order.
  std::vector<int16_t> verify_draft_tree(const SampleTarget& t, Sampler& sampler,
                                         FunctionRef<std::span<float>(int32_t)> row_of, std::vector<int32_t>& tokens);
  // Queues the KV moves that put a kept tree path where its positions say (none for the main
  // chain): path node d (depth d + 1) from its row's slot to the slot of batch row root + d + 1.
  void plan_path_moves(const ForwardBatch& batch, const SampleTarget& t, std::span<const int16_t> path);

  // Structured output (docs/design/structured-output.md): a constrained sequence's matcher
  // and where the masks of its coming step lie in the step's mask buffer, one per row it
  // samples or verifies against.
  struct Constrained {
    GrammarMatcher matcher;
    size_t slot = 0;      // its first mask in masks_ (the step's targets in order)
    int n_masks = 0;      // rows masked this step (0: the grammar is over, the row is free)
    int n_tentative = 0;  // draft tokens the matcher took ahead of verification
  };
  // Lays out the step's masks (a slot per row of each constrained target) and counts the
  // readers of each logits row; returns whether any target is constrained.
  bool plan_masks(const StepInput& in);
  // Fills the masks of every constrained target, taking each draft token into the matcher as
  // far as the grammar allows (so later rows get their masks); runs beside the forward.
  void prepare_masks(std::span<const SampleTarget> samples);
  void fill_masks(const SampleTarget& t, Constrained& c);  // one target's masks (prepare_masks' unit)
  std::span<int32_t> mask_at(size_t slot) {
    return {static_cast<int32_t*>(masks_.get()) + slot * mask_words_, static_cast<size_t>(mask_words_)};
  }
  // The backend masks a row in place before the readback when the row is this target's alone
  // (no other choice samples it, no prompt logprobs read it raw).
  bool masks_on_device(const SampleTarget& t) const;
  // The filled masks' logits rows for the backend (-1: left to the host), after prepare_masks.
  ModelRunner::TokenMasks device_masks(std::span<const SampleTarget> samples);
  // Masks on the host the rows t.row .. t.row + n_masks - 1 of a constrained target the
  // backend did not mask (nothing for a free one).
  void mask_rows(const SampleTarget& t, FunctionRef<std::span<float>(int32_t)> row_of);
  // After the step's tokens for a constrained target: drops the rejected draft tokens from the
  // matcher and takes the rest.
  void advance_grammar(const SampleTarget& t, std::span<const int32_t> emitted);

  KvCache& kv_;
  Backend& backend_;
  ModelRunner runner_;
  std::vector<uint8_t> argmax_only_;  // [rows] readback plan
  std::vector<int32_t> argmax_;       // [rows] ids of argmax-only rows (-1: row copied, use the sampler)
  int32_t n_vocab_;
  int max_batch_tokens_;
  int max_logits_rows_;
  std::unique_ptr<HostKvTier> host_;
  std::unordered_map<SeqId, Sampler> samplers_;
  std::unordered_map<SeqId, Constrained> constrained_;
  int32_t mask_words_;
  bool windowed_;                         // the model has sliding-window layers
  std::shared_ptr<void> masks_;           // [mask slots, mask words] from backend.alloc_host() (pinned on a device)
  size_t mask_slots_ = 0;                 // capacity of masks_
  size_t step_slots_ = 0;                 // slots of this step
  std::vector<int32_t> mask_rows_;        // [step slots] the backend's rows (-1: host or unused)
  std::vector<uint8_t> row_readers_;      // [rows] targets reading each logits row (capped at 2)
  std::vector<float> logits_;             // [rows, n_vocab]
  std::vector<float> row_;                // [n_vocab] a row sampled by several sequences
  std::vector<TokenProb> target_dist_;    // verification: p_j of the position being checked
  std::vector<KvTokenMove> token_moves_;  // the step's kept tree paths (move_kv_tokens)
  std::vector<float> raw_rows_;           // [draft + 1, n_vocab] verification rows before processing (logprobs)
};

}  // namespace tessera
