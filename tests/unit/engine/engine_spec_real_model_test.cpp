// Speculative decoding (n-gram drafts) over the real default model (SmolLM2-135M): greedy
// outputs token for token equal to the non-speculative engine's, with batching, forks,
// chunked prefill, prefix hits, preemption, stop tokens and aborts; no KV block leaks;
// sampled continuations distributed as without speculation (a two-sample test); seeded
// requests reproducible. Skipped when the model is not in the cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine_run_harness.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;
using tessera::test::RunResult;
using tessera::test::small_engine_options;

namespace {

std::string model_path() { return test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"); }

SpeculativeConfig ngram_config(int k) {
  SpeculativeConfig c;
  c.method = SpecMethod::Ngram;
  c.num_speculative_tokens = k;
  c.prompt_lookup_min = 1;
  c.prompt_lookup_max = 4;
  // Fixed k: these tests exercise verification, rollback and the KV bookkeeping; whether a
  // draft pays on this machine (the adaptive plan) is timing, tested in spec/step_cost_test.cpp.
  c.adaptive = false;
  return c;
}

class EngineSpecRealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    ModelEngineOptions o = small_engine_options(model_path(), 64, 16, 256);
    o.max_n = 16;
    o.swap_space_bytes = 8ll << 20;
    o.speculative = ngram_config(4);  // provisions the draft rows; each run chooses on or off
    model_ = new ModelEngine(o);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "model not found: " << model_path();
  }

  static std::vector<int32_t> encode(const std::string& text) {
    return model_->session().tokenizer().encode(text, true, false);
  }
  static Request greedy(const std::string& text, int max_tokens) {
    return tessera::test::greedy_request(*model_, text, max_tokens);
  }
  // spec: speculation on (k = 4) or off; tweak adjusts the rest.
  static RunResult run(const std::vector<Request>& requests, bool spec, bool alone = false, int n_blocks = 0,
                       const std::function<void(EngineConfig&)>& tweak = {}) {
    return test::run_engine(*model_, requests, alone, n_blocks, true, [&](EngineConfig& c) {
      c.speculative = spec ? ngram_config(4) : SpeculativeConfig{};
      if (tweak) tweak(c);
    });
  }
  static std::vector<Request> greedy_requests() { return tessera::test::spec_greedy_requests(*model_); }
  // 64 requests of 16 seeded choices each (temperature 0.8, top-p 0.9) continuing `context`.
  static RunResult sample(const char* context, int max_tokens, bool spec, uint64_t seed_base,
                          const std::function<void(EngineConfig&)>& tweak = {}) {
    std::vector<Request> reqs;
    for (int i = 0; i < 64; ++i) {
      Request r = greedy(context, max_tokens);
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = seed_base + static_cast<uint64_t>(i) * 16;
      r.n = 16;
      reqs.push_back(r);
    }
    return run(reqs, spec, false, 0, tweak);
  }

  static ModelEngine* model_;
};

ModelEngine* EngineSpecRealModel::model_ = nullptr;

}  // namespace

TEST_F(EngineSpecRealModel, GreedyOutputsEqualNonSpeculativeOnesBatchedAndAlone) {
  const std::vector<Request> reqs = greedy_requests();
  const RunResult plain = run(reqs, false, true);
  const RunResult spec_alone = run(reqs, true, true);
  const RunResult spec_batched = run(reqs, true, false);
  for (const auto& [id, o] : plain.out) {
    EXPECT_EQ(spec_alone.out.at(id).tokens[0], o.tokens[0]) << "request " << id;
    EXPECT_EQ(spec_batched.out.at(id).tokens[0], o.tokens[0]) << "request " << id;
  }
  EXPECT_EQ(plain.stats.spec.drafts, 0);
  EXPECT_GT(spec_alone.stats.spec.accepted_tokens, 10);                                  // the copy prompt is copied
  EXPECT_LT(spec_alone.stats.steps, plain.stats.steps);                                  // fewer serial steps
  EXPECT_LT(spec_alone.stats.spec.accepted_tokens, spec_alone.stats.spec.draft_tokens);  // and rejections rolled back
}

TEST_F(EngineSpecRealModel, ForksPreemptionChunkingAndPrefixHitsChangeNothing) {
  std::vector<Request> reqs = greedy_requests();
  reqs[0].n = 3;  // greedy forks: each choice speculates on its own copy of the last block
  const RunResult plain = run(reqs, false, true);
  // A tight pool (preemption, recompute then swap), small steps (chunked prefill), and the
  // same prompts twice (the second time from the prefix cache).
  std::vector<Request> twice = reqs;
  twice.insert(twice.end(), reqs.begin(), reqs.end());
  const auto small_steps = [](EngineConfig& c) { c.scheduler.max_num_batched_tokens = 16; };
  const RunResult tight = run(twice, true, false, 24, small_steps);
  const RunResult swapped = run(twice, true, false, 24, [&](EngineConfig& c) {
    small_steps(c);
    c.scheduler.preemption_mode = PreemptionMode::Swap;
  });
  for (const RunResult* r : {&tight, &swapped}) {
    for (size_t i = 0; i < twice.size(); ++i) {
      const RequestId want = i % reqs.size() + 1;
      for (int c = 0; c < twice[i].n; ++c)
        EXPECT_EQ(r->out.at(i + 1).tokens[c], plain.out.at(want).tokens[c]) << "request " << i + 1 << " choice " << c;
    }
    EXPECT_GT(r->stats.preemptions, 0);
    EXPECT_GT(r->stats.prefix.hit_tokens, 0);
    EXPECT_GT(r->stats.spec.accepted_tokens, 0);
  }
  EXPECT_GT(swapped.stats.swaps_out, 0);
}

TEST_F(EngineSpecRealModel, StopTokensEndAtTheSameTokenInsideAcceptedDrafts) {
  const Request base = greedy(tessera::test::kSpecCopyPrompt, 24);
  const RunResult plain = run({base}, false);
  const std::vector<int32_t>& full = plain.out.at(1).tokens[0];
  ASSERT_GE(full.size(), 10u);
  // Stop at a token the drafts are likely to carry past; the first occurrence ends both.
  Request stopped = base;
  stopped.sampling.stop_token_ids = {full[7]};
  const RunResult a = run({stopped}, false);
  const RunResult b = run({stopped}, true);
  EXPECT_EQ(b.out.at(1).tokens[0], a.out.at(1).tokens[0]);
  EXPECT_EQ(b.out.at(1).finish[0], FinishReason::Stop);
  // max_tokens cuts at the same place, never past it.
  for (int max_tokens : {1, 2, 5, 9}) {
    Request cut = base;
    cut.sampling.max_tokens = max_tokens;
    const RunResult c = run({cut}, true);
    EXPECT_EQ(c.out.at(1).tokens[0], std::vector<int32_t>(full.begin(), full.begin() + max_tokens)) << max_tokens;
  }
}

TEST_F(EngineSpecRealModel, ManySpeculativeStepsWithAbortsLeakNoBlocks) {
  EngineConfig c = model_->config();
  c.check_invariants = true;
  c.n_blocks = 40;  // tight: preemption too
  c.speculative = ngram_config(4);
  EngineCore core(c, model_->executor());
  const int aborted = test::run_with_random_aborts(core, greedy_requests(), 40, 3);
  EXPECT_GT(aborted, 5);
  EXPECT_GT(core.stats().spec.drafts, 50);
  EXPECT_LT(core.stats().spec.accepted_tokens, core.stats().spec.draft_tokens);
  EXPECT_TRUE(core.is_idle());
  EXPECT_EQ(core.kv().n_free(), core.kv().n_blocks());
}

TEST_F(EngineSpecRealModel, LogprobsEqualThoseOfANonSpeculativeRun) {
  std::vector<Request> reqs = greedy_requests();
  for (Request& r : reqs) {
    r.logprobs = true;
    r.sampling.n_logprobs = 3;
  }
  const RunResult plain = run(reqs, false, true);
  const RunResult spec = run(reqs, true, true);
  EXPECT_GT(spec.stats.spec.accepted_tokens, 10);
  for (const auto& [id, o] : plain.out) {
    ASSERT_EQ(spec.out.at(id).tokens[0], o.tokens[0]) << id;
    const auto& want = plain.logprobs.at(id)[0];
    const auto& got = spec.logprobs.at(id)[0];
    ASSERT_EQ(got.size(), want.size()) << id;
    for (size_t i = 0; i < want.size(); ++i) {
      // Another batch shape than the plain run's; the CPU kernels are batch-invariant.
      EXPECT_EQ(got[i].chosen.token, want[i].chosen.token) << id << " token " << i;
      EXPECT_NEAR(got[i].chosen.logprob, want[i].chosen.logprob, 1e-5) << id << " token " << i;
      ASSERT_EQ(got[i].top.size(), 3u);
      for (size_t k = 0; k < 3; ++k) EXPECT_EQ(got[i].top[k].token, want[i].top[k].token) << id << " token " << i;
    }
  }
}

TEST_F(EngineSpecRealModel, SeededSamplingIsReproducible) {
  Request r = greedy(tessera::test::kSpecCopyPrompt, 16);
  r.sampling.temperature = 0.8f;
  r.sampling.top_p = 0.9f;
  r.sampling.seed = 1234;
  r.n = 2;
  const RunResult a = run({r}, true);
  const RunResult b = run({r}, true);
  EXPECT_EQ(a.out.at(1).tokens, b.out.at(1).tokens);
  EXPECT_GT(a.stats.spec.drafts, 0);
}

// With temperature 0.8 and top-p 0.9, the second and third tokens after a fixed context
// (the first ones drafts can verify) are distributed as without speculation: a two-sample
// chi-square at significance 0.001 over 1024 continuations each (16 seeded choices a
// request, so the prompt is computed once per request and then read from the prefix cache).
// The context is open (several likely continuations) and its words recur, so the n-gram
// drafter proposes tokens that are sometimes kept and sometimes not.
TEST_F(EngineSpecRealModel, SampledContinuationsMatchNonSpeculativeSampling) {
  const char* context = "Once upon a time, in a small village by the sea, there lived a";
  const RunResult plain = sample(context, 3, false, 1000000);
  const RunResult spec = sample(context, 3, true, 2000000);
  EXPECT_GT(spec.stats.spec.accepted_tokens, 0);
  EXPECT_LT(spec.stats.spec.accepted_tokens, spec.stats.spec.draft_tokens);
  test::expect_same_token_distributions(plain, spec, {1, 2});
}

// Tree verification: the n-gram drafter proposes up to 3 distinct continuations as one tree,
// verified in one forward under a tree attention mask; the kept path's KV moves to its
// slots. Greedy outputs stay token for token the plain ones, alone, batched, in a tight
// pool with chunked prefill and preemption (recompute and swap), with forks and prefix hits.
namespace {

void tree_drafts(EngineConfig& c) { c.speculative.prompt_lookup_candidates = 3; }

// A text whose recurring phrase has several continuations, so that trees have branches and a
// side branch is what the model continues with at times.
std::vector<Request> tree_requests(ModelEngine& model) {
  std::vector<Request> reqs = tessera::test::spec_greedy_requests(model);
  reqs.push_back(tessera::test::greedy_request(model,
                                               "The cat sat on the mat. The cat ate the fish. The cat sat on the "
                                               "chair. The cat ate the bread. The cat sat on the",
                                               24));
  return reqs;
}

}  // namespace

TEST_F(EngineSpecRealModel, TreeDraftsKeepGreedyOutputsEverywhere) {
  std::vector<Request> reqs = tree_requests(*model_);
  reqs[0].n = 2;
  const RunResult plain = run(reqs, false, true);
  std::vector<Request> twice = reqs;
  twice.insert(twice.end(), reqs.begin(), reqs.end());
  const RunResult alone = run(reqs, true, true, 0, tree_drafts);
  const RunResult batched = run(twice, true, false, 0, tree_drafts);
  const RunResult tight = run(twice, true, false, 24, [](EngineConfig& c) {
    tree_drafts(c);
    c.scheduler.max_num_batched_tokens = 16;
    c.scheduler.preemption_mode = PreemptionMode::Swap;
  });
  for (const auto& [id, o] : plain.out)
    for (int c = 0; c < reqs[id - 1].n; ++c) EXPECT_EQ(alone.out.at(id).tokens[c], o.tokens[c]) << id;
  for (const RunResult* r : {&batched, &tight})
    for (size_t i = 0; i < twice.size(); ++i)
      for (int c = 0; c < twice[i].n; ++c)
        EXPECT_EQ(r->out.at(i + 1).tokens[c], plain.out.at(i % reqs.size() + 1).tokens[c]) << i + 1;
  for (const RunResult* r : {&alone, &batched, &tight}) {
    EXPECT_GT(r->stats.spec.tree_drafts, 0);
    EXPECT_GT(r->stats.spec.accepted_tokens, 10);
  }
  EXPECT_GT(tight.stats.preemptions, 0);
  EXPECT_LT(alone.stats.steps, plain.stats.steps);
}

TEST_F(EngineSpecRealModel, TreeDraftsWithAbortsLeakNoBlocks) {
  EngineConfig c = model_->config();
  c.check_invariants = true;
  c.n_blocks = 40;
  c.speculative = ngram_config(4);
  tree_drafts(c);
  EngineCore core(c, model_->executor());
  const int aborted = test::run_with_random_aborts(core, tree_requests(*model_), 40, 5);
  EXPECT_GT(aborted, 5);
  EXPECT_GT(core.stats().spec.tree_drafts, 20);
  EXPECT_TRUE(core.is_idle());
  EXPECT_EQ(core.kv().n_free(), core.kv().n_blocks());
}

// Sampled tokens after tree verification are distributed as without speculation (the same
// two-sample test as above, on a context whose words recur with different continuations).
TEST_F(EngineSpecRealModel, TreeDraftsKeepSampledDistributions) {
  // The first token is most often " cat", whose earlier occurrences go on three ways: the
  // second token's draft is a tree with three children at its root (k = 2: short branches,
  // so the 5 tokens asked for are few steps).
  const auto trees_k2 = [](EngineConfig& c) {
    tree_drafts(c);
    c.speculative.num_speculative_tokens = 2;
  };
  const char* context = "The cat sat. The cat ate. The cat ran. The";
  const RunResult plain = sample(context, 5, false, 3000000, trees_k2);
  const RunResult spec = sample(context, 5, true, 4000000, trees_k2);
  EXPECT_GT(spec.stats.spec.tree_drafts, 0);
  EXPECT_GT(spec.stats.spec.accepted_tokens, 0);
  test::expect_same_token_distributions(plain, spec, {1, 2});
}

// Trees need masks and positions that agree: a sliding window bounds a row's keys by its
// slot's position, later than a side node's depth, so windowed models draft chains; and the
// KIVI int4 keys (page-wide scales) cannot move one token.
TEST(EngineSpecTrees, OnlyWhereTheKeysCanFollowTheTree) {
  const auto trees = [](const std::string& model, const char* k_format) {
    ModelEngineOptions o = small_engine_options(model, 64, 4, 64);
    if (k_format) {
      o.session.k_format = parse_kv_format(k_format, true);
      o.session.v_format = parse_kv_format(k_format, false);
    }
    return ModelEngine(o).executor().supports_draft_trees();
  };
  EXPECT_TRUE(trees("dummy:llama3-tiny:f32", nullptr));
  EXPECT_TRUE(trees("dummy:llama3-tiny:f32", "fp8_e4m3:token"));
  EXPECT_FALSE(trees("dummy:gemma3-tiny:f32", nullptr));
  EXPECT_FALSE(trees("dummy:llama3-tiny:f32", "int4"));
}
