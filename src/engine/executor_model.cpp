#include "engine/executor_model.h"

#include <algorithm>

#include "core/error.h"
#include "kv/kv_host_ops.h"

namespace tessera {

ModelExecutor::ModelExecutor(Model& model, KvCache& kv, Backend& backend, int max_batch_tokens, int max_logits_rows)
    : model_(model),
      kv_(kv),
      n_vocab_(model.config().n_vocab),
      max_batch_tokens_(std::min(max_batch_tokens, model.max_batch_tokens())),
      max_logits_rows_(max_logits_rows) {
  TESSERA_CHECK(backend.name() == "cpu", "the serving engine's block copies need KV in host memory (CPU backend), not ",
                backend.name());
  TESSERA_CHECK(max_logits_rows >= 1, "executor: max_logits_rows ", max_logits_rows);
}

void ModelExecutor::add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) {
  const auto [it, added] = samplers_.try_emplace(seq, params, n_vocab_, prompt);
  TESSERA_CHECK(added, "executor: sequence ", seq, " added twice");
}

void ModelExecutor::remove_sequence(SeqId seq) {
  TESSERA_CHECK(samplers_.erase(seq) == 1, "executor: removing unknown sequence ", seq);
}

void ModelExecutor::execute(const StepInput& in, std::vector<int32_t>& tokens) {
  const ForwardBatch& b = in.batch;
  const size_t rows = b.logits_rows.size();
  TESSERA_CHECK(b.n_tokens() <= max_batch_tokens_ && static_cast<int>(rows) <= max_logits_rows_, "executor: batch of ",
                b.n_tokens(), " tokens and ", rows, " logits rows exceeds ", max_batch_tokens_, " and ",
                max_logits_rows_);
  if (!in.copies.empty()) copy_kv_blocks_host(kv_, in.copies);
  logits_.resize(rows * n_vocab_);
  model_.forward(b, kv_, logits_.data());
  tokens.resize(in.samples.size());
  for (size_t i = 0; i < in.samples.size(); ++i) {
    const SampleTarget& t = in.samples[i];
    TESSERA_CHECK(t.row >= 0 && static_cast<size_t>(t.row) < rows, "executor: sample row ", t.row, " of ", rows);
    const auto it = samplers_.find(t.seq);
    TESSERA_CHECK(it != samplers_.end(), "executor: sampling unknown sequence ", t.seq);
    std::span<float> row(logits_.data() + static_cast<size_t>(t.row) * n_vocab_, n_vocab_);
    // sample() edits the row (bias, penalties): a row shared by several choices is copied.
    const bool shared = (i > 0 && in.samples[i - 1].row == t.row) ||
                        (i + 1 < in.samples.size() && in.samples[i + 1].row == t.row);
    if (shared) {
      row_.assign(row.begin(), row.end());
      row = row_;
    }
    tokens[i] = it->second.sample(row);
    it->second.accept(tokens[i]);
  }
}

}  // namespace tessera
