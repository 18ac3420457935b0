// Speculative decoding through the engine loop over the simulator. The simulator verifies
// draft tokens like greedy decoding (its next token is a function of the context in KV), so
// every output must equal the run alone token for token, while drafts are accepted and
// rejected, rolled back in the paged cache, preempted (recompute and swap), forked, cached
// as prefixes and aborted.
#include <gtest/gtest.h>

#include <random>

#include "unit/engine/sim_harness.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

SpeculativeConfig ngram(int k, int disable_by_batch_size = 0) {
  SpeculativeConfig c;
  c.method = SpecMethod::Ngram;
  c.num_speculative_tokens = k;
  c.prompt_lookup_min = 1;
  c.prompt_lookup_max = 3;
  c.disable_by_batch_size = disable_by_batch_size;
  // Fixed k: these tests exercise verification, rollback and the KV bookkeeping; whether a
  // draft pays on this machine (the adaptive plan) is timing, tested in spec/step_cost_test.cpp.
  c.adaptive = false;
  return c;
}

// A random workload with aborts and early finishes; returns the engine's stats.
EngineStats run_workload(SimSetup s, uint64_t seed, int n_requests) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  SimEngine e(s);
  std::vector<std::pair<RequestId, Request>> reqs;
  std::set<RequestId> aborted;
  std::set<std::pair<RequestId, int>> finished_early;
  int to_submit = n_requests;
  while (to_submit > 0 || e.core().has_work()) {
    for (int i = rng() % 3; i > 0 && to_submit > 0; --i, --to_submit) {
      // A small alphabet: n-gram matches (so drafts), prefix hits, and both outcomes of
      // verification.
      Request r = greedy_request(random_tokens(rng, 1 + rng() % 60, s.vocab), 1 + rng() % 50);
      r.tenant_salt = std::string(rng() % 2 ? "a" : "b");
      if (rng() % 4 == 0) {
        r.n = 2 + rng() % 2;
        r.sampling.temperature = 1.0f;
        r.sampling.seed = rng();
      }
      if (rng() % 5 == 0) r.sampling.stop_token_ids = {static_cast<int32_t>(rng() % s.vocab)};
      if (rng() % 7 == 0) r.speculative = false;  // the opt-out
      reqs.emplace_back(e.add(r), r);
    }
    if (rng() % 9 == 0) {
      std::vector<RequestId> live;
      for (const auto& [id, o] : e.outputs())
        if (e.core().contains(id)) live.push_back(id);
      if (!live.empty()) {
        const RequestId victim = live[rng() % live.size()];
        e.abort(victim);
        aborted.insert(victim);
      }
    }
    if (rng() % 13 == 0) {
      std::vector<std::pair<RequestId, int>> live;
      for (const auto& [id, o] : e.outputs())
        for (int c = 0; c < static_cast<int>(o.finish.size()); ++c)
          if (e.core().contains(id) && o.finish[c] == FinishReason::None) live.emplace_back(id, c);
      if (!live.empty()) {
        const auto [id, c] = live[rng() % live.size()];
        e.finish_choice(id, c);
        finished_early.insert({id, c});
      }
    }
    const StepResult step = e.step();
    EXPECT_EQ(step.error, "");
    if (::testing::Test::HasFatalFailure()) return {};
    if (e.steps() > 100000) {
      ADD_FAILURE() << "no progress";
      return {};
    }
  }
  expect_exact_or_prefix(e, reqs, aborted, finished_early);
  e.expect_whole();
  return e.core().stats();
}

SimSetup spec_setup() {
  SimSetup s;
  s.n_blocks = 48;
  s.block_size = 4;
  s.max_num_batched_tokens = 48;
  s.max_num_seqs = 8;
  s.max_model_len = 128;
  s.vocab = 12;
  s.eos = 1;
  s.eos_one_in = 60;
  s.max_logits_rows = 8 + 8 * 4;
  s.speculative = ngram(4);
  return s;
}

}  // namespace

// The same workload with a sliding-window pool (window 9, 24 local blocks for sequences of
// up to 32 blocks): local blocks behind the window are dropped as sequences grow, drafts
// roll back, forks share and prefix hits adopt windows; the simulator reads every window's
// oldest key through the local table, so a block dropped too early throws.
TEST(EngineSpecSim, SlidingWindowPoolKeepsOutputsExact) {
  SimSetup s = spec_setup();
  s.window = 9;
  s.n_local_blocks = 24;
  const EngineStats st = run_workload(s, 7, 300);
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_GT(st.spec.accepted_tokens, 50);
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.prefix.hit_tokens, 0);
  EXPECT_GT(st.forks, 5);
}

TEST(EngineSpecSim, OutputsEqualRunsAloneWithRollbackPreemptionAndForks) {
  const EngineStats st = run_workload(spec_setup(), 5, 300);
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_GT(st.spec.drafts, 200);
  EXPECT_GT(st.spec.accepted_tokens, 50);                        // drafts kept: KV kept
  EXPECT_LT(st.spec.accepted_tokens, st.spec.draft_tokens / 2);  // and many rolled back
  EXPECT_GT(st.preemptions, 0);
  EXPECT_GT(st.prefix.hit_tokens, 0);
  EXPECT_GT(st.forks, 5);
  ASSERT_EQ(st.spec.accepted_per_pos.size(), 4u);
  EXPECT_EQ(st.spec.accepted_per_pos[0] + st.spec.accepted_per_pos[1] + st.spec.accepted_per_pos[2] +
                st.spec.accepted_per_pos[3],
            st.spec.accepted_tokens);
  EXPECT_GE(st.spec.accepted_per_pos[0], st.spec.accepted_per_pos[1]);  // a later position needs the earlier
}

TEST(EngineSpecSim, SwapPreemptionAndChunkedPrefillWithDrafts) {
  SimSetup s = spec_setup();
  s.preemption = PreemptionMode::Swap;
  s.n_host_blocks = 24;
  s.long_prefill_token_threshold = 8;  // prompts in chunks
  const EngineStats st = run_workload(s, 6, 200);
  ASSERT_FALSE(::testing::Test::HasFailure());
  EXPECT_GT(st.spec.drafts, 100);
  EXPECT_GT(st.swaps_out, 0);
}

TEST(EngineSpecSim, TheOffSwitchStopsDraftingInLargeBatches) {
  SimSetup s = spec_setup();
  s.speculative = ngram(4, /*disable_by_batch_size=*/1);
  SimEngine e(s);
  // Two requests that repeat themselves: drafts whenever speculation is on.
  std::vector<int32_t> prompt;
  for (int i = 0; i < 16; ++i) prompt.push_back(2 + i % 3);
  const RequestId a = e.add(greedy_request(prompt, 30));
  const RequestId b = e.add(greedy_request(prompt, 30));
  while (e.core().contains(a) && e.core().contains(b)) e.step();
  EXPECT_EQ(e.core().stats().spec.drafts, 0);  // two running: off
  e.run();
  e.expect_whole();
}

// Adaptive draft lengths follow measured step times, which a test cannot fix; what it can fix:
// outputs equal the run alone whatever the plan, and a sequence that keeps matching is never
// left without drafts for good (a probing draft at least every 16 plain steps).
TEST(EngineSpecSim, AdaptiveDraftsKeepOutputsAndNeverStopForGood) {
  SimSetup s = spec_setup();
  s.speculative.adaptive = true;
  SimEngine e(s);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 24; ++i) prompt.push_back(2 + i % 3);
  const Request r = greedy_request(prompt, 100);
  const RequestId id = e.add(r);
  e.run();
  EXPECT_EQ(e.out(id).tokens[0], e.reference(r));
  EXPECT_GE(e.core().stats().spec.drafts, 2);  // 100 tokens: at least the probes
  e.expect_whole();
}

// The adaptive plan with prompt lookup asks for k_max first and cuts each draft to the
// plan's prefix (engine_core.cpp): over a random workload with aborts, forks and preemption
// every output still equals the run alone and no block leaks, whatever the cuts were.
TEST(EngineSpecSim, AdaptiveCutsOfProposedDraftsKeepOutputsExact) {
  SimSetup s = spec_setup();
  s.speculative.adaptive = true;
  for (uint64_t seed : {11u, 12u, 13u}) run_workload(s, seed, 40);
}

TEST(EngineSpecSim, DraftsNeverRunPastMaxTokens) {
  SimSetup s = spec_setup();
  SimEngine e(s);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 40; ++i) prompt.push_back(2 + i % 2);
  for (int max_tokens : {1, 2, 3, 5}) {
    const Request r = greedy_request(prompt, max_tokens);
    const RequestId id = e.add(r);
    e.run();
    EXPECT_EQ(e.out(id).tokens[0], e.reference(r));
    EXPECT_LE(static_cast<int>(e.out(id).tokens[0].size()), max_tokens);
  }
  e.expect_whole();
}

TEST(EngineSpecSim, LogprobsComeWithEveryEmittedTokenFromItsOwnRow) {
  SimSetup s = spec_setup();
  s.eos = -1;
  SimEngine e(s);
  std::mt19937 rng(9);
  std::vector<std::pair<RequestId, Request>> reqs;
  for (int i = 0; i < 12; ++i) {
    Request r = greedy_request(random_tokens(rng, 20 + static_cast<int>(rng() % 20), s.vocab), 30);
    r.logprobs = true;
    r.sampling.n_logprobs = 3;
    if (i % 3 == 0) r.sampling.stop_token_ids = {static_cast<int32_t>(rng() % s.vocab)};  // stops inside drafts
    reqs.emplace_back(e.add(r), r);
  }
  e.run();
  for (const auto& [id, r] : reqs) {
    const Collected& o = e.out(id);
    EXPECT_EQ(o.tokens[0], e.reference(r)) << id;
    const auto want = e.reference_logprobs(r, o.tokens[0]);
    ASSERT_EQ(o.logprobs[0].size(), want.size()) << id;
    for (size_t i = 0; i < want.size(); ++i)
      expect_same_logprobs(o.logprobs[0][i], want[i], "request " + std::to_string(id) + " token " + std::to_string(i));
  }
  EXPECT_GT(e.core().stats().spec.accepted_tokens, 10);
  e.expect_whole();
}
