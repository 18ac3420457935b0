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

Draft propose_tree(const NgramDrafter& d, const std::vector<int32_t>& tokens, int k, bool allow_tree = true) {
  NgramDrafter copy = d;
  const std::vector<DraftQuery> queries = {{.seq = 1, .tokens = tokens, .max_tokens = k, .allow_tree = allow_tree}};
  std::vector<Draft> out(1);
  copy.propose(queries, out);
  return out[0];
}

// What the engine relies on: parents before children, siblings distinct, depth <= k, the cap.
void expect_valid_tree(const Draft& d, int k) {
  ASSERT_EQ(d.parents.size(), d.tokens.size());
  EXPECT_LE(d.tokens.size(), static_cast<size_t>(kMaxDraftTreeNodes));
  EXPECT_TRUE(d.probs.empty());
  std::vector<int> depth(d.tokens.size());
  for (size_t j = 0; j < d.tokens.size(); ++j) {
    const int p = d.parents[j];
    ASSERT_GE(p, -1);
    ASSERT_LT(p, static_cast<int>(j));
    depth[j] = p < 0 ? 1 : depth[static_cast<size_t>(p)] + 1;
    EXPECT_LE(depth[j], k) << "node " << j;
    for (size_t i = 0; i < j; ++i)
      EXPECT_FALSE(d.parents[i] == p && d.tokens[i] == d.tokens[j]) << "siblings " << i << " and " << j;
  }
}
}  // namespace

namespace {

// parse_speculative_config's error message for json, or "(accepted)".
std::string config_message(const char* json) {
  try {
    parse_speculative_config(json);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::string("(accepted)");
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

TEST(NgramDrafterTree, BranchesForEachDistinctContinuationMostRecentFirst) {
  const NgramDrafter d({.prompt_lookup_min = 2, .prompt_lookup_max = 3, .candidates = 3});
  // "3 4" occurs three times before the end, followed by 10 11, 20 21 and (most recently) 30 31.
  const std::vector<int32_t> text = {3, 4, 10, 11, 3, 4, 20, 21, 3, 4, 30, 31, 3, 4};
  const Draft t = propose_tree(d, text, 3);
  expect_valid_tree(t, 3);
  EXPECT_TRUE(t.is_tree());
  // The main chain (nodes 0..2) is the chain propose_one drafts; older continuations follow.
  EXPECT_EQ(propose(d, text, 3), (std::vector<int32_t>{30, 31, 3}));
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{30, 31, 3, 20, 21, 3, 10, 11, 3}));
  EXPECT_EQ(t.parents, (std::vector<int16_t>{-1, 0, 1, -1, 3, 4, -1, 6, 7}));
}

TEST(NgramDrafterTree, MergesSharedPrefixes) {
  const NgramDrafter d({.prompt_lookup_min = 2, .prompt_lookup_max = 3, .candidates = 3});
  // Continuations 5 6 7 (most recent; found by the 3-gram "9 1 2" and again by the 2-gram,
  // which adds nothing and does not count) and 5 6 8: nodes 5 6 7 8, 8 below 6.
  const Draft t = propose_tree(d, {1, 2, 5, 6, 8, 9, 1, 2, 5, 6, 7, 9, 1, 2}, 3);
  expect_valid_tree(t, 3);
  EXPECT_EQ(t.tokens, (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(t.parents, (std::vector<int16_t>{-1, 0, 1, 1}));
}

TEST(NgramDrafterTree, RespectsTheNodeCapAndTheDraftLength) {
  // Ten occurrences of "1 2", each followed by 5 distinct tokens (100 + 10 i ...).
  std::vector<int32_t> text;
  for (int i = 0; i < 10; ++i) {
    text.insert(text.end(), {1, 2});
    for (int j = 0; j < 5; ++j) text.push_back(100 + 10 * i + j);
  }
  text.insert(text.end(), {1, 2});
  // 8 candidates of 5 would be 40 nodes: six whole (30), the seventh cut to its first node.
  const Draft big =
      propose_tree(NgramDrafter({.prompt_lookup_min = 2, .prompt_lookup_max = 2, .candidates = 8}), text, 5);
  expect_valid_tree(big, 5);
  ASSERT_EQ(big.tokens.size(), static_cast<size_t>(kMaxDraftTreeNodes));
  EXPECT_EQ(std::vector<int32_t>(big.tokens.begin(), big.tokens.begin() + 5),
            (std::vector<int32_t>{190, 191, 192, 193, 194}));
  EXPECT_EQ(big.tokens[30], 130);
  EXPECT_EQ(big.parents[30], -1);
  // candidates * max_tokens: 2 candidates of 3 tokens, 6 nodes, depth 3.
  const Draft small =
      propose_tree(NgramDrafter({.prompt_lookup_min = 2, .prompt_lookup_max = 2, .candidates = 2}), text, 3);
  expect_valid_tree(small, 3);
  EXPECT_EQ(small.tokens, (std::vector<int32_t>{190, 191, 192, 180, 181, 182}));
  EXPECT_EQ(small.parents, (std::vector<int16_t>{-1, 0, 1, -1, 3, 4}));
  // max_tokens = 1: one token per candidate, all siblings of the root.
  const Draft flat =
      propose_tree(NgramDrafter({.prompt_lookup_min = 2, .prompt_lookup_max = 2, .candidates = 4}), text, 1);
  expect_valid_tree(flat, 1);
  EXPECT_EQ(flat.tokens, (std::vector<int32_t>{190, 180, 170, 160}));
  EXPECT_EQ(flat.parents, (std::vector<int16_t>{-1, -1, -1, -1}));
  EXPECT_TRUE(propose_tree(NgramDrafter({.prompt_lookup_min = 2, .prompt_lookup_max = 2, .candidates = 4}), text, 0)
                  .tokens.empty());
}

TEST(NgramDrafterTree, ChainsWhereNoTreeIsAllowedOrDistinct) {
  const NgramDrafter d({.prompt_lookup_min = 2, .prompt_lookup_max = 3, .candidates = 3});
  const std::vector<int32_t> text = {3, 4, 10, 11, 3, 4, 20, 21, 3, 4, 30, 31, 3, 4};
  // allow_tree = false, or one candidate: today's chain.
  const Draft no_tree = propose_tree(d, text, 3, /*allow_tree=*/false);
  EXPECT_EQ(no_tree.tokens, (std::vector<int32_t>{30, 31, 3}));
  EXPECT_TRUE(no_tree.parents.empty());
  const Draft one = propose_tree(NgramDrafter({.prompt_lookup_min = 2, .prompt_lookup_max = 3}), text, 3);
  EXPECT_EQ(one.tokens, (std::vector<int32_t>{30, 31, 3}));
  EXPECT_TRUE(one.parents.empty());
  // Two matches with the same continuation: a chain, parents empty.
  const Draft same = propose_tree(d, {1, 2, 5, 6, 7, 1, 2, 5, 6, 7, 1, 2}, 3);
  EXPECT_EQ(same.tokens, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_TRUE(same.parents.empty());
  // The chain is not cut to the tree's node cap: k = 32 > kMaxDraftTreeNodes.
  std::vector<int32_t> long_text;
  for (int i = 0; i < 40; ++i) long_text.push_back(i);
  long_text.insert(long_text.end(), {0, 1});
  const Draft long_chain = propose_tree(d, long_text, 32);
  EXPECT_EQ(long_chain.tokens.size(), 32u);
  EXPECT_TRUE(long_chain.parents.empty());
  // Older continuations that only extend the most recent one (cut by the text's end) leave a
  // chain too: 7 | 7 7 | 7 7 7.
  const Draft extended =
      propose_tree(NgramDrafter({.prompt_lookup_min = 1, .prompt_lookup_max = 1, .candidates = 3}), {7, 7, 7, 7}, 3);
  EXPECT_EQ(extended.tokens, (std::vector<int32_t>{7, 7, 7}));
  EXPECT_TRUE(extended.parents.empty());
  // No match: nothing.
  EXPECT_TRUE(propose_tree(d, {1, 2, 3, 4, 5}, 3).tokens.empty());
}

TEST(NgramDrafterTree, BatchedProposeReplacesStaleTrees) {
  NgramDrafter d({.prompt_lookup_min = 2, .prompt_lookup_max = 2, .candidates = 2});
  const std::vector<int32_t> a = {3, 4, 10, 3, 4, 20, 3, 4}, b = {4, 5, 6};
  const std::vector<DraftQuery> queries = {{.seq = 1, .tokens = a, .max_tokens = 2, .allow_tree = true},
                                           {.seq = 2, .tokens = b, .max_tokens = 2, .allow_tree = true},
                                           {.seq = 3, .tokens = a, .max_tokens = 2, .allow_tree = false}};
  std::vector<Draft> out(3);
  for (Draft& o : out) {
    o.tokens = {99, 98};
    o.parents = {-1, -1};
  }
  d.propose(queries, out);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{20, 3, 10, 3}));
  EXPECT_EQ(out[0].parents, (std::vector<int16_t>{-1, 0, -1, 2}));
  EXPECT_TRUE(out[1].tokens.empty());
  EXPECT_TRUE(out[1].parents.empty());
  EXPECT_EQ(out[2].tokens, (std::vector<int32_t>{20, 3}));
  EXPECT_TRUE(out[2].parents.empty());
}

TEST(SpeculativeConfig, ParsesPromptLookupCandidates) {
  const SpeculativeConfig c =
      parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_candidates": 3})");
  EXPECT_EQ(c.prompt_lookup_candidates, 3);
  EXPECT_EQ(describe_speculative_config(c), "ngram k=3 lookup 2..4 candidates 3 adaptive");
  EXPECT_EQ(parse_speculative_config(R"({"method": "ngram", "num_speculative_tokens": 3})").prompt_lookup_candidates,
            1);
  // make_drafter passes it on: the drafter proposes a tree where one is allowed.
  const auto drafter = make_drafter(c);
  ASSERT_NE(drafter, nullptr);
  const std::vector<int32_t> text = {3, 4, 10, 11, 3, 4, 20, 21, 3, 4, 30, 31, 3, 4};
  const std::vector<DraftQuery> queries = {{.seq = 1, .tokens = text, .max_tokens = 2, .allow_tree = true}};
  std::vector<Draft> out(1);
  drafter->propose(queries, out);
  EXPECT_EQ(out[0].tokens, (std::vector<int32_t>{30, 31, 20, 21, 10, 11}));
  EXPECT_EQ(out[0].parents, (std::vector<int16_t>{-1, 0, -1, 2, -1, 4}));

  for (const char* bad : {R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_candidates": 0})",
                          R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_candidates": 9})"}) {
    const std::string m = config_message(bad);
    EXPECT_NE(m.find("prompt_lookup_candidates"), std::string::npos) << m;
    EXPECT_NE(m.find("outside [1, 8]"), std::string::npos) << m;
  }
  EXPECT_NE(config_message(R"({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_candidates": "3"})")
                .find("must be an integer"),
            std::string::npos);
  EXPECT_NE(config_message(R"({"method": "early_exit", "num_speculative_tokens": 3, "draft_layers": 2,
                        "prompt_lookup_candidates": 2})")
                .find("\"prompt_lookup_candidates\" is only for method \"ngram\""),
            std::string::npos);
  EXPECT_NE(config_message(R"({"method": "ngram", "num_speculative_tokens": 3, "lookahead": 2})")
                .find("prompt_lookup_candidates"),
            std::string::npos);
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
  EXPECT_NE(config_message("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(config_message("[1]").find("JSON object"), std::string::npos);
  EXPECT_NE(config_message(R"({"num_speculative_tokens": 4})").find("\"method\" is required"), std::string::npos);
  EXPECT_NE(config_message(R"({"method": "ngram"})").find("num_speculative_tokens"), std::string::npos);
  EXPECT_NE(config_message(R"({"method": "foo", "num_speculative_tokens": 4})").find("unknown method \"foo\""),
            std::string::npos);
  EXPECT_NE(config_message(R"({"method": "medusa", "num_speculative_tokens": 4})").find("not built yet"),
            std::string::npos);
  EXPECT_NE(config_message(R"({"method": "draft_model", "num_speculative_tokens": 4})").find("needs \"model\""),
            std::string::npos);
  EXPECT_NE(
      config_message(R"({"method": "draft_model", "model": 3, "num_speculative_tokens": 4})").find("model spec string"),
      std::string::npos);
  EXPECT_NE(config_message(R"({"method": "early_exit", "num_speculative_tokens": 4})").find("needs \"draft_layers\""),
            std::string::npos);
  EXPECT_NE(
      config_message(R"({"method": "early_exit", "num_speculative_tokens": 4, "draft_layers": -2})").find("negative"),
      std::string::npos);
  EXPECT_NE(config_message(R"({"method": "early_exit", "model": "m", "num_speculative_tokens": 4, "draft_layers": 2})")
                .find("only for method \"draft_model\""),
            std::string::npos);
  EXPECT_NE(
      config_message(R"({"method": "ngram", "num_speculative_tokens": 4, "draft_layers": 2})").find("draft_layers"),
      std::string::npos);
  EXPECT_NE(config_message(R"({"method": "ngram", "num_speculative_tokens": "4"})").find("must be an integer"),
            std::string::npos);
  EXPECT_NE(config_message(R"({"method": "ngram", "num_speculative_tokens": 0})").find("outside [1, 32]"),
            std::string::npos);
  EXPECT_NE(config_message(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5})")
                .find("prompt_lookup_max"),
            std::string::npos);
  EXPECT_NE(config_message(R"({"method": "ngram", "num_speculative_tokens": 4, "lookahead": 2})").find("unknown key"),
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
