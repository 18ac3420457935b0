#include "engine/executor_model.h"

#include <algorithm>

#include "core/error.h"
#include "kv/kv_host_ops.h"
#include "spec/verify.h"

namespace tessera {

ModelExecutor::ModelExecutor(Model& model, KvCache& kv, Backend& backend, int max_batch_tokens, int max_logits_rows,
                             int n_host_blocks, int pad_block)
    : kv_(kv),
      runner_(model, kv, backend, pad_block),
      n_vocab_(model.config().n_vocab),
      max_batch_tokens_(std::min(max_batch_tokens, model.max_batch_tokens())),
      max_logits_rows_(max_logits_rows) {
  TESSERA_CHECK(max_logits_rows >= 1, "executor: max_logits_rows ", max_logits_rows);
  if (n_host_blocks > 0) host_ = std::make_unique<HostKvTier>(kv.spec(), n_host_blocks, backend);
}

void ModelExecutor::swap_out(std::span<const BlockSwap> swaps) {
  if (swaps.empty()) return;
  TESSERA_CHECK(host_ != nullptr, "executor: swap-out without a host KV tier");
  swap_out_kv_blocks(kv_, *host_, swaps);
}

void ModelExecutor::swap_in(std::span<const BlockSwap> swaps) {
  if (swaps.empty()) return;
  TESSERA_CHECK(host_ != nullptr, "executor: swap-in without a host KV tier");
  swap_in_kv_blocks(kv_, *host_, swaps);
}

void ModelExecutor::add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) {
  const auto [it, added] = samplers_.try_emplace(seq, params, n_vocab_, prompt);
  TESSERA_CHECK(added, "executor: sequence ", seq, " added twice");
}

void ModelExecutor::remove_sequence(SeqId seq) {
  TESSERA_CHECK(samplers_.erase(seq) == 1, "executor: removing unknown sequence ", seq);
}

bool ModelExecutor::argmax_is_enough(const SampleTarget& t) const {
  if (t.logprobs) return false;
  const auto it = samplers_.find(t.seq);
  if (it == samplers_.end()) return false;  // reported below
  const SamplingParams& p = it->second.params();
  return p.greedy() && p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f &&
         p.logit_bias.empty();
}

void ModelExecutor::execute(const StepInput& in, StepOutput& out) {
  const size_t real_rows = in.batch.logits_rows.size();
  TESSERA_CHECK(in.batch.n_tokens() <= max_batch_tokens_ && static_cast<int>(real_rows) <= max_logits_rows_,
                "executor: batch of ", in.batch.n_tokens(), " tokens and ", real_rows, " logits rows exceeds ",
                max_batch_tokens_, " and ", max_logits_rows_);
  if (!in.copies.empty()) copy_kv_blocks(kv_, in.copies);
  const size_t rows = real_rows;
  // Readback plan: a row is copied in full only when someone needs more than its argmax.
  argmax_only_.assign(rows, 1);
  argmax_.assign(rows, -1);
  for (const SampleTarget& t : in.samples)
    for (size_t j = 0; j <= t.draft.size(); ++j)
      if (t.row >= 0 && t.row + j < rows && !argmax_is_enough(t)) argmax_only_[t.row + j] = 0;
  for (const PromptLogprobTarget& t : in.prompt_logprobs)
    if (t.row >= 0 && static_cast<size_t>(t.row) < rows) argmax_only_[t.row] = 0;
  logits_.resize(rows * n_vocab_);
  runner_.forward(in.batch, logits_.data(), {argmax_only_.data(), argmax_.data()});
  const auto row_of = [&](int32_t row) {
    TESSERA_CHECK(row >= 0 && static_cast<size_t>(row) < real_rows, "executor: logits row ", row, " of ", real_rows);
    return std::span<float>(logits_.data() + static_cast<size_t>(row) * n_vocab_, n_vocab_);
  };
  // Prompt logprobs first: sampling below edits rows in place.
  out.prompt_logprobs.clear();
  for (const PromptLogprobTarget& t : in.prompt_logprobs)
    out.prompt_logprobs.push_back(compute_logprobs(row_of(t.row), t.token, t.n_top));
  out.logprobs.clear();
  out.counts.assign(in.samples.size(), 1);
  std::vector<int32_t>& tokens = out.tokens;
  tokens.clear();
  tokens.reserve(in.samples.size());
  for (size_t i = 0; i < in.samples.size(); ++i) {
    const SampleTarget& t = in.samples[i];
    const auto it = samplers_.find(t.seq);
    TESSERA_CHECK(it != samplers_.end(), "executor: sampling unknown sequence ", t.seq);
    if (!t.draft.empty()) {
      // Logprobs are of the raw rows, which verification edits (bias, penalties): keep them.
      const size_t n_rows = t.draft.size() + 1;
      if (t.logprobs) {
        raw_rows_.resize(n_rows * n_vocab_);
        for (size_t j = 0; j < n_rows; ++j) {
          const std::span<float> r = row_of(t.row + static_cast<int32_t>(j));
          std::copy(r.begin(), r.end(), raw_rows_.begin() + static_cast<ptrdiff_t>(j * n_vocab_));
        }
      }
      const size_t before = tokens.size();
      verify_draft(t, it->second, row_of, tokens);
      out.counts[i] = static_cast<int32_t>(tokens.size() - before);
      if (t.logprobs) {
        // Emitted token j was kept against, or drawn from, row j.
        for (size_t j = 0; j < tokens.size() - before; ++j)
          out.logprobs.push_back(
              compute_logprobs(std::span<const float>(raw_rows_.data() + j * n_vocab_, static_cast<size_t>(n_vocab_)),
                               tokens[before + j], it->second.params().n_logprobs));
      }
      continue;
    }
    std::span<float> row = row_of(t.row);
    if (argmax_only_[t.row] && argmax_[t.row] >= 0) {
      // The sampler would take the argmax of this unmodified row (and draw no randomness).
      tokens.push_back(argmax_[t.row]);
      it->second.accept(tokens.back());
      continue;
    }
    // sample() edits the row (bias, penalties): a row shared by several choices is copied.
    const bool shared =
        (i > 0 && in.samples[i - 1].row == t.row) || (i + 1 < in.samples.size() && in.samples[i + 1].row == t.row);
    if (shared) {
      row_.assign(row.begin(), row.end());
      row = row_;
    }
    if (t.logprobs) {
      SampleResult r = it->second.sample_with_logprobs(row);
      tokens.push_back(r.token);
      out.logprobs.push_back(std::move(r.logprobs));
    } else {
      tokens.push_back(it->second.sample(row));
    }
    it->second.accept(tokens.back());
  }
}

void ModelExecutor::verify_draft(const SampleTarget& t, Sampler& sampler, FunctionRef<std::span<float>(int32_t)> row_of,
                                 std::vector<int32_t>& tokens) {
  const size_t n = t.draft.size();
  if (argmax_is_enough(t) && argmax_[t.row] >= 0) {
    // Greedy without processors: p_j is a point mass at the row's argmax, so a draft token
    // is kept iff it is that argmax, and the first other argmax replaces it.
    for (size_t j = 0; j <= n; ++j) {
      const int32_t best = argmax_[t.row + j];
      TESSERA_CHECK(best >= 0, "executor: argmax of verification row ", t.row + j, " missing");
      tokens.push_back(best);
      sampler.accept(best);
      if (j == n || best != t.draft[j]) return;
    }
  }
  const auto target = [&](size_t j) -> std::span<const TokenProb> {
    target_dist_ = sampler.distribution(row_of(t.row + static_cast<int32_t>(j)));
    return target_dist_;
  };
  const auto on_accept = [&](size_t j) { sampler.accept(t.draft[j]); };
  const auto uniform = [&] { return sampler.uniform(); };
  const ChainVerdict v = verify_chain(t.draft, t.draft_probs, target, on_accept, uniform);
  tokens.insert(tokens.end(), v.tokens.begin(), v.tokens.end());
  if (v.n_accepted == n) {
    // Every draft token kept: the bonus token, sampled from p_n as a plain step would.
    const int32_t bonus = sampler.sample(row_of(t.row + static_cast<int32_t>(n)));
    tokens.push_back(bonus);
    sampler.accept(bonus);
  } else {
    sampler.accept(v.tokens.back());  // the replacement drawn at the first rejection
  }
}

}  // namespace tessera
