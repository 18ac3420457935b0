#pragma once
// Drafters that run a model (docs/design/spec-decode.md): "draft_model", any model tessera
// loads with the target's vocabulary, optionally cut to its first layers; and "early_exit",
// the target's own first L layers + final norm + head (a truncated view of the target's
// weights, no copy on the CPU). Both run on the target's backend with their OWN paged KV:
// early exit does not share the target's KV for those layers (that needs the draft to write
// into the target's block tables before the scheduler has planned the step), so it
// recomputes what it drafts over, as a separate small model would.
//
// Per sequence the drafter keeps the tokens its KV holds; each propose() rolls that back to
// the longest prefix shared with the tokens it is given (rejected drafts disappear there),
// feeds what is missing (the prompt on the first call, the verified tokens after that) in
// batched forwards of every query, then one batched decode forward per draft position.
// Greedy requests get argmax tokens (point masses); sampled ones draw from the draft's
// distribution after the request's own processing and return it as q, so verification
// stays exact. When the draft's KV pool is short a sequence simply gets no draft.
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/model_runner.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "model/weights.h"
#include "sample/sampler.h"
#include "spec/drafter.h"
#include "spec/spec_config.h"

namespace tessera {

class Session;

struct ModelDrafterLimits {
  int block_size = 16;
  int n_blocks = 0;          // the draft's KV pool
  int max_batch_tokens = 0;  // tokens per draft forward (catch-up prefill is chunked to it)
  int max_seqs = 0;          // logits rows per draft forward
};

class ModelDrafter final : public Drafter {
 public:
  // weights: the draft's, already cut to the layers it runs; on `backend` (the target's).
  ModelDrafter(std::string name, std::shared_ptr<const ModelWeights> weights, Backend& backend,
               const ModelDrafterLimits& limits);
  ~ModelDrafter() override;
  const char* name() const override { return name_.c_str(); }
  void propose(std::span<const DraftQuery> queries, std::span<Draft> out) override;
  void remove(DraftSeqId seq) override;

  // For tests and reports: sequences with state, and the KV pool.
  size_t n_sequences() const { return states_.size(); }
  int n_free_blocks() const { return pool_.n_free(); }
  int n_blocks() const { return pool_.n_blocks(); }
  int n_layers() const { return weights_->config.n_layer; }

 private:
  struct State {
    SequenceBlocks kv;            // kv.n_tokens == tokens.size()
    std::vector<int32_t> tokens;  // what the draft KV holds
  };
  // One query being drafted this call.
  struct Work {
    size_t query = 0;
    State* state = nullptr;
    std::span<const int32_t> pending;  // tokens still to feed before the first draft row
    int max_tokens = 0;
    std::optional<Sampler> sampler;  // the request's processing; none = raw argmax
    bool greedy = true;              // point masses (no q)
  };
  // Rolls the state back to what it shares with `tokens` and reserves KV for the rest plus
  // the draft; false (state dropped) when the pool is short.
  bool prepare(State& st, std::span<const int32_t> tokens, int max_tokens);
  // Picks the next draft token of `w` from its logits row.
  void choose(Work& w, std::span<float> row, Draft& d);

  std::string name_;
  std::shared_ptr<const ModelWeights> weights_;
  ModelDrafterLimits limits_;
  std::unique_ptr<Model> model_;
  KvCache kv_;
  BlockPool pool_;
  ModelRunner runner_;
  std::unordered_map<DraftSeqId, State> states_;
  ForwardBatch batch_;
  std::vector<float> logits_;  // [rows, n_vocab]
};

// The drafter a model method of `c` names, for the target `target` (its weights, tokenizer,
// backend). Throws naming what is wrong: a model that does not load, a vocabulary that is
// not the target's (size or token text), draft_layers out of range.
std::unique_ptr<ModelDrafter> make_model_drafter(const SpeculativeConfig& c, Session& target,
                                                 const ModelDrafterLimits& limits);

}  // namespace tessera
