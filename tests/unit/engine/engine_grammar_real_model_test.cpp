// Structured output through the engine over the real default model (SmolLM2-135M): sampled
// outputs stay inside their grammar with n > 1 choices, with speculative drafts (rejected
// draft tokens roll the grammar back), and beside free requests, whose greedy output does not
// change. Skipped when the model is not in the cache.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine_run_harness.h"
#include "grammar/grammar.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;
using tessera::test::RunResult;
using tessera::test::small_engine_options;

namespace {

std::string model_path() { return test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"); }

class EngineGrammarRealModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_path())) return;
    ModelEngineOptions o = small_engine_options(model_path(), 64, 16, 256);
    o.max_n = 8;
    o.speculative.method = SpecMethod::Ngram;
    o.speculative.num_speculative_tokens = 4;
    o.speculative.prompt_lookup_min = 1;
    o.speculative.prompt_lookup_max = 4;
    model_ = new ModelEngine(o);
    compiler_ = new GrammarCompiler(model_->session().tokenizer(), model_->config().vocab_size);
  }
  static void TearDownTestSuite() {
    delete compiler_;
    delete model_;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "model not found: " << model_path();
  }
  static const Tokenizer& tok() { return model_->session().tokenizer(); }
  static Request request(const std::string& prompt, const std::string& regex, int n, float temperature) {
    Request r;
    r.prompt = tok().encode(prompt, true, false);
    r.n = n;
    r.sampling.temperature = temperature;
    r.sampling.seed = 7;
    r.sampling.max_tokens = 64;
    if (!regex.empty()) r.sampling.grammar = compiler_->compile(GrammarSpec{GrammarSpec::Kind::Regex, regex, {}});
    return r;
  }
  static RunResult run(const std::vector<Request>& reqs, bool spec) {
    return test::run_engine(*model_, reqs, false, 0, true, [&](EngineConfig& c) {
      if (!spec) c.speculative = SpeculativeConfig{};
    });
  }
  // The output text without its end-of-generation token.
  static std::string text(const std::vector<int32_t>& tokens) {
    std::vector<int32_t> t = tokens;
    if (!t.empty() && tok().is_eog(t.back())) t.pop_back();
    return tok().decode(t, false);
  }

  static ModelEngine* model_;
  static GrammarCompiler* compiler_;
};

ModelEngine* EngineGrammarRealModel::model_ = nullptr;
GrammarCompiler* EngineGrammarRealModel::compiler_ = nullptr;

constexpr const char* kDigits = "Copy the digits: 0110 0110 0110 0110 0110 0110 0110 0110.\nDigits: 0110 0110";
constexpr const char* kDigitsRegex = "(0110 ){6}01[01]0";

TEST_F(EngineGrammarRealModel, SampledChoicesStayInTheGrammarWithAndWithoutDrafts) {
  for (const bool spec : {false, true}) {
    std::vector<Request> reqs = {request(kDigits, kDigitsRegex, 4, 1.0f),
                                 request("Is the sky blue? Answer:", "(yes|no), because [a-z ]{1,40}\\.", 3, 1.0f)};
    const RunResult r = run(reqs, spec);
    const std::regex digits(kDigitsRegex), why("(yes|no), because [a-z ]{1,40}\\.");
    for (int c = 0; c < 4; ++c) {
      EXPECT_TRUE(std::regex_match(text(r.out.at(1).tokens[c]), digits)) << text(r.out.at(1).tokens[c]);
      EXPECT_EQ(r.out.at(1).finish[c], FinishReason::Stop);
    }
    for (int c = 0; c < 3; ++c) {
      EXPECT_TRUE(std::regex_match(text(r.out.at(2).tokens[c]), why)) << text(r.out.at(2).tokens[c]);
      EXPECT_EQ(r.out.at(2).finish[c], FinishReason::Stop);
    }
    if (spec) {
      // The copy prompt gets drafts, some kept and some rejected (the grammar rolled back).
      EXPECT_GT(r.stats.spec.accepted_tokens, 0);
      EXPECT_LT(r.stats.spec.accepted_tokens, r.stats.spec.draft_tokens);
    }
  }
}

TEST_F(EngineGrammarRealModel, GreedyConstrainedOutputIsTheSameWithDrafts) {
  const Request r = request(kDigits, kDigitsRegex, 1, 0.0f);
  EXPECT_EQ(run({r}, true).out.at(1).tokens[0], run({r}, false).out.at(1).tokens[0]);
}

TEST_F(EngineGrammarRealModel, FreeRequestsBesideConstrainedOnesAreUnchanged) {
  const Request free = request("The capital of France is", "", 1, 0.0f);
  const RunResult alone = run({free}, false);
  const RunResult mixed = run({free, request(kDigits, kDigitsRegex, 2, 1.0f), free}, false);
  EXPECT_EQ(mixed.out.at(1).tokens[0], alone.out.at(1).tokens[0]);
  EXPECT_EQ(mixed.out.at(3).tokens[0], alone.out.at(1).tokens[0]);
}

}  // namespace
