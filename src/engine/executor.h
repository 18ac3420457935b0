#pragma once
// The executor runs one step for the engine: KV moves to and from the host tier (swap
// preemption), block copies (copy-on-write), one variable-length forward, sampling and
// log-probabilities. Two implementations: ModelExecutor (a real model on a backend,
// executor_model.h) and SimulatedExecutor (a cost model, simulator.h).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kv/block_manager.h"
#include "kv/kv_host_ops.h"
#include "model/model.h"
#include "sample/sampler.h"  // Logprobs
#include "sample/sampling_params.h"
#include "sched/sequence.h"

namespace tessera {

// Sample the logits row `row` (an index into batch.logits_rows) for sequence `seq`. Several
// targets may name the same row (the n choices of a request fork from its last prompt row).
struct SampleTarget {
  int32_t row = 0;
  SeqId seq = 0;
  bool logprobs = false;  // also report the token's logprob and the sequence's n_logprobs alternatives
  // Speculative verification (src/spec/verify.h): rows row .. row + draft.size() are the
  // target's logits after the sequence's last token and after each draft token; draft
  // token j is checked against row + j, and the row after the last kept one gives the
  // replacement or the bonus token. draft_probs: the drafter's q per token, or empty for
  // point masses (n-gram). Never on a row shared by several targets. With logprobs, one
  // Logprobs per emitted token (from the row it was checked or drawn against).
  std::span<const int32_t> draft = {};
  std::span<const std::vector<TokenProb>> draft_probs = {};
  // A tree of point-mass candidates (Draft::parents; empty: a chain): row row + 1 + j holds
  // the logits after node j. The kept path's KV is moved to its slots (the batch's rows
  // row .. row + path length) before execute() returns. Only where supports_draft_trees().
  std::span<const int16_t> draft_parents = {};
};

// The logprob of `token` under logits row `row`, with the n_top most likely alternatives
// (raw distribution): one prompt token of a prompt-logprob request.
struct PromptLogprobTarget {
  int32_t row = 0;
  int32_t token = 0;
  int32_t n_top = 0;
};

struct StepInput {
  const ForwardBatch& batch;
  std::span<const BlockCopy> copies;  // done before the forward, in order
  std::span<const SampleTarget> samples;
  std::span<const PromptLogprobTarget> prompt_logprobs = {};
};

struct StepOutput {
  // Per sample target, in order: counts[i] tokens (1 + its accepted draft tokens), flat.
  std::vector<int32_t> tokens;
  std::vector<int32_t> counts;
  std::vector<Logprobs> logprobs;         // per sample target with logprobs, one per emitted token, in order
  std::vector<Logprobs> prompt_logprobs;  // one per prompt target, in order
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Per-sequence sampling state, created when a choice is admitted and kept across
  // preemptions (so a resumed sequence continues its random stream), dropped when it ends.
  virtual void add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) = 0;
  virtual void remove_sequence(SeqId seq) = 0;
  virtual size_t n_sequences() const = 0;
  // Runs the step; fills `output` (cleared first).
  virtual void execute(const StepInput& input, StepOutput& output) = 0;
  // The largest batch one forward takes (tokens, and logits rows).
  virtual int max_batch_tokens() const = 0;
  virtual int max_logits_rows() const = 0;
  // Whether a sample target may carry a draft tree (its backend masks attention by tree and
  // its KV format moves single tokens).
  virtual bool supports_draft_trees() const { return false; }

  // Swap preemption. The host tier's slots (0 = the executor cannot swap); the engine calls
  // swap_out then swap_in, each with its step's moves in order, before execute(). A move
  // out copies device block -> host slot, a move in host slot -> device block, on every
  // layer of K and V. The CPU backend memcpys; a device backend copies across the bus.
  virtual int n_host_blocks() const { return 0; }
  virtual void swap_out(std::span<const BlockSwap> swaps);
  virtual void swap_in(std::span<const BlockSwap> swaps);

  // Disaggregation (engine/kv_transfer.h): the cache's layout, or null when this executor
  // cannot move blocks in and out; host staging for n blocks (HostKvTier slots, page-locked
  // on a device backend); copies of full-pool blocks[i] to staging slot i and back, done
  // before this returns. The defaults refuse, saying kv_transfer_refusal().
  virtual const KvCacheSpec* kv_spec() const { return nullptr; }
  // Why kv_spec() is null: what a refused transfer request is told.
  virtual std::string kv_transfer_refusal() const { return "this engine cannot move KV blocks between engines"; }
  virtual std::shared_ptr<HostKvTier> make_staging(int n_blocks);
  virtual void export_blocks(std::span<const int32_t> blocks, HostKvTier& staging);
  virtual void import_blocks(std::span<const int32_t> blocks, const HostKvTier& staging);
};

}  // namespace tessera
