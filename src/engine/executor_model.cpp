#include "engine/executor_model.h"

#include <algorithm>

#include "core/error.h"
#include "kv/kv_host_ops.h"

namespace tessera {

ModelExecutor::ModelExecutor(Model& model, KvCache& kv, Backend& backend, int max_batch_tokens, int max_logits_rows,
                             int n_host_blocks)
    : model_(model),
      kv_(kv),
      n_vocab_(model.config().n_vocab),
      max_batch_tokens_(std::min(max_batch_tokens, model.max_batch_tokens())),
      max_logits_rows_(max_logits_rows) {
  TESSERA_CHECK(backend.name() == "cpu", "the serving engine's block copies need KV in host memory (CPU backend), not ",
                backend.name());
  TESSERA_CHECK(max_logits_rows >= 1, "executor: max_logits_rows ", max_logits_rows);
  if (n_host_blocks > 0) host_ = std::make_unique<HostKvTier>(kv.spec(), n_host_blocks);
}

void ModelExecutor::swap_out(std::span<const BlockSwap> swaps) {
  if (swaps.empty()) return;
  TESSERA_CHECK(host_ != nullptr, "executor: swap-out without a host KV tier");
  swap_out_kv_blocks_host(kv_, *host_, swaps);
}

void ModelExecutor::swap_in(std::span<const BlockSwap> swaps) {
  if (swaps.empty()) return;
  TESSERA_CHECK(host_ != nullptr, "executor: swap-in without a host KV tier");
  swap_in_kv_blocks_host(kv_, *host_, swaps);
}

void ModelExecutor::add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) {
  const auto [it, added] = samplers_.try_emplace(seq, params, n_vocab_, prompt);
  TESSERA_CHECK(added, "executor: sequence ", seq, " added twice");
}

void ModelExecutor::remove_sequence(SeqId seq) {
  TESSERA_CHECK(samplers_.erase(seq) == 1, "executor: removing unknown sequence ", seq);
}

void ModelExecutor::execute(const StepInput& in, StepOutput& out) {
  const ForwardBatch& b = in.batch;
  const size_t rows = b.logits_rows.size();
  TESSERA_CHECK(b.n_tokens() <= max_batch_tokens_ && static_cast<int>(rows) <= max_logits_rows_, "executor: batch of ",
                b.n_tokens(), " tokens and ", rows, " logits rows exceeds ", max_batch_tokens_, " and ",
                max_logits_rows_);
  if (!in.copies.empty()) copy_kv_blocks_host(kv_, in.copies);
  logits_.resize(rows * n_vocab_);
  model_.forward(b, kv_, logits_.data());
  const auto row_of = [&](int32_t row) {
    TESSERA_CHECK(row >= 0 && static_cast<size_t>(row) < rows, "executor: logits row ", row, " of ", rows);
    return std::span<float>(logits_.data() + static_cast<size_t>(row) * n_vocab_, n_vocab_);
  };
  // Prompt logprobs first: sampling below edits rows in place.
  out.prompt_logprobs.clear();
  for (const PromptLogprobTarget& t : in.prompt_logprobs)
    out.prompt_logprobs.push_back(compute_logprobs(row_of(t.row), t.token, t.n_top));
  out.logprobs.clear();
  std::vector<int32_t>& tokens = out.tokens;
  tokens.resize(in.samples.size());
  for (size_t i = 0; i < in.samples.size(); ++i) {
    const SampleTarget& t = in.samples[i];
    const auto it = samplers_.find(t.seq);
    TESSERA_CHECK(it != samplers_.end(), "executor: sampling unknown sequence ", t.seq);
    std::span<float> row = row_of(t.row);
    // sample() edits the row (bias, penalties): a row shared by several choices is copied.
    const bool shared = (i > 0 && in.samples[i - 1].row == t.row) ||
                        (i + 1 < in.samples.size() && in.samples[i + 1].row == t.row);
    if (shared) {
      row_.assign(row.begin(), row.end());
      row = row_;
    }
    if (t.logprobs) {
      SampleResult r = it->second.sample_with_logprobs(row);
      tokens[i] = r.token;
      out.logprobs.push_back(std::move(r.logprobs));
    } else {
      tokens[i] = it->second.sample(row);
    }
    it->second.accept(tokens[i]);
  }
}

}  // namespace tessera
