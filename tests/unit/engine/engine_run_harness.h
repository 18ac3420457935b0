#pragma once
// Runs requests through a fresh EngineCore over a loaded ModelEngine and collects what each
// choice produced, checking the engine's invariants every step and that every KV block is
// free at the end. Shared by the real-model engine tests.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "tokenizer/tokenizer.h"

namespace tessera::test {

// The small engine the real-model tests share: one CPU thread (ctest runs suites side by side on
// 2 cores), blocks of 4 tokens (forks share partial blocks, drafts cross block edges, a tight
// pool preempts), a 256-token context, `max_seqs` sequences and `batched` tokens a step, n_blocks
// KV blocks in kv_bytes, no warm-up.
inline ModelEngineOptions small_engine_options(const std::string& model, int batched, int max_seqs, int n_blocks,
                                               int64_t kv_bytes = 64ll << 20) {
  ModelEngineOptions o;
  o.session.model = model;
  o.session.backend.threads = 1;
  o.session.block_size = 4;
  o.scheduler.max_num_batched_tokens = batched;
  o.scheduler.max_num_seqs = max_seqs;
  o.scheduler.max_model_len = 256;
  o.max_kv_blocks = n_blocks;
  o.kv_cache_bytes = kv_bytes;
  o.warmup = false;
  return o;
}

// A greedy request that runs its max_tokens (the end token ignored), prompt with BOS.
// A greedy request of token ids that runs its max_tokens (the end token ignored).
inline Request greedy_tokens_request(std::vector<int32_t> prompt, int max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  return r;
}
inline Request greedy_request(ModelEngine& model, const std::string& text, int max_tokens) {
  return greedy_tokens_request(model.session().tokenizer().encode(text, true, false), max_tokens);
}

// The speculation tests' greedy mix: a copy-heavy prompt (drafts get accepted), code, and a
// sentence that repeats itself.
inline constexpr const char* kSpecCopyPrompt =
    "Repeat the list exactly.\nList: apple, banana, cherry, grape, lemon, mango, orange, peach, pear, plum.\n"
    "Repeat: apple, banana, cherry,";
inline std::vector<Request> spec_greedy_requests(ModelEngine& model) {
  return {greedy_request(model, kSpecCopyPrompt, 24),
          greedy_request(model, "def fibonacci(n):\n    if n < 2:\n        return n\n    return", 16),
          greedy_request(model, "The three primary colors are red, blue and yellow. The three primary colors are", 16)};
}

struct RunResult {
  std::map<RequestId, RequestOutput> out;
  std::map<RequestId, std::vector<std::vector<Logprobs>>> logprobs;  // [request][choice][token]
  std::map<RequestId, std::shared_ptr<const std::vector<Logprobs>>> prompt_logprobs;
  EngineStats stats;
};

// Submitted together, or one at a time when `alone`; n_blocks > 0 uses only the first
// n_blocks of the cache; tweak adjusts the config (preemption mode, ...).
inline RunResult run_engine(ModelEngine& model, const std::vector<Request>& requests, bool alone, int n_blocks = 0,
                            bool prefix_caching = true, const std::function<void(EngineConfig&)>& tweak = {}) {
  EngineConfig c = model.config();
  c.check_invariants = true;
  c.prefix_caching = prefix_caching;
  if (n_blocks > 0) c.n_blocks = n_blocks;  // the first n_blocks of the cache
  if (tweak) tweak(c);
  EngineCore core(c, model.executor());
  RunResult result;
  std::map<RequestId, RequestOutput>& out = result.out;
  const auto drain = [&] {
    while (core.has_work()) {
      const StepResult s = core.step();
      EXPECT_EQ(s.error, "");
      for (const auto& [id, entries] : s.prompt_logprobs) result.prompt_logprobs[id] = entries;
      for (const SeqEvent& e : s.events) {
        RequestOutput& o = out[e.request];
        if (e.token >= 0) o.tokens[e.choice].push_back(e.token);
        if (e.finish != FinishReason::None) o.finish[e.choice] = e.finish;
        if (e.logprobs) {
          auto& lp = result.logprobs[e.request];
          lp.resize(o.tokens.size());
          lp[e.choice].push_back(*e.logprobs);
        }
      }
    }
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    const RequestId id = i + 1;
    out[id].tokens.resize(requests[i].n);
    out[id].finish.assign(requests[i].n, FinishReason::None);
    core.add(id, requests[i]);
    if (alone) drain();
  }
  drain();
  result.stats = core.stats();
  EXPECT_TRUE(core.is_idle());
  EXPECT_EQ(core.kv().n_free(), core.kv().n_blocks());
  EXPECT_EQ(core.kv().n_local_free(), core.kv().n_local_blocks());
  EXPECT_EQ(core.kv().n_host_free(), core.kv().n_host_blocks());
  return result;
}

// Speculation under churn: adds n_requests drawn from `pool` at random steps (a third of
// them sampled at temperature 0.8, top-p 0.9, seeded, the rest as given, max_tokens 8..31),
// aborts a random live request now and then, and steps until nothing is left. Returns the
// number of aborts; every step must succeed.
inline int run_with_random_aborts(EngineCore& core, const std::vector<Request>& pool, int n_requests, uint32_t seed) {
  std::mt19937 rng(seed);
  RequestId next = 1;
  int aborted = 0;
  while (next <= static_cast<RequestId>(n_requests) || core.has_work()) {
    if (next <= static_cast<RequestId>(n_requests) && rng() % 2 == 0) {
      Request r = pool[rng() % pool.size()];
      r.sampling.max_tokens = 8 + static_cast<int>(rng() % 24);
      if (rng() % 3 == 0) {
        r.sampling.temperature = 0.8f;
        r.sampling.top_p = 0.9f;
        r.sampling.seed = rng();
      }
      core.add(next++, r);
    }
    if (rng() % 6 == 0) {
      const auto ids = core.scheduler().request_ids();
      if (!ids.empty()) {
        core.abort(ids[rng() % ids.size()]);
        ++aborted;
      }
    }
    const StepResult s = core.step();
    EXPECT_EQ(s.error, "");
    if (!s.error.empty()) break;
  }
  return aborted;
}

// Wilson-Hilferty: the chi-square quantile at significance 0.001 (z = 3.0902), within 1%
// for the degrees of freedom used here.
inline double chi_square_critical_0001(int df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - a + 3.0902 * std::sqrt(a), 3.0);
}

// Two-sample chi-square of equal-size samples of tokens; cells with fewer than 10
// observations in both samples together are pooled into one.
struct TwoSample {
  double stat = 0;
  int df = 0;
};
inline TwoSample two_sample(const std::map<int32_t, int>& a, const std::map<int32_t, int>& b) {
  std::map<int32_t, std::pair<int, int>> cells;
  for (const auto& [t, n] : a) cells[t].first += n;
  for (const auto& [t, n] : b) cells[t].second += n;
  std::vector<std::pair<int, int>> kept;
  std::pair<int, int> pooled{0, 0};
  for (const auto& [t, c] : cells) {
    if (c.first + c.second >= 10) {
      kept.push_back(c);
    } else {
      pooled.first += c.first;
      pooled.second += c.second;
    }
  }
  if (pooled.first + pooled.second > 0) kept.push_back(pooled);
  TwoSample r;
  for (const auto& [x, y] : kept) r.stat += static_cast<double>(x - y) * (x - y) / (x + y);
  r.df = static_cast<int>(kept.size()) - 1;
  return r;
}

// The tokens at each of `positions` of every choice, in `a` and in `b`, distributed alike:
// the two-sample chi-square stays under its 0.001 critical value.
inline void expect_same_token_distributions(const RunResult& a, const RunResult& b,
                                            std::initializer_list<size_t> positions) {
  for (size_t pos : positions) {
    std::map<int32_t, int> ca, cb;
    for (const auto& [id, o] : a.out)
      for (const auto& t : o.tokens) ++ca[t.at(pos)];
    for (const auto& [id, o] : b.out)
      for (const auto& t : o.tokens) ++cb[t.at(pos)];
    const TwoSample t = two_sample(ca, cb);
    ASSERT_GE(t.df, 1) << "position " << pos << ": a single token, nothing to compare";
    EXPECT_LT(t.stat, chi_square_critical_0001(t.df)) << "position " << pos << " df " << t.df;
  }
}

}  // namespace tessera::test
