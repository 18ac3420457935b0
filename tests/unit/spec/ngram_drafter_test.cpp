#include <gtest/gtest.h>

#include "core/error.h"
#include "spec/draft_length.h"
#include "spec/ngram_drafter.h"
#include "spec/spec_config.h"

using namespace tessera;

namespace {
std::vector<int32_t> propose(const NgramDrafter& d, const std::vector<int32_t>& tokens, int k) {
  std::vector<int32_t> out;
  d.propose_one(tokens, k, out);
  return out;
}
}  // namespace

TEST(NgramDrafter, ProposesTheContinuationOfAnEarlierMatch) {
  const NgramDrafter d({.prompt_lookup_min = 2, .prompt_lookup_max = 3});
  // ... 5 6 7 8 9 ... then the text ends in 5 6 7: propose 8 9 10.
  EXPECT_EQ(propose(d, {1, 5, 6, 7, 8, 9, 10, 2, 5, 6, 7}, 3), (std::vector<int32_t>{8, 9, 10}));
  // At most k tokens, and no more than exist after the match.
  EXPECT_EQ(propose(d, {1, 5, 6, 7, 8, 9, 10, 2, 5, 6, 7}, 2), (std::vector<int32_t>{8, 9}));
  EXPECT_EQ(propose(d, {5, 6, 7, 8, 5, 6, 7}, 5), (std::vector<int32_t>{8, 5, 6, 7}));
}

TEST(NgramDrafter, PrefersTheLongestSuffixThenTheMostRecentMatch) {
  const NgramDrafter d({.prompt_lookup_min = 1, .prompt_lookup_max = 3});
  // The 1-gram "7" matches most recently at index 6 (followed by 4), but the 3-gram
  // "5 6 7" matches at 0 (followed by 1): the longer match wins.
  EXPECT_EQ(propose(d, {5, 6, 7, 1, 2, 9, 7, 4, 5, 6, 7}, 1), (std::vector<int32_t>{1}));
  // Two matches of the same 2-gram: the later one's continuation.
  EXPECT_EQ(propose(d, {3, 4, 10, 3, 4, 11, 3, 4}, 1), (std::vector<int32_t>{11}));
}

TEST(NgramDrafter, NothingWithoutAMatchOrBelowTheMinimum) {
  const NgramDrafter d({.prompt_lookup_min = 2, .prompt_lookup_max = 4});
  EXPECT_TRUE(propose(d, {1, 2, 3, 4, 5}, 4).empty());
  EXPECT_TRUE(propose(d, {1, 2, 3, 1}, 4).empty());  // only a 1-gram matches
  EXPECT_TRUE(propose(d, {1}, 4).empty());
  EXPECT_TRUE(propose(d, {1, 2, 1, 2}, 0).empty());
  EXPECT_THROW(NgramDrafter({.prompt_lookup_min = 3, .prompt_lookup_max = 2}), Error);
}

TEST(NgramDrafter, BatchedProposeFillsEveryOutput) {
  NgramDrafter d({.prompt_lookup_min = 1, .prompt_lookup_max = 2});
  const std::vector<int32_t> a = {1, 2, 3, 1}, b = {4, 5, 6};
  const std::vector<DraftQuery> queries = {{1, a, 2}, {2, b, 2}};
  std::vector<Draft> out(2);
  out[1].tokens = {99};  // stale content is replaced
  d.propose(queries, out);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(out[0].probs.empty());
  EXPECT_TRUE(out[1].tokens.empty());
}

TEST(SpeculativeConfig, ParsesVllmsNgramConfig) {
  const SpeculativeConfig c = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 5, "prompt_lookup_min": 2})");
  EXPECT_TRUE(c.enabled());
  EXPECT_EQ(c.method, SpecMethod::Ngram);
  EXPECT_EQ(c.num_speculative_tokens, 4);
  EXPECT_EQ(c.prompt_lookup_max, 5);
  EXPECT_EQ(c.prompt_lookup_min, 2);
  EXPECT_TRUE(c.adaptive);
  EXPECT_EQ(c.disable_by_batch_size, 0);
  EXPECT_FALSE(parse_speculative_config("").enabled());
  const SpeculativeConfig d = parse_speculative_config(
      R"({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 8, "adaptive": false})");
  EXPECT_EQ(d.disable_by_batch_size, 8);
  EXPECT_FALSE(d.adaptive);
  EXPECT_NE(make_drafter(d), nullptr);
  EXPECT_EQ(make_drafter(SpeculativeConfig{}), nullptr);
}

TEST(SpeculativeConfig, MalformedConfigsNameWhatIsWrong) {
  const auto message = [](const char* json) {
    try {
      parse_speculative_config(json);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_NE(message("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(message("[1]").find("JSON object"), std::string::npos);
  EXPECT_NE(message(R"({"num_speculative_tokens": 4})").find("\"method\" is required"), std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram"})").find("num_speculative_tokens"), std::string::npos);
  EXPECT_NE(message(R"({"method": "foo", "num_speculative_tokens": 4})").find("unknown method \"foo\""),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "medusa", "num_speculative_tokens": 4})").find("not built yet"), std::string::npos);
  EXPECT_NE(message(R"({"method": "draft_model", "num_speculative_tokens": 4})").find("needs \"model\""),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "draft_model", "model": 3, "num_speculative_tokens": 4})").find("model spec string"),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "early_exit", "num_speculative_tokens": 4})").find("needs \"draft_layers\""),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "early_exit", "num_speculative_tokens": 4, "draft_layers": -2})").find("negative"),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "early_exit", "model": "m", "num_speculative_tokens": 4, "draft_layers": 2})")
                .find("only for method \"draft_model\""),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 4, "draft_layers": 2})").find("draft_layers"),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": "4"})").find("must be an integer"),
            std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 0})").find("outside [1, 32]"), std::string::npos);
  EXPECT_NE(
      message(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5})").find("prompt_lookup_max"),
      std::string::npos);
  EXPECT_NE(message(R"({"method": "ngram", "num_speculative_tokens": 4, "lookahead": 2})").find("unknown key"),
            std::string::npos);
}

TEST(SpeculativeConfig, ParsesModelDrafterConfigs) {
  const SpeculativeConfig d = parse_speculative_config(
      R"({"method": "draft_model", "model": "smollm2-135m", "num_speculative_tokens": 3, "draft_layers": 6})");
  EXPECT_EQ(d.method, SpecMethod::DraftModel);
  EXPECT_EQ(d.draft_model, "smollm2-135m");
  EXPECT_EQ(d.draft_layers, 6);
  EXPECT_TRUE(d.uses_model());
  EXPECT_EQ(describe_speculative_config(d), "draft_model smollm2-135m layers 6 k=3 adaptive");
  const SpeculativeConfig e =
      parse_speculative_config(R"({"method": "early_exit", "num_speculative_tokens": 4, "draft_layers": 10})");
  EXPECT_EQ(e.method, SpecMethod::EarlyExit);
  EXPECT_EQ(e.draft_layers, 10);
  // The engine builds model drafters (they need the target); make_drafter says so.
  EXPECT_THROW(make_drafter(e), Error);
}

TEST(DraftLength, EstimatesThePerTokenAcceptance) {
  DraftLength d;
  EXPECT_DOUBLE_EQ(d.rate(), DraftLength::kPrior);
  for (int i = 0; i < 40; ++i) d.observe(4, 0);
  EXPECT_LT(d.rate(), 1e-4);
  // Two of four kept, then a rejection: 3 tokens tried, 2 kept.
  for (int i = 0; i < 60; ++i) d.observe(4, 2);
  EXPECT_NEAR(d.rate(), 2.0 / 3.0, 1e-6);
  for (int i = 0; i < 60; ++i) d.observe(4, 4);  // all kept: nothing was rejected
  EXPECT_NEAR(d.rate(), 1.0, 1e-6);
  const double before = d.rate();
  d.observe(0, 0);  // nothing verified: no change
  EXPECT_EQ(d.rate(), before);
  for (int i = 0; i < 40; ++i) d.observe(4, 0);
  for (int i = 0; i < 100; ++i) d.idle();  // not tried for long: back near the prior
  EXPECT_NEAR(d.rate(), DraftLength::kPrior, 0.01);
}
