#pragma once
// The executor runs one step for the engine: block copies (copy-on-write), one
// variable-length forward, and sampling. Two implementations: ModelExecutor (a real model on
// a backend, executor_model.h) and SimulatedExecutor (a cost model, simulator.h).
#include <cstdint>
#include <span>
#include <vector>

#include "kv/block_manager.h"
#include "model/model.h"
#include "sample/sampling_params.h"
#include "sched/sequence.h"

namespace tessera {

// Sample the logits row `row` (an index into batch.logits_rows) for sequence `seq`. Several
// targets may name the same row (the n choices of a request fork from its last prompt row).
struct SampleTarget {
  int32_t row = 0;
  SeqId seq = 0;
};

struct StepInput {
  const ForwardBatch& batch;
  std::span<const BlockCopy> copies;    // done before the forward, in order
  std::span<const SampleTarget> samples;
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Per-sequence sampling state, created when a choice is admitted and kept across
  // preemptions (so a resumed sequence continues its random stream), dropped when it ends.
  virtual void add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) = 0;
  virtual void remove_sequence(SeqId seq) = 0;
  virtual size_t n_sequences() const = 0;
  // Runs the step; writes one token per sample target into `tokens` (resized).
  virtual void execute(const StepInput& input, std::vector<int32_t>& tokens) = 0;
  // The largest batch one forward takes (tokens, and logits rows).
  virtual int max_batch_tokens() const = 0;
  virtual int max_logits_rows() const = 0;
};

}  // namespace tessera
