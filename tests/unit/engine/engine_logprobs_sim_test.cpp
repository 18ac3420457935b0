// Logprobs and prompt logprobs through the engine loop over the simulator, whose stand-in
// log-probabilities are a function of each row's context: every entry must equal the one
// computed directly from the tokens, whatever the chunking, row budget, preemption or swap.
#include <gtest/gtest.h>

#include <random>

#include "unit/engine/sim_harness.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

// Checks one finished request: tokens equal the run alone; token logprobs (when asked)
// and prompt logprobs (when asked) equal the direct reference, with nothing lost or doubled.
void expect_exact(const SimEngine& e, RequestId id, const Request& r) {
  const Collected& o = e.out(id);
  ASSERT_TRUE(o.done) << id;
  for (int c = 0; c < r.n; ++c) {
    EXPECT_EQ(o.tokens[c], e.reference(r, c)) << "request " << id << " choice " << c;
    if (!r.logprobs) {
      EXPECT_TRUE(o.logprobs[c].empty()) << id;
      continue;
    }
    const auto want = e.reference_logprobs(r, o.tokens[c]);
    ASSERT_EQ(o.logprobs[c].size(), want.size()) << id;
    for (size_t i = 0; i < want.size(); ++i)
      expect_same_logprobs(o.logprobs[c][i], want[i], "request " + std::to_string(id) + " token " + std::to_string(i));
  }
  if (r.prompt_logprobs < 0) {
    EXPECT_EQ(o.prompt_logprobs, nullptr) << id;
    return;
  }
  ASSERT_NE(o.prompt_logprobs, nullptr) << "request " << id << " never got its prompt logprobs";
  const auto want = e.reference_prompt_logprobs(r);
  ASSERT_EQ(o.prompt_logprobs->size(), r.prompt.size() - 1) << id;
  for (size_t i = 0; i < want.size(); ++i)
    expect_same_logprobs((*o.prompt_logprobs)[i], want[i],
                         "request " + std::to_string(id) + " prompt position " + std::to_string(i + 1));
}

Request with_logprobs(Request r, int n_logprobs, int prompt_logprobs) {
  r.logprobs = true;
  r.sampling.n_logprobs = n_logprobs;
  r.prompt_logprobs = prompt_logprobs;
  return r;
}

}  // namespace

TEST(EngineSimLogprobs, EveryTokenCarriesItsLogprobsAndAlternatives) {
  SimEngine e({});
  const Request plain = greedy_request({5, 6, 7, 8, 9}, 12);
  const Request asked = with_logprobs(plain, 4, -1);
  const RequestId a = e.add(plain);
  const RequestId b = e.add(asked);
  Request forked = with_logprobs(greedy_request({1, 2, 3}, 6), 2, -1);
  forked.n = 3;
  forked.sampling.temperature = 1.0f;
  forked.sampling.seed = 7;
  const RequestId f = e.add(forked);
  e.run();
  expect_exact(e, a, plain);
  expect_exact(e, b, asked);
  expect_exact(e, f, forked);
  EXPECT_EQ(e.out(b).logprobs[0].size(), 12u);
  EXPECT_EQ(e.out(b).logprobs[0][0].top.size(), 4u);
  e.expect_whole();
}

TEST(EngineSimLogprobs, PromptLogprobsArriveOnceBeforeTheFirstToken) {
  SimSetup s;
  s.max_num_batched_tokens = 64;
  SimEngine e(s);
  std::mt19937 rng(3);
  const Request r = with_logprobs(greedy_request(random_tokens(rng, 30, s.vocab), 5), 1, 3);
  const RequestId id = e.add(r);
  const Request one = with_logprobs(greedy_request({42}, 3), 0, 2);  // no position has a logprob
  const RequestId single = e.add(one);
  Request k0 = greedy_request(random_tokens(rng, 9, s.vocab), 2);
  k0.prompt_logprobs = 0;  // the chosen tokens only
  const RequestId zero = e.add(k0);
  e.run();
  expect_exact(e, id, r);
  expect_exact(e, single, one);
  expect_exact(e, zero, k0);
  EXPECT_TRUE(e.out(single).prompt_logprobs->empty());
  EXPECT_TRUE(e.out(zero).prompt_logprobs->at(0).top.empty());
  e.expect_whole();
}

// A tiny token budget and few spare logits rows: prompt-logprob chunks are cut to the rows
// left, other sequences keep going, and every position comes exactly once.
TEST(EngineSimLogprobs, ChunkedPrefillUnderATightRowBudget) {
  SimSetup s;
  s.max_num_batched_tokens = 16;
  s.max_num_seqs = 4;
  s.max_logits_rows = 7;  // 3 rows beyond one per sequence
  s.n_blocks = 256;
  SimEngine e(s);
  std::mt19937 rng(5);
  std::vector<std::pair<RequestId, Request>> reqs;
  for (int i = 0; i < 12; ++i) {
    Request r = greedy_request(random_tokens(rng, 1 + rng() % 50, s.vocab), 1 + rng() % 10);
    if (i % 2 == 0) r = with_logprobs(r, static_cast<int>(rng() % 3), static_cast<int>(rng() % 3));
    reqs.emplace_back(e.add(r), r);
    if (i % 3 == 0) e.step();
  }
  e.run();
  for (const auto& [id, r] : reqs) expect_exact(e, id, r);
  e.expect_whole();
}

// A prompt-logprob request takes no prefix hits (cached positions have no logits) but
// still publishes its blocks for others.
TEST(EngineSimLogprobs, PromptLogprobRequestsSkipThePrefixCacheButFeedIt) {
  SimEngine e({});
  std::mt19937 rng(8);
  const Request base = greedy_request(random_tokens(rng, 21, 1000), 3);  // 5 full blocks of 4
  e.add(base);
  e.run();
  const int64_t hits_before = e.core().stats().prefix.hit_tokens;
  const Request echo = with_logprobs(base, 0, 1);
  const RequestId id = e.add(echo);
  e.run();
  EXPECT_EQ(e.core().stats().prefix.hit_tokens, hits_before);
  EXPECT_EQ(e.out(id).cached_prompt_tokens, 0);
  expect_exact(e, id, echo);

  // Its blocks are published: a request with another prefix-cache root (tenant) computed
  // by the prompt-logprob request alone hits them.
  Request salted = with_logprobs(base, 0, 2);
  salted.tenant_salt = "t2";
  e.add(salted);
  e.run();
  Request follower = base;
  follower.tenant_salt = "t2";
  const RequestId f = e.add(follower);
  e.run();
  EXPECT_EQ(e.out(f).cached_prompt_tokens, 20);
  EXPECT_EQ(e.core().stats().prefix.hit_tokens, hits_before + 20);
  e.expect_whole();
}

// Random workloads on a tight pool, recompute and swap: preempted prompt-logprob requests
// recompute their prompt without duplicating or losing entries, and token logprobs of
// resumed sequences are those of the run alone.
TEST(EngineSimLogprobs, PreemptionAndSwapNeitherDuplicateNorLoseEntries) {
  for (const PreemptionMode mode : {PreemptionMode::Recompute, PreemptionMode::Swap}) {
    for (uint32_t seed : {1u, 2u}) {
      std::mt19937 rng(seed);
      SimSetup s{.n_blocks = 36,
                 .block_size = 4,
                 .max_num_batched_tokens = 20,
                 .max_num_seqs = 6,
                 .preemption = mode,
                 .n_host_blocks = mode == PreemptionMode::Swap ? 24 : 0,
                 .max_logits_rows = 10};
      SimEngine e(s);
      std::vector<std::pair<RequestId, Request>> reqs;
      for (int to_submit = 50; to_submit > 0 || e.core().has_work();) {
        for (int i = rng() % 3; i > 0 && to_submit > 0; --i, --to_submit) {
          Request r = greedy_request(random_tokens(rng, 1 + rng() % 45, 50), 1 + rng() % 40);
          if (rng() % 2) r = with_logprobs(r, static_cast<int>(rng() % 3), static_cast<int>(rng() % 4) - 1);
          reqs.emplace_back(e.add(r), r);
        }
        e.step();
        ASSERT_FALSE(HasFatalFailure());
        ASSERT_LT(e.steps(), 100000);
      }
      const EngineStats st = e.core().stats();
      EXPECT_GT(st.preemptions, 0) << "the pool was meant to be tight";
      if (mode == PreemptionMode::Swap) {
        EXPECT_GT(st.swaps_out, 0);
      }
      for (const auto& [id, r] : reqs) expect_exact(e, id, r);
      e.expect_whole();
    }
  }
}
