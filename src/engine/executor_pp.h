#pragma once
// The pipeline-parallel executor (docs/design/parallel.md, "Pipeline parallelism"): one step
// of the one scheduler runs through the stages of a ParallelRanks group, each stage a range
// of layers on its own backend and thread with the KV of those layers. The step's batch is
// cut into micro-batches of whole sequences; stage s runs micro-batch m while stage s + 1
// runs m - 1 (the residual stream of each goes on by a send/recv), so the stages overlap
// (GPipe's schedule within a step). The last stage samples (ParallelExecutor): its
// ModelExecutor runs per micro-batch over its layers the head, then grammar masks, sampling,
// verification and log-probabilities of that micro-batch's targets; the outputs are put back
// in the step's order. Every KV operation is applied on every stage, to its layers:
// copy-on-write block copies and swaps (each stage keeps its layers of each of the engine's
// host slots). The block tables are the engine's, shared by all stages. Draft trees (whose
// kept path's KV moves on every layer) are not offered.
#include <vector>

#include "engine/executor_ranks.h"

namespace tessera {

class PipelineParallelExecutor final : public ParallelExecutor {
 public:
  PipelineParallelExecutor(ParallelRanks& ranks, int max_batch_tokens, int max_logits_rows, int n_host_blocks);

  void execute(const StepInput& input, StepOutput& output) override;

  // Micro-batches the last step ran in (for tests and reports).
  int last_micro_batches() const { return last_micro_batches_; }

 private:
  // One micro-batch: sequences [first, last) of the step's batch, its targets renumbered.
  struct Micro {
    ForwardBatch batch;      // with its logits rows (the last stage's)
    ForwardBatch no_logits;  // the same rows for the stages before, which compute no logits
    std::vector<SampleTarget> samples;
    std::vector<PromptLogprobTarget> prompt_logprobs;
    std::vector<size_t> sample_of, prompt_of;  // their indices in the step's targets
    StepOutput out;
  };
  // Cuts the step into at most `parts` micro-batches of whole sequences, about equal in tokens.
  void split(const StepInput& in, int parts);
  // The micro-batches' outputs in the step's order of targets.
  void join(const StepInput& in, StepOutput& out);

  std::vector<Micro> micro_;
  int last_micro_batches_ = 0;
};

}  // namespace tessera
