// The engine over the real default model (SmolLM2-135M): batching, prefix hits, preemption
// (recompute and swap) and forks change no greedy output; logprobs and prompt logprobs
// equal those of a single-sequence Session run. Skipped when the model is not in the cache.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine/engine_offline.h"
#include "engine_run_harness.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;
using tessera::test::RunResult;
using tessera::test::small_engine_options;

namespace {

std::string model_path() { return test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"); }

class EngineRealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    ModelEngineOptions o = small_engine_options(model_path(), 32, 8, 128);
    o.swap_space_bytes = 8ll << 20;  // ~90 blocks of 4 tokens
    model_ = new ModelEngine(o);
    // The reference: one sequence at a time, fed in one chunk, every row's logits on demand.
    SessionOptions so;
    so.model = model_path();
    so.backend.threads = 1;
    so.ctx = 256;
    so.max_batch_tokens = 64;
    so.max_logits = 64;
    so.block_size = 4;
    reference_ = new Session(so);
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
    delete reference_;
    reference_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "model not found: " << model_path();
  }

  static std::vector<int32_t> encode(const std::string& text) {
    return model_->session().tokenizer().encode(text, true, false);
  }

  static Request greedy(const std::string& text, int max_tokens) {
    Request r;
    r.prompt = encode(text);
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;  // fixed lengths: outputs compare token for token
    return r;
  }

  static RunResult run(const std::vector<Request>& requests, bool alone, int n_blocks = 0, bool prefix_caching = true,
                       const std::function<void(EngineConfig&)>& tweak = {}) {
    return test::run_engine(*model_, requests, alone, n_blocks, prefix_caching, tweak);
  }

  // Logits rows of a single-sequence Session run over `tokens`, one per token ([n, vocab]).
  static std::vector<float> session_rows(const std::vector<int32_t>& tokens) {
    SequenceBlocks seq;
    std::vector<float> rows;
    reference_->feed(seq, tokens, ForwardBatch::Logits::All, rows);
    seq.release_all(reference_->pool());
    return rows;
  }
  static std::span<const float> row(const std::vector<float>& rows, size_t i) {
    const size_t n_vocab = reference_->config().n_vocab;
    return std::span<const float>(rows).subspan(i * n_vocab, n_vocab);
  }

  static void expect_close(const Logprobs& got, const Logprobs& want, const std::string& where) {
    EXPECT_EQ(got.chosen.token, want.chosen.token) << where;
    EXPECT_NEAR(got.chosen.logprob, want.chosen.logprob, kLogprobTolerance) << where;
    ASSERT_EQ(got.top.size(), want.top.size()) << where;
    for (size_t i = 0; i < got.top.size(); ++i) {
      EXPECT_EQ(got.top[i].token, want.top[i].token) << where << " top " << i;
      EXPECT_NEAR(got.top[i].logprob, want.top[i].logprob, kLogprobTolerance) << where << " top " << i;
    }
  }
  // Prompt logprobs a request should get: position p from the row of position p - 1.
  static void expect_prompt_logprobs(const RunResult& run, RequestId id, const Request& r) {
    ASSERT_TRUE(run.prompt_logprobs.count(id)) << "request " << id << " got no prompt logprobs";
    const auto& got = *run.prompt_logprobs.at(id);
    ASSERT_EQ(got.size(), r.prompt.size() - 1) << id;
    const std::vector<float> rows = session_rows(r.prompt);
    for (size_t p = 1; p < r.prompt.size(); ++p)
      expect_close(got[p - 1], compute_logprobs(row(rows, p - 1), r.prompt[p], r.prompt_logprobs),
                   "request " + std::to_string(id) + " position " + std::to_string(p));
  }

  static const std::vector<Request>& requests() {
    static const std::vector<Request> reqs = [] {
      std::vector<Request> r;
      for (const char* p : {"The three primary colors are", "def fibonacci(n):", "In 1969, the first humans landed on"})
        r.push_back(greedy(p, 6));
      return r;
    }();
    return reqs;
  }
  // Each request run alone, without prefix caching: the reference.
  static const RunResult& alone() {
    static const RunResult result = run(requests(), true, 0, false);
    return result;
  }

  // The engine computes each row in another batch and chunking than the reference; the
  // CPU kernels are batch-invariant, so this is a margin, not an expected error.
  static constexpr double kLogprobTolerance = 1e-5;
  static ModelEngine* model_;
  static Session* reference_;
};

ModelEngine* EngineRealModel::model_ = nullptr;
Session* EngineRealModel::reference_ = nullptr;

}  // namespace

TEST_F(EngineRealModel, GreedyOutputsBatchedEqualThoseRunAlone) {
  const RunResult together = run(requests(), false, 0, false);
  for (const auto& [id, o] : alone().out) {
    EXPECT_EQ(o.tokens[0].size(), 6u);
    EXPECT_EQ(together.out.at(id).tokens[0], o.tokens[0]) << "request " << id;
  }
  EXPECT_LT(together.stats.steps, alone().stats.steps);  // really batched
}

TEST_F(EngineRealModel, PreemptedAndResumedEqualsUninterrupted) {
  // 3 sequences of ~13 tokens need 4 blocks of 4 each; with 7 blocks some are preempted
  // and recomputed (reusing their cached full blocks where they survived).
  const RunResult tight = run(requests(), false, 7, true);
  EXPECT_GT(tight.stats.preemptions, 0);
  for (const auto& [id, o] : alone().out) EXPECT_EQ(tight.out.at(id).tokens[0], o.tokens[0]) << "request " << id;
}

TEST_F(EngineRealModel, PrefixCacheHitEqualsNoHit) {
  const std::string system = "You are a careful assistant. Answer briefly and precisely. ";
  std::vector<Request> reqs;
  for (const char* q : {"What is the boiling point of water?", "Name a large mammal."})
    reqs.push_back(greedy(system + q, 4));
  const RunResult cached = run(reqs, true, 0, true);
  const RunResult uncached = run(reqs, true, 0, false);
  EXPECT_GE(cached.stats.prefix.hit_tokens, 8);  // the shared system prompt's full blocks
  EXPECT_EQ(uncached.stats.prefix.hit_tokens, 0);
  for (const auto& [id, o] : uncached.out) EXPECT_EQ(cached.out.at(id).tokens[0], o.tokens[0]) << id;
}

TEST_F(EngineRealModel, ForkedChoicesCopyOnWriteTheRealCache) {
  // 3 greedy choices share the prompt's KV; all but the last owner copy its partial block.
  Request r = requests()[0];
  r.n = 3;
  const RunResult forked = run({r}, true);
  EXPECT_EQ(forked.stats.forks, 1);
  EXPECT_EQ(forked.stats.block_copies, r.prompt.size() % 4 != 0 ? 2 : 0);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(forked.out.at(1).tokens[c], alone().out.at(1).tokens[0]) << c;

  // Seeded sampling: choice c equals a single request with seed + c.
  Request sampled = r;
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.seed = 42;
  sampled.sampling.max_tokens = 4;
  sampled.n = 2;
  const RunResult f2 = run({sampled}, true);
  for (int c = 0; c < 2; ++c) {
    Request s1 = sampled;
    s1.n = 1;
    s1.sampling.seed = 42 + c;
    EXPECT_EQ(f2.out.at(1).tokens[c], run({s1}, true).out.at(1).tokens[0]) << c;
  }
}

TEST_F(EngineRealModel, OfflineBatchWritesOneLinePerRequestInOrder) {
  std::istringstream in(
      R"({"prompt": "The three primary colors are", "max_tokens": 6, "temperature": 0, "ignore_eos": true})"
      "\n"
      R"({"prompt": "x", "max_tokens": "10"})"
      "\n"
      "not json\n"
      "\n"  // blank lines are skipped
      R"({"prompt_tokens": [1, 2, 99999999]})"
      "\n"
      R"({"prompt": "def fibonacci(n):", "max_tokens": 6, "temperature": 0, "ignore_eos": true, "n": 2})"
      "\n");
  std::ostringstream out;
  const OfflineBatchSummary summary = run_offline_batch(*model_, in, out, {});
  EXPECT_EQ(summary.n_requests, 5);
  EXPECT_EQ(summary.n_errors, 3);
  EXPECT_EQ(summary.completion_tokens, 6 + 2 * 6);
  std::istringstream lines(out.str());
  std::vector<nlohmann::json> got;
  for (std::string line; std::getline(lines, line);) got.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(got.size(), 5u);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(got[i]["index"], i);
  EXPECT_EQ(got[0]["choices"][0]["token_ids"].get<std::vector<int32_t>>(), alone().out.at(1).tokens[0]);
  EXPECT_EQ(got[0]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(got[0]["choices"][0]["text"], model_->session().tokenizer().decode(alone().out.at(1).tokens[0], true));
  EXPECT_NE(got[1]["error"]["message"].get<std::string>().find("'max_tokens' must be an integer"), std::string::npos);
  EXPECT_EQ(got[1]["error"]["type"], "invalid_request");
  EXPECT_TRUE(got[2].contains("error"));
  EXPECT_NE(got[3]["error"]["message"].get<std::string>().find("outside the vocabulary"), std::string::npos);
  ASSERT_EQ(got[4]["choices"].size(), 2u);
  for (int c = 0; c < 2; ++c)
    EXPECT_EQ(got[4]["choices"][c]["token_ids"].get<std::vector<int32_t>>(), alone().out.at(2).tokens[0]);
  EXPECT_EQ(got[4]["usage"]["completion_tokens"], 12);
}

TEST_F(EngineRealModel, TokenLogprobsEqualASingleSessionRun) {
  std::vector<Request> reqs = requests();
  for (Request& r : reqs) {
    r.logprobs = true;
    r.sampling.n_logprobs = 5;
  }
  const RunResult together = run(reqs, false, 0, false);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const RequestId id = i + 1;
    const auto& tokens = together.out.at(id).tokens[0];
    EXPECT_EQ(tokens, alone().out.at(id).tokens[0]);
    ASSERT_EQ(together.logprobs.at(id)[0].size(), tokens.size());
    std::vector<int32_t> context = reqs[i].prompt;
    context.insert(context.end(), tokens.begin(), tokens.end());
    const std::vector<float> rows = session_rows(context);
    for (size_t t = 0; t < tokens.size(); ++t) {
      const Logprobs want = compute_logprobs(row(rows, reqs[i].prompt.size() - 1 + t), tokens[t], 5);
      expect_close(together.logprobs.at(id)[0][t], want,
                   "request " + std::to_string(id) + " token " + std::to_string(t));
      EXPECT_EQ(want.top[0].token, tokens[t]);  // greedy: the most likely token
    }
  }
}

TEST_F(EngineRealModel, PromptLogprobsEqualATeacherForcedRunWhenChunked) {
  std::vector<Request> reqs;
  for (const char* p : {"The quick brown fox jumps over the lazy dog while the farmer sleeps in the afternoon sun",
                        "Once upon a time"}) {
    Request r = greedy(p, 3);
    r.prompt_logprobs = 3;
    reqs.push_back(r);
  }
  ASSERT_GT(reqs[0].prompt.size(), 16u);
  // 32 tokens a step and 3 logits rows beyond one per sequence: prompts go in small chunks.
  const RunResult chunked = run(reqs, false, 0, true, [](EngineConfig& c) { c.scheduler.max_logits_rows = 11; });
  EXPECT_GT(chunked.stats.steps, static_cast<int64_t>(reqs[0].prompt.size() / 4));
  for (size_t i = 0; i < reqs.size(); ++i) expect_prompt_logprobs(chunked, i + 1, reqs[i]);
  // The outputs do not change.
  const RunResult plain = run({greedy("Once upon a time", 3)}, true, 0, false);
  EXPECT_EQ(chunked.out.at(2).tokens[0], plain.out.at(1).tokens[0]);
}

TEST_F(EngineRealModel, PromptLogprobsUnderPreemptionAndSwap) {
  std::vector<Request> reqs = requests();
  for (Request& r : reqs) {
    r.prompt_logprobs = 2;
    r.logprobs = true;
  }
  for (const PreemptionMode mode : {PreemptionMode::Recompute, PreemptionMode::Swap}) {
    const RunResult tight = run(reqs, false, 7, true, [&](EngineConfig& c) {
      c.scheduler.preemption_mode = mode;
      if (mode == PreemptionMode::Swap) c.n_host_blocks = model_->executor().n_host_blocks();
    });
    EXPECT_GT(tight.stats.preemptions, 0);
    if (mode == PreemptionMode::Swap) {
      EXPECT_GT(tight.stats.swaps_out, 0);
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(tight.out.at(i + 1).tokens[0], alone().out.at(i + 1).tokens[0]) << i;
      EXPECT_EQ(tight.logprobs.at(i + 1)[0].size(), tight.out.at(i + 1).tokens[0].size());
      expect_prompt_logprobs(tight, i + 1, reqs[i]);
    }
  }
}

TEST_F(EngineRealModel, SwappedAndResumedEqualsUninterrupted) {
  const RunResult swapped = run(requests(), false, 7, true, [](EngineConfig& c) {
    c.scheduler.preemption_mode = PreemptionMode::Swap;
    c.n_host_blocks = model_->executor().n_host_blocks();
  });
  EXPECT_GT(swapped.stats.swaps_out, 0);
  EXPECT_EQ(swapped.stats.swaps_in, swapped.stats.swaps_out);
  EXPECT_EQ(swapped.stats.swap_fallbacks, 0);
  EXPECT_EQ(swapped.stats.swap_out_bytes % model_->config().kv_block_bytes, 0);
  EXPECT_GT(swapped.stats.swap_in_bytes, 0);
  for (const auto& [id, o] : alone().out) EXPECT_EQ(swapped.out.at(id).tokens[0], o.tokens[0]) << "request " << id;
}
