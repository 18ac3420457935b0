#pragma once
// The real executor: copy-on-write block copies on the KV storage, one forward of the
// step's variable-length batch, then one Sampler per sequence over its logits row.
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "engine/executor.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "sample/sampler.h"

namespace tessera {

class ModelExecutor final : public Executor {
 public:
  // model was built for max_batch_tokens tokens and max_logits_rows logits rows per
  // forward (create_model's arguments). kv is the cache the engine's block ids index; the
  // backend must keep it in host memory (CPU), where block copies are memcpy.
  ModelExecutor(Model& model, KvCache& kv, Backend& backend, int max_batch_tokens, int max_logits_rows);

  void add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) override;
  void remove_sequence(SeqId seq) override;
  size_t n_sequences() const override { return samplers_.size(); }
  void execute(const StepInput& input, std::vector<int32_t>& tokens) override;
  int max_batch_tokens() const override { return max_batch_tokens_; }
  int max_logits_rows() const override { return max_logits_rows_; }

 private:
  Model& model_;
  KvCache& kv_;
  int32_t n_vocab_;
  int max_batch_tokens_;
  int max_logits_rows_;
  std::unordered_map<SeqId, Sampler> samplers_;
  std::vector<float> logits_;  // [rows, n_vocab]
  std::vector<float> row_;     // [n_vocab] a row sampled by several sequences
};

}  // namespace tessera
