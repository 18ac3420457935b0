// Speculative decoding with model drafters over the real default model (SmolLM2-135M, 30
// layers): "draft_model" (the same GGUF cut to its first layers, with its own paged KV) and
// "early_exit" (the target's own first layers). Greedy outputs token for token equal to the
// non-speculative engine's, with batching, forks (n > 1), stop tokens and max_tokens cuts;
// no KV block leaks, the draft's included, after many steps with rejections and aborts;
// sampled continuations distributed as without speculation (q is the draft's processed
// distribution); config errors named. Skipped when the model is not in the cache.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine/model_drafter.h"
#include "engine_run_harness.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;
using tessera::test::RunResult;
using tessera::test::small_engine_options;

namespace {

std::string model_path() { return test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"); }

constexpr int kK = 4;

SpeculativeConfig draft_model_config(int layers) {
  SpeculativeConfig c;
  c.method = SpecMethod::DraftModel;
  c.draft_model = model_path();
  c.draft_layers = layers;
  c.num_speculative_tokens = kK;
  // Fixed k: these tests exercise verification, rollback and the KV bookkeeping; whether a
  // draft pays on this machine (the adaptive plan) is timing, tested in spec/step_cost_test.cpp.
  c.adaptive = false;
  return c;
}

SpeculativeConfig early_exit_config(int layers) {
  SpeculativeConfig c;
  c.method = SpecMethod::EarlyExit;
  c.draft_layers = layers;
  c.num_speculative_tokens = kK;
  // Fixed k: these tests exercise verification, rollback and the KV bookkeeping; whether a
  // draft pays on this machine (the adaptive plan) is timing, tested in spec/step_cost_test.cpp.
  c.adaptive = false;
  return c;
}

class EngineSpecModelDrafter : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    ModelEngineOptions o = small_engine_options(model_path(), 64, 16, 256);
    o.speculative = early_exit_config(6);  // provisions the draft rows and builds one drafter
    model_ = new ModelEngine(o);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "model not found: " << model_path();
  }

  static ModelDrafterLimits limits() {
    return {.block_size = 4, .n_blocks = 300, .max_batch_tokens = 64, .max_seqs = 16};
  }
  // Early exit runs over the target's cache (the engine's) unless own_cache.
  static std::shared_ptr<ModelDrafter> drafter(const SpeculativeConfig& c, bool own_cache = false) {
    return make_model_drafter(c, model_->session(), limits(), own_cache ? nullptr : &model_->kv());
  }
  static Request greedy(const std::string& text, int max_tokens) {
    return tessera::test::greedy_request(*model_, text, max_tokens);
  }
  static std::vector<Request> greedy_requests() { return tessera::test::spec_greedy_requests(*model_); }
  // Without speculation when d is null.
  static RunResult run(const std::vector<Request>& requests, const SpeculativeConfig& c,
                       const std::shared_ptr<ModelDrafter>& d, bool alone = false) {
    return test::run_engine(*model_, requests, alone, 0, true, [&](EngineConfig& ec) {
      ec.speculative = d ? c : SpeculativeConfig{};
      ec.drafter = d;
    });
  }
  static std::string error_of(const SpeculativeConfig& c) {
    try {
      drafter(c);
    } catch (const Error& e) {
      return e.what();
    }
    return "(accepted)";
  }

  static ModelEngine* model_;
};

ModelEngine* EngineSpecModelDrafter::model_ = nullptr;

void expect_same_outputs(const RunResult& want, const RunResult& got, const char* what) {
  for (const auto& [id, o] : want.out)
    for (size_t c = 0; c < o.tokens.size(); ++c)
      EXPECT_EQ(got.out.at(id).tokens[c], o.tokens[c]) << what << ": request " << id << " choice " << c;
}

}  // namespace

TEST_F(EngineSpecModelDrafter, GreedyOutputsEqualNonSpeculativeOnesForEveryModelDrafter) {
  std::vector<Request> reqs = greedy_requests();
  reqs[0].n = 3;  // greedy forks: each choice drafts with its own draft state
  const RunResult plain = run(reqs, {}, nullptr, true);
  for (const SpeculativeConfig& c : {draft_model_config(10), early_exit_config(6)}) {
    const auto d = drafter(c);
    const RunResult alone = run(reqs, c, d, true);
    const RunResult batched = run(reqs, c, d, false);
    const std::string name = describe_speculative_config(c);
    expect_same_outputs(plain, alone, name.c_str());
    expect_same_outputs(plain, batched, name.c_str());
    std::printf("%s: %lld of %lld draft tokens accepted\n", name.c_str(),
                static_cast<long long>(alone.stats.spec.accepted_tokens),
                static_cast<long long>(alone.stats.spec.draft_tokens));
    EXPECT_GT(alone.stats.spec.accepted_tokens, 0) << name;   // a shallow draft is often wrong, but not always
    EXPECT_LT(alone.stats.steps, plain.stats.steps) << name;  // fewer serial target steps
    EXPECT_LT(alone.stats.spec.accepted_tokens, alone.stats.spec.draft_tokens) << name;  // rejections rolled back
    EXPECT_EQ(d->n_sequences(), 0u) << name;
    EXPECT_EQ(d->n_free_blocks(), d->n_blocks()) << name;
  }
}

TEST_F(EngineSpecModelDrafter, TheFullDraftModelIsTheTargetAndAlwaysAccepted) {
  // A draft of all 30 layers is the target itself: every greedy draft token is kept.
  const SpeculativeConfig c = draft_model_config(0);
  const auto d = drafter(c);
  EXPECT_EQ(d->n_layers(), 30);
  const RunResult r = run({greedy(tessera::test::kSpecCopyPrompt, 20)}, c, d);
  EXPECT_EQ(r.out.at(1).tokens[0], run({greedy(tessera::test::kSpecCopyPrompt, 20)}, {}, nullptr).out.at(1).tokens[0]);
  EXPECT_GT(r.stats.spec.draft_tokens, 10);
  EXPECT_EQ(r.stats.spec.accepted_tokens, r.stats.spec.draft_tokens);
}

TEST_F(EngineSpecModelDrafter, StopTokensAndMaxTokensCutAtTheSamePlace) {
  const Request base = greedy(tessera::test::kSpecCopyPrompt, 24);
  const RunResult plain = run({base}, {}, nullptr);
  const std::vector<int32_t>& full = plain.out.at(1).tokens[0];
  ASSERT_GE(full.size(), 10u);
  const SpeculativeConfig c = early_exit_config(10);
  const auto d = drafter(c);
  Request stopped = base;
  stopped.sampling.stop_token_ids = {full[7]};
  const RunResult a = run({stopped}, {}, nullptr);
  const RunResult b = run({stopped}, c, d);
  EXPECT_EQ(b.out.at(1).tokens[0], a.out.at(1).tokens[0]);
  EXPECT_EQ(b.out.at(1).finish[0], FinishReason::Stop);
  for (int max_tokens : {1, 2, 5, 9}) {
    Request cut = base;
    cut.sampling.max_tokens = max_tokens;
    const RunResult r = run({cut}, c, d);
    EXPECT_EQ(r.out.at(1).tokens[0], std::vector<int32_t>(full.begin(), full.begin() + max_tokens)) << max_tokens;
  }
}

// Early exit over the target's cache: each draft reads the target's KV of the verified tokens
// where its own cache recomputes it, so the drafts, and with them the steps, are the same.
TEST_F(EngineSpecModelDrafter, EarlyExitOverTheTargetsCacheDraftsWhatItsOwnCacheWould) {
  std::vector<Request> reqs = greedy_requests();
  reqs[0].n = 2;
  const SpeculativeConfig c = early_exit_config(10);
  const auto shared = drafter(c);
  const auto own = drafter(c, true);
  EXPECT_TRUE(shared->drafts_over_target_kv());
  EXPECT_FALSE(own->drafts_over_target_kv());
  EXPECT_EQ(shared->n_blocks(), 0);  // no second cache
  const RunResult a = run(reqs, c, own);
  const RunResult b = run(reqs, c, shared);
  expect_same_outputs(a, b, "early exit over the target's cache");
  EXPECT_EQ(b.stats.spec.draft_tokens, a.stats.spec.draft_tokens);
  EXPECT_EQ(b.stats.spec.accepted_tokens, a.stats.spec.accepted_tokens);
  EXPECT_EQ(b.stats.steps, a.stats.steps);
  EXPECT_EQ(shared->n_sequences(), 0u);  // nothing kept between calls
}

TEST_F(EngineSpecModelDrafter, ManyStepsWithRejectionsAndAbortsLeakNoBlocksInEitherCache) {
  // A draft model's own cache, and early exit lent scratch blocks from the target's pool.
  for (const SpeculativeConfig& sc : {draft_model_config(6), early_exit_config(6)}) {
    const std::string name = describe_speculative_config(sc);
    const auto d = drafter(sc);
    EngineConfig c = model_->config();
    c.check_invariants = true;
    c.n_blocks = 40;  // tight: preemption too, and steps with no block to lend a draft
    c.speculative = sc;
    c.drafter = d;
    {
      EngineCore core(c, model_->executor());
      const int aborted = test::run_with_random_aborts(core, greedy_requests(), 30, 5);
      EXPECT_GT(aborted, 3) << name;
      EXPECT_GT(core.stats().spec.drafts, 30) << name;
      EXPECT_LT(core.stats().spec.accepted_tokens, core.stats().spec.draft_tokens) << name;
      EXPECT_TRUE(core.is_idle()) << name;
      EXPECT_EQ(core.kv().n_free(), core.kv().n_blocks()) << name;
    }
    EXPECT_EQ(d->n_sequences(), 0u) << name;
    EXPECT_EQ(d->n_free_blocks(), d->n_blocks()) << name;
  }
}

TEST_F(EngineSpecModelDrafter, SeededSampledRequestsAreReproducible) {
  Request r = greedy(tessera::test::kSpecCopyPrompt, 12);
  r.sampling.temperature = 0.8f;
  r.sampling.top_p = 0.9f;
  r.sampling.seed = 77;
  r.n = 2;
  const SpeculativeConfig c = early_exit_config(10);
  const auto d = drafter(c);
  const RunResult a = run({r}, c, d);
  const RunResult b = run({r}, c, d);
  EXPECT_EQ(a.out.at(1).tokens, b.out.at(1).tokens);
  EXPECT_GT(a.stats.spec.drafts, 0);
}

// Temperature 0.8, top-p 0.9: the drafter draws from its own processed distribution and
// returns it as q; the second and third tokens after a fixed context are distributed as
// without speculation (two-sample chi-square at 0.001 over 1024 continuations each).
TEST_F(EngineSpecModelDrafter, SampledContinuationsMatchNonSpeculativeSampling) {
  constexpr int kRequests = 64;
  const SpeculativeConfig c = early_exit_config(20);
  const auto d = drafter(c);
  const auto sample = [&](bool spec, uint64_t seed_base) {
    std::vector<Request> reqs;
    for (int i = 0; i < kRequests; ++i) {
      Request r = greedy("Once upon a time, in a small village by the sea, there lived a", 3);
      r.sampling.temperature = 0.8f;
      r.sampling.top_p = 0.9f;
      r.sampling.seed = seed_base + static_cast<uint64_t>(i) * 16;
      r.n = 16;
      reqs.push_back(r);
    }
    return run(reqs, c, spec ? d : nullptr);
  };
  const RunResult plain = sample(false, 1000000);
  const RunResult spec = sample(true, 2000000);
  EXPECT_GT(spec.stats.spec.accepted_tokens, 0);
  EXPECT_LT(spec.stats.spec.accepted_tokens, spec.stats.spec.draft_tokens);
  test::expect_same_token_distributions(plain, spec, {1, 2});
}

TEST_F(EngineSpecModelDrafter, ConfigErrorsNameWhatIsWrong) {
  SpeculativeConfig missing = draft_model_config(0);
  missing.draft_model = "no-such-model";
  EXPECT_NE(error_of(missing).find("draft model 'no-such-model' does not load"), std::string::npos)
      << error_of(missing);
  EXPECT_NE(error_of(early_exit_config(30)).find("draft_layers = 30 is outside [1, 29]"), std::string::npos)
      << error_of(early_exit_config(30));
  EXPECT_NE(error_of(draft_model_config(31)).find("draft_layers = 31 is outside [1, 30]"), std::string::npos)
      << error_of(draft_model_config(31));
  // Another vocabulary (Gemma 3's 262k tokens), when that model is in the cache too.
  const std::string gemma = test_model_path("gemma-3-270m-q4_k_m.gguf");
  if (std::filesystem::exists(gemma)) {
    SpeculativeConfig other = draft_model_config(0);
    other.draft_model = gemma;
    EXPECT_NE(error_of(other).find("must share the target's tokenizer"), std::string::npos) << error_of(other);
  }
}
