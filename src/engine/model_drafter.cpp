#include "engine/model_drafter.h"

#include <algorithm>

#include "core/error.h"
#include "engine/session.h"
#include "kv/kv_host_ops.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

namespace {

KvCacheSpec draft_kv_spec(const ModelConfig& c, const ModelDrafterLimits& limits) {
  TESSERA_CHECK(limits.block_size >= 1 && limits.n_blocks >= 1 && limits.max_batch_tokens >= 1 && limits.max_seqs >= 1,
                "model drafter: block size ", limits.block_size, ", ", limits.n_blocks, " blocks, ",
                limits.max_batch_tokens, " batch tokens and ", limits.max_seqs, " sequences must all be positive");
  return KvCacheSpec::plain(c.n_layer, c.n_head_kv, c.head_dim, limits.block_size, limits.n_blocks, DType::F16);
}

int32_t argmax_of(std::span<const float> row) {
  // Ties to the lower id, as Sampler's candidate order.
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Inverse CDF over a distribution sorted by token id.
int32_t draw_from(std::span<const TokenProb> dist, double u) {
  double acc = 0;
  for (const TokenProb& tp : dist) {
    acc += tp.prob;
    if (u < acc) return tp.token;
  }
  return dist.back().token;  // rounding: u at the very top of [0, 1)
}

// A per-call seed for a seeded request's draft draws: reproducible, and not the same stream
// at every step (mixes in the length of the sequence).
uint64_t draft_seed(uint64_t seed, size_t len) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (len + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

ModelDrafter::ModelDrafter(std::string name, std::shared_ptr<const ModelWeights> weights, Backend& backend,
                           const ModelDrafterLimits& limits, KvCache* target_kv)
    : name_(std::move(name)),
      weights_(std::move(weights)),
      limits_(limits),
      model_(
          create_model(weights_, backend, limits.max_batch_tokens, std::min(limits.max_seqs, limits.max_batch_tokens))),
      own_kv_(target_kv ? nullptr : std::make_unique<KvCache>(backend, draft_kv_spec(weights_->config, limits))),
      kv_(target_kv ? *target_kv : *own_kv_),
      pool_(target_kv ? 0 : limits.n_blocks),
      runner_(*model_, kv_, backend) {
  if (!target_kv) return;
  const KvCacheSpec& spec = kv_.spec();
  const ModelConfig& c = weights_->config;
  TESSERA_CHECK(&kv_.backend() == &backend, "model drafter: the target's cache is on another backend");
  TESSERA_CHECK(spec.block_size == limits.block_size && c.n_layer <= spec.n_layers && spec.n_kv_heads == c.n_head_kv &&
                    spec.head_dim == c.head_dim,
                "model drafter: the target's cache (", spec.n_layers, " layers, ", spec.n_kv_heads, " KV heads of ",
                spec.head_dim, ", blocks of ", spec.block_size, ") does not hold the draft's ", c.n_layer,
                " layers of ", c.n_head_kv, " KV heads of ", c.head_dim);
}

ModelDrafter::~ModelDrafter() = default;

void ModelDrafter::remove(DraftSeqId seq) {
  const auto it = states_.find(seq);
  if (it == states_.end()) return;
  it->second.kv.release_all(pool_);
  states_.erase(it);
}

bool ModelDrafter::prepare(State& st, std::span<const int32_t> tokens, int max_tokens) {
  // Keep the longest shared prefix, but always feed the last token: its row drafts the first.
  const size_t limit = std::min(st.tokens.size(), tokens.size() - 1);
  const size_t common =
      std::mismatch(st.tokens.begin(), st.tokens.begin() + static_cast<ptrdiff_t>(limit), tokens.begin()).first -
      st.tokens.begin();
  st.tokens.resize(common);
  st.kv.n_tokens = static_cast<int>(common);
  const size_t keep_blocks = (common + limits_.block_size - 1) / limits_.block_size;
  while (st.kv.blocks.size() > keep_blocks) {
    pool_.release(st.kv.blocks.back());
    st.kv.blocks.pop_back();
  }
  // The pending tokens, then max_tokens - 1 draft tokens fed back (the last is never fed).
  const int extra = static_cast<int>(tokens.size() - common) + max_tokens - 1;
  if (st.kv.reserve(pool_, limits_.block_size, extra)) return true;
  st.kv.release_all(pool_);
  st.tokens.clear();
  return false;
}

bool ModelDrafter::borrow(const DraftQuery& q, int max_tokens, State& st, std::vector<BlockCopy>& copies) const {
  const int bs = limits_.block_size;
  const int n_kv = q.target_kv_tokens;
  const bool local = kv_.spec().n_local_blocks > 0;
  if (n_kv < 0 || n_kv >= static_cast<int>(q.tokens.size())) return false;
  const size_t held = static_cast<size_t>((n_kv + bs - 1) / bs);
  const size_t need =
      static_cast<size_t>(draft_scratch_blocks(n_kv, static_cast<int>(q.tokens.size()), max_tokens, bs));
  if (q.target_blocks.size() < held || q.scratch_blocks.size() < need) return false;
  if (local && (q.target_local_blocks.size() < held || q.local_scratch_blocks.size() < need)) return false;
  // Blocks [0, full) are the target's; the draft writes from position n_kv on, in scratch.
  const size_t full = static_cast<size_t>(n_kv / bs);
  st.kv.blocks.assign(q.target_blocks.begin(), q.target_blocks.begin() + full);
  st.kv.blocks.insert(st.kv.blocks.end(), q.scratch_blocks.begin(), q.scratch_blocks.begin() + need);
  st.kv.n_tokens = n_kv;
  // The partly filled block's first tokens are read by the draft: its layers < L are copied.
  if (n_kv % bs) copies.push_back({q.target_blocks[full], st.kv.blocks[full], false});
  if (local) {
    st.local.blocks.assign(q.target_local_blocks.begin(), q.target_local_blocks.begin() + full);
    st.local.blocks.insert(st.local.blocks.end(), q.local_scratch_blocks.begin(),
                           q.local_scratch_blocks.begin() + need);
    st.local.n_tokens = n_kv;
    // The block of the last tokens is never behind the window; a dropped one is never read.
    if (n_kv % bs && q.target_local_blocks[full] != kDropped)
      copies.push_back({q.target_local_blocks[full], st.local.blocks[full], true});
  }
  return true;
}

void ModelDrafter::choose(Work& w, std::span<float> row, Draft& d) {
  int32_t token;
  if (!w.sampler) {
    token = argmax_of(row);
  } else {
    SparseDistribution q = w.sampler->distribution(row);  // applies bias and penalties to the row
    token = w.greedy ? q.front().token : draw_from(q, w.sampler->uniform());
    if (!w.greedy) d.probs.push_back(std::move(q));
    w.sampler->accept(token);
  }
  d.tokens.push_back(token);
}

void ModelDrafter::propose(std::span<const DraftQuery> queries, std::span<Draft> out) {
  TESSERA_CHECK(queries.size() == out.size(), "model drafter: ", queries.size(), " queries but ", out.size(),
                " outputs");
  const ModelConfig& c = weights_->config;
  const int n_vocab = c.n_vocab;
  const bool over_target = drafts_over_target_kv();
  const bool local = over_target && kv_.spec().n_local_blocks > 0;
  std::vector<State> borrowed;                         // over the target's cache: this call's tables
  borrowed.reserve(over_target ? queries.size() : 0);  // Work keeps pointers into it
  std::vector<BlockCopy> copies;
  std::vector<Work> work;
  for (size_t i = 0; i < queries.size(); ++i) {
    const DraftQuery& q = queries[i];
    out[i].clear();
    // Positions past the draft's trained context are out of its distribution.
    const int max_tokens = static_cast<int>(
        std::min<int64_t>(q.max_tokens, int64_t{c.n_ctx_train} - static_cast<int64_t>(q.tokens.size())));
    if (max_tokens <= 0 || q.tokens.empty()) continue;
    State* st;
    if (over_target) {
      State taken;
      if (!borrow(q, max_tokens, taken, copies)) continue;
      st = &borrowed.emplace_back(std::move(taken));
    } else {
      st = &states_[q.seq];
      if (!prepare(*st, q.tokens, max_tokens)) continue;
    }
    Work w;
    w.query = i;
    w.state = st;
    w.pending = q.tokens.subspan(st->kv.n_tokens);
    w.max_tokens = max_tokens;
    if (q.sampling) {
      SamplingParams p = *q.sampling;
      w.greedy = p.temperature <= 0;
      if (p.seed) p.seed = draft_seed(*p.seed, q.tokens.size());
      const int n_prompt = std::clamp<int>(q.n_prompt, 0, static_cast<int>(q.tokens.size()));
      w.sampler.emplace(p, n_vocab, q.tokens.first(n_prompt));
      for (size_t t = n_prompt; t < q.tokens.size(); ++t) w.sampler->accept(q.tokens[t]);
    }
    work.push_back(std::move(w));
  }
  if (!copies.empty()) copy_kv_blocks(kv_, copies, c.n_layer);
  const auto run = [&](const std::vector<size_t>& row_owner) {
    logits_.resize(row_owner.size() * static_cast<size_t>(n_vocab));
    runner_.forward(batch_, logits_.data());
    for (size_t r = 0; r < row_owner.size(); ++r) {
      Work& w = work[row_owner[r]];
      choose(w, std::span(logits_).subspan(r * n_vocab, n_vocab), out[w.query]);
    }
  };
  std::vector<size_t> row_owner;
  // Catch-up: every query's pending tokens, packed into forwards of max_batch_tokens tokens
  // (a long one split over several); the row of its last token drafts its first token.
  for (size_t next = 0; next < work.size();) {
    batch_.clear();
    row_owner.clear();
    while (next < work.size() && batch_.n_tokens() < limits_.max_batch_tokens &&
           static_cast<int>(row_owner.size()) < limits_.max_seqs) {
      Work& w = work[next];
      const int n = std::min<int>(static_cast<int>(w.pending.size()), limits_.max_batch_tokens - batch_.n_tokens());
      const bool last = n == static_cast<int>(w.pending.size());
      batch_.add_sequence(w.state->kv, limits_.block_size, w.pending.data(), n,
                          last ? ForwardBatch::Logits::Last : ForwardBatch::Logits::None,
                          local ? &w.state->local : nullptr);
      w.state->kv.n_tokens += n;
      w.state->local.n_tokens += n;
      w.state->tokens.insert(w.state->tokens.end(), w.pending.begin(), w.pending.begin() + n);
      w.pending = w.pending.subspan(n);
      if (!last) break;  // the batch is full
      row_owner.push_back(next++);
    }
    run(row_owner);
  }
  // Then one decode row per sequence and draft position: feed the token just drafted.
  for (;;) {
    batch_.clear();
    row_owner.clear();
    for (size_t i = 0; i < work.size() && static_cast<int>(row_owner.size()) < limits_.max_seqs; ++i) {
      Work& w = work[i];
      Draft& d = out[w.query];
      if (static_cast<int>(d.tokens.size()) >= w.max_tokens) continue;
      const int32_t token = d.tokens.back();
      batch_.add_sequence(w.state->kv, limits_.block_size, &token, 1, ForwardBatch::Logits::Last,
                          local ? &w.state->local : nullptr);
      w.state->kv.n_tokens += 1;
      w.state->local.n_tokens += 1;
      w.state->tokens.push_back(token);
      row_owner.push_back(i);
    }
    if (row_owner.empty()) break;
    run(row_owner);
  }
}

namespace {

// The draft must speak the target's vocabulary: same size, and the same text for a few ids
// spread over it (cheap; catches another tokenizer of the same size).
void check_vocabularies(const std::string& draft_name, const ModelWeights& draft, const Tokenizer* draft_tok,
                        const ModelWeights& target, const Tokenizer* target_tok) {
  TESSERA_CHECK(draft.config.n_vocab == target.config.n_vocab, "--speculative-config: draft model '", draft_name,
                "' has a vocabulary of ", draft.config.n_vocab, " tokens, the target '", target.source, "' has ",
                target.config.n_vocab, "; a draft model must share the target's tokenizer");
  if (!draft_tok || !target_tok) return;
  TESSERA_CHECK(draft_tok->vocab_size() == target_tok->vocab_size(), "--speculative-config: draft model '", draft_name,
                "' has a tokenizer of ", draft_tok->vocab_size(), " tokens, the target's has ",
                target_tok->vocab_size());
  const int32_t n = target_tok->vocab_size();
  for (const int32_t id : {0, 1, 2, n / 7, n / 3, n / 2, 2 * n / 3, n - 1}) {
    if (id < 0 || id >= n) continue;
    TESSERA_CHECK(draft_tok->token_text(id) == target_tok->token_text(id), "--speculative-config: draft model '",
                  draft_name, "' has another vocabulary than the target: token ", id, " is '",
                  draft_tok->token_text(id), "' in the draft and '", target_tok->token_text(id), "' in the target");
  }
}

}  // namespace

std::unique_ptr<ModelDrafter> make_model_drafter(const SpeculativeConfig& c, Session& target,
                                                 const ModelDrafterLimits& limits, KvCache* target_kv) {
  c.validate();
  const int target_layers = target.config().n_layer;
  if (c.method == SpecMethod::EarlyExit) {
    TESSERA_CHECK(c.draft_layers >= 1 && c.draft_layers < target_layers,
                  "--speculative-config: draft_layers = ", c.draft_layers, " is outside [1, ", target_layers - 1,
                  "] (the target has ", target_layers, " layers; early exit runs fewer)");
    // Views of the target's resident weights: on a device nothing is uploaded a second time.
    const auto whole = target.resident_weights() ? target.resident_weights() : target.shared_weights();
    return std::make_unique<ModelDrafter>("early_exit", first_layers(whole, c.draft_layers), target.backend(), limits,
                                          target_kv);
  }
  TESSERA_CHECK(c.method == SpecMethod::DraftModel, "model drafter: method ", spec_method_name(c.method),
                " does not run a model");
  LoadedModel draft;
  try {
    draft = load_model(c.draft_model, target.options().backend.threads);
  } catch (const Error& e) {
    fail("--speculative-config: draft model '", c.draft_model, "' does not load: ", e.what());
  }
  check_vocabularies(c.draft_model, *draft.weights, draft.tokenizer.get(), target.weights(),
                     target.has_tokenizer() ? &target.tokenizer() : nullptr);
  const int layers = draft.weights->config.n_layer;
  TESSERA_CHECK(c.draft_layers <= layers, "--speculative-config: draft_layers = ", c.draft_layers, " is outside [1, ",
                layers, "] (the draft model '", c.draft_model, "' has ", layers, " layers)");
  auto weights = first_layers(draft.weights, c.draft_layers > 0 ? c.draft_layers : layers);
  return std::make_unique<ModelDrafter>("draft_model", std::move(weights), target.backend(), limits);
}

}  // namespace tessera
