#pragma once
// Drafters that run a model (docs/design/spec-decode.md): "draft_model", any model tessera
// loads with the target's vocabulary, optionally cut to its first layers; and "early_exit",
// the target's own first L layers + final norm + head (a truncated view of the target's
// resident weights: nothing copied or uploaded again). Both run on the target's backend.
//
// A draft model has its OWN paged KV. Per sequence it keeps the tokens its KV holds; each
// propose() rolls that back to the longest prefix shared with the tokens it is given
// (rejected drafts disappear there), feeds what is missing (the prompt on the first call, the
// verified tokens after that) in batched forwards of every query.
//
// Early exit runs over the TARGET's cache: its layers 0..L-1 are the target's, so the KV the
// target wrote for the verified tokens is exactly what the draft would compute. Each call
// builds a table per sequence from the target's blocks up to its last full one, then the
// scratch blocks the engine lent from its free pool for this call (a copy of the target's
// partly filled last block, layers < L, then fresh ones) for the positions it drafts at.
// No catch-up forward, no state between calls, no second cache.
//
// Then one batched decode forward per draft position. Greedy requests get argmax tokens
// (point masses); sampled ones draw from the draft's distribution after the request's own
// processing and return it as q, so verification stays exact. When the blocks run short a
// sequence simply gets no draft.
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/model_runner.h"
#include "kv/block_manager.h"  // BlockCopy
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
  int n_blocks = 0;          // the draft's KV pool (its own cache; unused over the target's)
  int max_batch_tokens = 0;  // tokens per draft forward (catch-up prefill is chunked to it)
  int max_seqs = 0;          // logits rows per draft forward
};

class ModelDrafter final : public Drafter {
 public:
  // weights: the draft's, already cut to the layers it runs; on `backend` (the target's).
  // target_kv: run over the target's cache (its first layers are the draft's), else null (a
  // cache of the draft's own).
  ModelDrafter(std::string name, std::shared_ptr<const ModelWeights> weights, Backend& backend,
               const ModelDrafterLimits& limits, KvCache* target_kv = nullptr);
  ~ModelDrafter() override;
  const char* name() const override { return name_.c_str(); }
  void propose(std::span<const DraftQuery> queries, std::span<Draft> out) override;
  void remove(DraftSeqId seq) override;
  bool drafts_over_target_kv() const override { return own_kv_ == nullptr; }

  // For tests and reports: sequences with state, and the own KV pool (empty over the target's).
  size_t n_sequences() const { return states_.size(); }
  int n_free_blocks() const { return pool_.n_free(); }
  int n_blocks() const { return pool_.n_blocks(); }
  int n_layers() const { return weights_->config.n_layer; }

 private:
  struct State {
    SequenceBlocks kv;            // kv.n_tokens == tokens.size() (own cache)
    std::vector<int32_t> tokens;  // what the draft KV holds (own cache)
    SequenceBlocks local;         // over a target cache with a local group: its local table
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
  // Over the target's cache: this call's table for q (target blocks, then its scratch up to
  // the last draft position) and the copy of the target's partly filled block; false when q
  // has no target KV or too little scratch.
  bool borrow(const DraftQuery& q, int max_tokens, State& st, std::vector<BlockCopy>& copies) const;
  // Picks the next draft token of `w` from its logits row.
  void choose(Work& w, std::span<float> row, Draft& d);

  std::string name_;
  std::shared_ptr<const ModelWeights> weights_;
  ModelDrafterLimits limits_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> own_kv_;  // null over the target's cache
  KvCache& kv_;                      // own_kv_ or the target's
  BlockPool pool_;                   // the own cache's blocks (none over the target's)
  ModelRunner runner_;
  std::unordered_map<DraftSeqId, State> states_;
  ForwardBatch batch_;
  std::vector<float> logits_;  // [rows, n_vocab]
};

// The drafter a model method of `c` names, for the target `target` (its weights, tokenizer,
// backend). Throws naming what is wrong: a model that does not load, a vocabulary that is
// not the target's (size or token text), draft_layers out of range.
// target_kv: the target's cache, which early exit then runs over (null: early exit gets a
// cache of its own, as a draft model does; the tests compare the two).
std::unique_ptr<ModelDrafter> make_model_drafter(const SpeculativeConfig& c, Session& target,
                                                 const ModelDrafterLimits& limits, KvCache* target_kv = nullptr);

}  // namespace tessera
