#include "engine/executor_model.h"

#include <algorithm>
#include <future>

#include "core/token_bitmask.h"
#include "core/draft_tree.h"
#include "core/error.h"
#include "kv/kv_host_ops.h"
#include "spec/verify.h"

namespace tessera {

ModelExecutor::ModelExecutor(Model& model, KvCache& kv, Backend& backend, int max_batch_tokens, int max_logits_rows,
                             int n_host_blocks, int pad_block, int pad_local_block)
    : kv_(kv),
      backend_(backend),
      runner_(model, kv, backend, pad_block, pad_local_block),
      n_vocab_(model.config().n_vocab),
      max_batch_tokens_(std::min(max_batch_tokens, model.max_batch_tokens())),
      max_logits_rows_(max_logits_rows),
      windowed_(model.config().sliding_window > 0) {
  mask_words_ = token_bitmask_words(n_vocab_);
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

namespace {
// Block i of the sequence <-> staging slot i: the swap path's moves (a block self-contained).
std::vector<BlockSwap> staging_moves(std::span<const int32_t> blocks, int n_slots) {
  TESSERA_CHECK(static_cast<int>(blocks.size()) <= n_slots, "executor: ", blocks.size(),
                " KV blocks to transfer through a staging of ", n_slots, " slots");
  std::vector<BlockSwap> moves;
  moves.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) moves.push_back({blocks[i], static_cast<int32_t>(i), false});
  return moves;
}
}  // namespace

std::shared_ptr<HostKvTier> ModelExecutor::make_staging(int n_blocks) {
  return std::make_shared<HostKvTier>(kv_.spec(), n_blocks, backend_);
}

void ModelExecutor::export_blocks(std::span<const int32_t> blocks, HostKvTier& staging) {
  swap_out_kv_blocks(kv_, staging, staging_moves(blocks, staging.n_slots()));
}

void ModelExecutor::import_blocks(std::span<const int32_t> blocks, const HostKvTier& staging) {
  swap_in_kv_blocks(kv_, staging, staging_moves(blocks, staging.n_slots()));
}

void ModelExecutor::add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) {
  if (params.grammar)
    TESSERA_CHECK(params.grammar->vocab_size() == n_vocab_, "executor: a grammar compiled for ",
                  params.grammar->vocab_size(), " tokens, the model has ", n_vocab_);
  const auto [it, added] = samplers_.try_emplace(seq, params, n_vocab_, prompt);
  TESSERA_CHECK(added, "executor: sequence ", seq, " added twice");
  // Each choice starts the grammar at its beginning: the choices of a request fork right
  // after the prompt, where every matcher is in the initial state.
  if (params.grammar) constrained_.emplace(seq, Constrained{GrammarMatcher(params.grammar), 0, 0, 0});
}

void ModelExecutor::remove_sequence(SeqId seq) {
  TESSERA_CHECK(samplers_.erase(seq) == 1, "executor: removing unknown sequence ", seq);
  constrained_.erase(seq);
}

bool ModelExecutor::plan_masks(const StepInput& in) {
  const size_t rows = in.batch.logits_rows.size();
  row_readers_.assign(rows, 0);
  const auto read = [&](int64_t r) {
    if (r >= 0 && static_cast<size_t>(r) < rows) row_readers_[r] = std::min<uint8_t>(row_readers_[r] + 1, 2);
  };
  for (const SampleTarget& t : in.samples)
    for (size_t j = 0; j <= t.draft.size(); ++j) read(static_cast<int64_t>(t.row) + static_cast<int64_t>(j));
  for (const PromptLogprobTarget& t : in.prompt_logprobs) read(t.row);
  step_slots_ = 0;
  if (constrained_.empty()) return false;
  for (const SampleTarget& t : in.samples)
    if (const auto it = constrained_.find(t.seq); it != constrained_.end()) {
      it->second.slot = step_slots_;
      step_slots_ += t.draft.size() + 1;
    }
  if (step_slots_ > mask_slots_) {
    // Grown between steps only: the last step's upload was read before its readback returned.
    mask_slots_ = std::max(step_slots_, 2 * mask_slots_);
    masks_ = backend_.alloc_host(mask_slots_ * static_cast<size_t>(mask_words_) * sizeof(int32_t));
  }
  return step_slots_ > 0;
}

void ModelExecutor::fill_masks(const SampleTarget& t, Constrained& c) {
  c.n_masks = 0;
  c.n_tentative = 0;
  if (c.matcher.terminated()) return;  // ignore_eos past the grammar's end: free text
  const size_t n = t.draft.size();
  for (size_t j = 0; j <= n; ++j) {
    const std::span<int32_t> mask = mask_at(c.slot + j);
    c.matcher.fill_next_token_bitmask(mask);
    ++c.n_masks;
    // A draft token the grammar forbids has probability 0 under its mask: verification
    // rejects it there and never looks at the rows after it.
    if (j == n || !token_bitmask_allows(mask, t.draft[j]) || !c.matcher.accept(t.draft[j])) break;
    ++c.n_tentative;
  }
}

void ModelExecutor::prepare_masks(std::span<const SampleTarget> samples) {
  for (const SampleTarget& t : samples)
    if (const auto it = constrained_.find(t.seq); it != constrained_.end()) fill_masks(t, it->second);
}

bool ModelExecutor::masks_on_device(const SampleTarget& t) const {
  for (size_t j = 0; j <= t.draft.size(); ++j) {
    const int64_t r = static_cast<int64_t>(t.row) + static_cast<int64_t>(j);
    if (r < 0 || static_cast<size_t>(r) >= row_readers_.size() || row_readers_[r] != 1) return false;
  }
  return true;
}

ModelRunner::TokenMasks ModelExecutor::device_masks(std::span<const SampleTarget> samples) {
  mask_rows_.assign(step_slots_, -1);
  for (const SampleTarget& t : samples) {
    const auto it = constrained_.find(t.seq);
    if (it == constrained_.end() || !masks_on_device(t)) continue;
    for (int j = 0; j < it->second.n_masks; ++j) mask_rows_[it->second.slot + j] = t.row + j;
  }
  return {mask_rows_, static_cast<const int32_t*>(masks_.get()), mask_words_};
}

void ModelExecutor::mask_rows(const SampleTarget& t, FunctionRef<std::span<float>(int32_t)> row_of) {
  const auto it = constrained_.find(t.seq);
  if (it == constrained_.end()) return;
  const Constrained& c = it->second;
  for (int j = 0; j < c.n_masks; ++j)
    if (mask_rows_[c.slot + j] < 0) apply_token_bitmask(row_of(t.row + j), mask_at(c.slot + j));
}

void ModelExecutor::advance_grammar(const SampleTarget& t, std::span<const int32_t> emitted) {
  const auto it = constrained_.find(t.seq);
  if (it == constrained_.end()) return;
  Constrained& c = it->second;
  if (c.n_masks == 0) return;
  // The emitted tokens are the kept draft prefix, then one replacement or bonus token; the
  // matcher already holds the first n_tentative draft tokens.
  const int kept = std::min(c.n_tentative, static_cast<int>(emitted.size()) - 1);
  for (int j = 0; j < kept; ++j)
    TESSERA_CHECK(emitted[j] == t.draft[j], "executor: emitted token ", j, " is not the kept draft token");
  c.matcher.rollback(c.n_tentative - kept);
  for (size_t j = static_cast<size_t>(kept); j < emitted.size(); ++j)
    TESSERA_CHECK(c.matcher.accept(emitted[j]), "executor: sequence ", t.seq, " sampled token ", emitted[j],
                  " which its grammar forbids");
  c.n_masks = 0;
  c.n_tentative = 0;
}

bool ModelExecutor::argmax_is_enough(const SampleTarget& t) const {
  if (t.logprobs) return false;
  const auto it = samplers_.find(t.seq);
  if (it == samplers_.end()) return false;  // reported below
  const SamplingParams& p = it->second.params();
  // A grammar's masks applied on the backend come before its argmax.
  return (!p.grammar || masks_on_device(t)) && p.greedy() && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && p.logit_bias.empty();
}

void ModelExecutor::execute(const StepInput& in, StepOutput& out) {
  const size_t real_rows = in.batch.logits_rows.size();
  TESSERA_CHECK(in.batch.n_tokens() <= max_batch_tokens_ && static_cast<int>(real_rows) <= max_logits_rows_,
                "executor: batch of ", in.batch.n_tokens(), " tokens and ", real_rows, " logits rows exceeds ",
                max_batch_tokens_, " and ", max_logits_rows_);
  if (!in.copies.empty()) copy_kv_blocks(kv_, in.copies);
  const size_t rows = real_rows;
  const bool any_constrained = plan_masks(in);  // before the readback plan: it reads row_readers_
  // Readback plan: a row is copied in full only when someone needs more than its argmax.
  argmax_only_.assign(rows, 1);
  argmax_.assign(rows, -1);
  for (const SampleTarget& t : in.samples)
    for (size_t j = 0; j <= t.draft.size(); ++j)
      if (t.row >= 0 && t.row + j < rows && !argmax_is_enough(t)) argmax_only_[t.row + j] = 0;
  for (const PromptLogprobTarget& t : in.prompt_logprobs)
    if (t.row >= 0 && static_cast<size_t>(t.row) < rows) argmax_only_[t.row] = 0;
  logits_.resize(rows * n_vocab_);
  // The constrained targets' masks are computed on another thread while the forward runs, so
  // a step pays for them only where they take longer than the forward; the backend then
  // applies them to the logits before the readback.
  std::future<void> masks;
  if (any_constrained) masks = std::async(std::launch::async, [&] { prepare_masks(in.samples); });
  runner_.forward(in.batch, logits_.data(), {argmax_only_.data(), argmax_.data()}, [&] {
    if (!masks.valid()) return ModelRunner::TokenMasks{};
    masks.get();
    return device_masks(in.samples);
  });
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
  token_moves_.clear();
  std::vector<int32_t>& tokens = out.tokens;
  tokens.clear();
  tokens.reserve(in.samples.size());
  for (size_t i = 0; i < in.samples.size(); ++i) {
    const SampleTarget& t = in.samples[i];
    const auto it = samplers_.find(t.seq);
    TESSERA_CHECK(it != samplers_.end(), "executor: sampling unknown sequence ", t.seq);
    if (!t.draft.empty()) {
      mask_rows(t, row_of);
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
      if (!t.draft_parents.empty()) {
        TESSERA_CHECK(!t.logprobs && !constrained_.count(t.seq) && t.draft_probs.empty(), "executor: sequence ", t.seq,
                      " verifies a draft tree with logprobs, a grammar or drafter probabilities");
        plan_path_moves(in.batch, t, verify_draft_tree(t, it->second, row_of, tokens));
      } else {
        verify_draft(t, it->second, row_of, tokens);
      }
      out.counts[i] = static_cast<int32_t>(tokens.size() - before);
      advance_grammar(t, std::span<const int32_t>(tokens).subspan(before));
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
      // The sampler would take the argmax of this row (masked on the backend, otherwise
      // unmodified) and draw no randomness.
      tokens.push_back(argmax_[t.row]);
      it->second.accept(tokens.back());
      advance_grammar(t, std::span<const int32_t>(tokens).last(1));
      continue;
    }
    // sample() edits the row (bias, penalties): a row shared by several choices is copied.
    const bool shared =
        (i > 0 && in.samples[i - 1].row == t.row) || (i + 1 < in.samples.size() && in.samples[i + 1].row == t.row);
    if (shared) {
      row_.assign(row.begin(), row.end());
      row = row_;
    }
    mask_rows(t, [&](int32_t) { return row; });
    if (t.logprobs) {
      SampleResult r = it->second.sample_with_logprobs(row);
      tokens.push_back(r.token);
      out.logprobs.push_back(std::move(r.logprobs));
    } else {
      tokens.push_back(it->second.sample(row));
    }
    it->second.accept(tokens.back());
    advance_grammar(t, std::span<const int32_t>(tokens).last(1));
  }
  // The kept tree paths' KV, before the next step's forward reads or overwrites it.
  if (!token_moves_.empty()) move_kv_tokens(kv_, token_moves_);
}

bool ModelExecutor::supports_draft_trees() const {
  const KvCacheSpec& spec = kv_.spec();
  // Position-aware key centering codes a key by its slot's position: a tree node's key
  // would be coded for a slot it leaves. Windows bound a row's keys by its slot's position
  // too, while a node off the main chain sits later than its depth: it would lose the
  // oldest keys of its window.
  return backend_.supports_tree_attention() && kv_token_moves_supported(spec) && spec.k_rope_dim == 0 && !windowed_;
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

std::vector<int16_t> ModelExecutor::verify_draft_tree(const SampleTarget& t, Sampler& sampler,
                                                      FunctionRef<std::span<float>(int32_t)> row_of,
                                                      std::vector<int32_t>& tokens) {
  // Row of the logits after node j (-1: the last verified token).
  const auto row = [&](int j) { return t.row + 1 + j; };
  std::vector<int16_t> path;
  if (argmax_is_enough(t) && argmax_[t.row] >= 0) {
    // Greedy without processors: follow the child equal to each row's argmax; the first
    // argmax no child holds is the replacement (or, at a leaf, the bonus).
    for (int node = -1;;) {
      const int32_t best = argmax_[row(node)];
      TESSERA_CHECK(best >= 0, "executor: argmax of verification row ", row(node), " missing");
      tokens.push_back(best);
      sampler.accept(best);
      const int next = draft_tree_child(t.draft, t.draft_parents, node, best);
      if (next < 0) return path;
      path.push_back(static_cast<int16_t>(next));
      node = next;
    }
  }
  const auto target = [&](int node) -> std::span<const TokenProb> {
    target_dist_ = sampler.distribution(row_of(row(node)));
    return target_dist_;
  };
  const auto on_accept = [&](int node) { sampler.accept(t.draft[static_cast<size_t>(node)]); };
  const auto uniform = [&] { return sampler.uniform(); };
  TreeVerdict v = verify_tree(t.draft, t.draft_parents, target, on_accept, uniform);
  tokens.insert(tokens.end(), v.tokens.begin(), v.tokens.end());
  if (v.reached_leaf) {
    // A kept leaf (or no draft below the root): the bonus token, as a plain step samples it.
    const int32_t bonus = sampler.sample(row_of(row(v.path.empty() ? -1 : v.path.back())));
    tokens.push_back(bonus);
    sampler.accept(bonus);
  } else {
    sampler.accept(v.tokens.back());  // the replacement drawn where every child was rejected
  }
  return std::move(v.path);
}

void ModelExecutor::plan_path_moves(const ForwardBatch& batch, const SampleTarget& t, std::span<const int16_t> path) {
  const int32_t root = batch.logits_rows.at(static_cast<size_t>(t.row));  // the batch row of the last verified token
  for (size_t d = 0; d < path.size(); ++d) {
    const int node = path[d];
    if (node == static_cast<int>(d)) continue;  // on the main chain: already in place
    // Node rows follow the root in node order, so a node never sits before its depth's slot,
    // and moving in path order never overwrites a later source.
    const auto src = static_cast<size_t>(root + 1 + node), dst = static_cast<size_t>(root + 1 + static_cast<int>(d));
    token_moves_.push_back({batch.slot_mapping[src], batch.slot_mapping[dst], false});
    if (batch.has_local) token_moves_.push_back({batch.local_slot_mapping[src], batch.local_slot_mapping[dst], true});
  }
}

}  // namespace tessera
