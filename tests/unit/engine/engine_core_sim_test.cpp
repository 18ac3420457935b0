// The engine loop over the simulated executor: outputs against runs alone, KV wholeness,
// preemption, chunked prefill, prefix caching, forks, fairness, failures.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.h"
#include "unit/engine/sim_harness.h"

using namespace tessera;
using namespace tessera::testing;

TEST(EngineSim, OneRequestMatchesTheDirectReference) {
  SimEngine e({});
  const Request r = greedy_request({5, 6, 7, 8, 9, 10, 11}, 20);
  const RequestId id = e.add(r);
  e.run();
  EXPECT_EQ(e.out(id).tokens[0], e.reference(r));
  EXPECT_EQ(e.out(id).finish[0], FinishReason::Length);
  EXPECT_TRUE(e.out(id).done);
  e.expect_whole();
}

TEST(EngineSim, StopTokensAndEosEndAChoice) {
  SimSetup s;
  s.eos = 3;
  s.eos_one_in = 6;
  SimEngine e(s);
  int n_stop = 0;
  std::vector<std::pair<RequestId, Request>> reqs;
  for (int i = 0; i < 20; ++i) {
    Request r = greedy_request({i + 10, i + 20, i + 30}, 40);
    reqs.emplace_back(e.add(r), r);
  }
  e.run();
  for (const auto& [id, r] : reqs) {
    const auto& o = e.out(id);
    EXPECT_EQ(o.tokens[0], e.reference(r));
    if (o.finish[0] == FinishReason::Stop) {
      ++n_stop;
      EXPECT_EQ(o.tokens[0].back(), 3);
    }
  }
  EXPECT_GT(n_stop, 5);  // about 1 in 6 tokens is eos: most of 20 requests stop early

  // A stop token id ends the choice where it first appears.
  Request base = greedy_request({1, 2, 3, 4}, 30);
  base.sampling.ignore_eos = true;
  const auto ref = e.reference(base);
  ASSERT_EQ(ref.size(), 30u);
  Request with_stop = base;
  with_stop.sampling.stop_token_ids = {ref[4]};
  const RequestId id = e.add(with_stop);
  e.run();
  const auto first = std::find(ref.begin(), ref.end(), ref[4]) - ref.begin();
  EXPECT_EQ(e.out(id).tokens[0], std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));
  EXPECT_EQ(e.out(id).finish[0], FinishReason::Stop);
  e.expect_whole();
}

// Many requests with random lengths and arrivals on a tight pool: chunked prefill,
// preemption and resumption happen, and every output equals the request run alone.
TEST(EngineSim, BatchingAndPreemptionChangeNoOutput) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    std::mt19937 rng(seed);
    SimSetup s{.n_blocks = 40,
               .block_size = 4,
               .prefix_caching = seed != 2,
               .max_num_batched_tokens = 24,
               .max_num_seqs = 6,
               .max_partial_prefills = 2};
    SimEngine e(s);
    std::vector<std::pair<RequestId, Request>> reqs;
    int to_submit = 60;
    while (to_submit > 0 || e.core().has_work()) {
      const int arrivals = to_submit > 0 ? static_cast<int>(rng() % 3) : 0;
      for (int i = 0; i < arrivals && to_submit > 0; ++i, --to_submit) {
        Request r = greedy_request(random_tokens(rng, 1 + rng() % 40, s.vocab), 1 + rng() % 60);
        reqs.emplace_back(e.add(r), r);
      }
      e.step();
      ASSERT_FALSE(HasFatalFailure());
      ASSERT_LT(e.steps(), 100000);
    }
    EXPECT_GT(e.core().stats().preemptions, 0) << "the pool was meant to be tight";
    for (const auto& [id, r] : reqs) {
      ASSERT_TRUE(e.out(id).done);
      EXPECT_EQ(e.out(id).tokens[0], e.reference(r)) << "request " << id << " seed " << seed;
      EXPECT_EQ(e.out(id).finish[0], FinishReason::Length);
    }
    e.expect_whole();
  }
}

// Random arrivals, lengths, n, priorities, aborts (mid-prefill and mid-decode) and single
// choices finished early (as on a server's stop string, forked or not yet) on a tight pool,
// thousands of steps: surviving outputs equal runs alone, cut ones are prefixes of them, and
// the pool is whole at the end.
TEST(EngineSim, RandomWorkloadWithAbortsStaysExactAndLeakFree) {
  std::mt19937 rng(77);
  std::mt19937 finish_rng(78);  // early finishes: the workload's own draws stay as they were
  SimSetup s{.n_blocks = 64,
             .block_size = 4,
             .max_num_batched_tokens = 32,
             .max_num_seqs = 8,
             .policy = SchedulingPolicy::Priority,
             .eos = 1,
             .eos_one_in = 40};
  SimEngine e(s);
  std::vector<std::pair<RequestId, Request>> reqs;
  std::set<RequestId> aborted;
  std::set<std::pair<RequestId, int>> finished_early;
  int n_waiting = 0, n_mid_prefill = 0, n_mid_decode = 0;
  int to_submit = 400;
  while (to_submit > 0 || e.core().has_work()) {
    for (int i = rng() % 3; i > 0 && to_submit > 0; --i, --to_submit) {
      // 8 symbols: prefix hits; up to 4 chunks of prefill.
      Request r = greedy_request(random_tokens(rng, 1 + rng() % 120, 8), 1 + rng() % 40);
      r.priority = static_cast<int32_t>(rng() % 3);
      r.tenant_salt = std::string(rng() % 2 ? "a" : "b");  // not `= "a"`: GCC 12 false -Wrestrict (PR 105329)
      if (rng() % 5 == 0) {
        r.n = 2 + rng() % 3;
        r.sampling.temperature = 1.0f;
        r.sampling.seed = rng();
      }
      reqs.emplace_back(e.add(r), r);
    }
    if (rng() % 5 == 0) {
      // Pick a state (waiting, mid-prefill, mid-decode), then a live request in it.
      std::vector<RequestId> in_state[3];
      for (const auto& [id, o] : e.outputs())
        if (e.core().contains(id)) in_state[o.start_step < 0 ? 0 : o.tokens[0].empty() ? 1 : 2].push_back(id);
      const int state = static_cast<int>(rng() % 3);
      if (!in_state[state].empty()) {
        const RequestId victim = in_state[state][rng() % in_state[state].size()];
        (state == 0 ? n_waiting : state == 1 ? n_mid_prefill : n_mid_decode)++;
        e.abort(victim);
        aborted.insert(victim);
      }
    }
    if (finish_rng() % 16 == 0) {
      std::vector<std::pair<RequestId, int>> live;
      for (const auto& [id, o] : e.outputs())
        for (int c = 0; c < static_cast<int>(o.finish.size()); ++c)
          if (e.core().contains(id) && o.finish[c] == FinishReason::None) live.emplace_back(id, c);
      if (!live.empty()) {
        const auto [id, c] = live[finish_rng() % live.size()];
        e.finish_choice(id, c);
        finished_early.insert({id, c});
      }
    }
    e.step();
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_LT(e.steps(), 200000);
  }
  EXPECT_GT(e.steps(), 1000);
  EXPECT_GT(n_waiting, 5);
  EXPECT_GT(n_mid_prefill, 5);
  EXPECT_GT(n_mid_decode, 5);
  EXPECT_GT(finished_early.size(), 20u);
  EXPECT_GT(e.core().stats().preemptions, 0);
  EXPECT_GT(e.core().stats().prefix.hit_tokens, 0);
  EXPECT_GT(e.core().stats().forks, 10);
  EXPECT_GT(e.core().stats().block_copies, 10);
  expect_exact_or_prefix(e, reqs, aborted, finished_early);
  e.expect_whole();
}

TEST(EngineSim, ForkedChoicesShareThePromptsBlocksAndMatchSingleRuns) {
  SimSetup s{.n_blocks = 64, .block_size = 16, .max_num_batched_tokens = 256};
  SimEngine e(s);
  std::mt19937 rng(5);
  Request r;
  r.prompt = random_tokens(rng, 37, s.vocab);  // 2 full blocks + a partial one
  r.n = 4;
  r.sampling.temperature = 0.8f;
  r.sampling.seed = 1000;
  r.sampling.max_tokens = 30;
  const RequestId id = e.add(r);
  e.step();  // the whole prompt in one step, then the fork
  EXPECT_EQ(e.core().stats().forks, 1);
  EXPECT_EQ(e.core().kv().n_blocks() - e.core().kv().n_free(), 3);  // the prompt's blocks, once
  e.step();                                     // every choice writes its first token into the shared partial block
  EXPECT_EQ(e.core().stats().block_copies, 3);  // three copies; the last owner writes in place
  EXPECT_EQ(e.core().kv().n_blocks() - e.core().kv().n_free(), 2 + 4);
  e.run();
  const Collected o = e.out(id);
  for (int c = 0; c < 4; ++c) EXPECT_EQ(o.tokens[c], e.reference(r, c));
  // Each choice equals a single request with that choice's seed.
  for (int c = 0; c < 4; ++c) {
    Request single = r;
    single.n = 1;
    single.sampling.seed = 1000 + c;
    const RequestId sid = e.add(single);
    e.run();
    EXPECT_EQ(o.tokens[c], e.out(sid).tokens[0]) << "choice " << c;
    EXPECT_EQ(o.tokens[c].size(), 30u);
  }
  EXPECT_NE(o.tokens[0], o.tokens[1]);
  e.expect_whole();
}

TEST(EngineSim, PrefixCacheHitsOnlyTheSameTenantAndAdapter) {
  SimSetup s;
  s.n_blocks = 64;
  s.block_size = 4;
  SimEngine e(s);
  std::mt19937 rng(9);
  const auto prompt = random_tokens(rng, 41, s.vocab);  // 10 full blocks + 1
  Request a = greedy_request(prompt, 8);
  a.tenant_salt = "tenant-a";
  const RequestId first = e.add(a);
  e.run();
  EXPECT_EQ(e.core().stats().prefix.hit_tokens, 0);
  EXPECT_GT(e.core().kv().n_cached_free(), 0);

  const RequestId again = e.add(a);  // same tenant: 10 blocks hit
  e.run();
  EXPECT_EQ(e.core().stats().prefix.hit_tokens, 40);
  EXPECT_EQ(e.out(again).tokens[0], e.out(first).tokens[0]);

  Request b = a;
  b.tenant_salt = "tenant-b";  // same tokens, other tenant: no hit
  const RequestId other = e.add(b);
  e.run();
  EXPECT_EQ(e.core().stats().prefix.hit_tokens, 40);
  EXPECT_EQ(e.out(other).tokens[0], e.out(first).tokens[0]);

  Request c = a;
  c.adapter_id = "lora-1";  // same tenant, other adapter: no hit
  e.add(c);
  e.run();
  EXPECT_EQ(e.core().stats().prefix.hit_tokens, 40);

  // A prompt that diverges inside block 3 hits 2 blocks.
  Request d = a;
  d.prompt[9] += 1;
  const RequestId diverged = e.add(d);
  e.run();
  EXPECT_EQ(e.core().stats().prefix.hit_tokens, 48);
  EXPECT_EQ(e.out(diverged).tokens[0], e.reference(d));
  EXPECT_EQ(e.core().stats().prefix.queries, 5);
  e.expect_whole();
}

TEST(EngineSim, AFullHitStillComputesTheLastToken) {
  SimEngine e({});
  const Request r = greedy_request({1, 2, 3, 4, 5, 6, 7, 8}, 5);  // exactly 2 blocks of 4
  const RequestId a = e.add(r);
  e.run();
  const RequestId b = e.add(r);
  e.run();
  EXPECT_EQ(e.core().stats().prefix.hit_tokens, 4);  // block 2 is recomputed for its logits
  EXPECT_EQ(e.out(a).tokens[0], e.out(b).tokens[0]);
  e.expect_whole();
}

TEST(EngineSim, ChunkedPrefillKeepsDecodesGoing) {
  SimSetup s{.n_blocks = 400, .block_size = 16, .max_num_batched_tokens = 64, .max_model_len = 4096};
  SimEngine e(s);
  std::mt19937 rng(3);
  const RequestId decode = e.add(greedy_request({1, 2, 3}, 100));
  e.step();  // prefill of the short one
  const Request long_r = greedy_request(random_tokens(rng, 1000, s.vocab), 4);
  const RequestId prefill = e.add(long_r);
  for (int i = 0; i < 10; ++i) {
    const size_t before = e.out(decode).tokens[0].size();
    const StepResult r = e.step();
    EXPECT_EQ(e.out(decode).tokens[0].size(), before + 1) << "the decode waited for a prefill";
    EXPECT_LE(e.core().stats().scheduled_tokens, 3 + 64 * (i + 2));
  }
  EXPECT_TRUE(e.out(prefill).tokens[0].empty());  // still prefilling, 63 tokens a step
  e.run();
  EXPECT_EQ(e.out(prefill).tokens[0], e.reference(long_r));
  e.expect_whole();
}

TEST(EngineSim, PartialPrefillCapLimitsConcurrentChunks) {
  SimSetup s{.n_blocks = 400,
             .block_size = 16,
             .max_num_batched_tokens = 64,
             .max_partial_prefills = 1,
             .max_model_len = 4096};
  SimEngine e(s);
  std::mt19937 rng(4);
  const RequestId a = e.add(greedy_request(random_tokens(rng, 200, s.vocab), 2));
  const RequestId b = e.add(greedy_request(random_tokens(rng, 200, s.vocab), 2));
  // With one partial prefill at a time, b starts only when a's last chunk is scheduled.
  e.run();
  EXPECT_GE(e.out(b).start_step, 3);  // a needs 4 steps of 64
  EXPECT_EQ(e.out(a).start_step, 0);
  e.expect_whole();

  SimSetup s2 = s;
  s2.max_partial_prefills = 2;
  s2.long_prefill_token_threshold = 32;  // each gets at most 32 a step: both run at once
  SimEngine e2(s2);
  std::mt19937 rng2(4);
  const RequestId a2 = e2.add(greedy_request(random_tokens(rng2, 200, s.vocab), 2));
  const RequestId b2 = e2.add(greedy_request(random_tokens(rng2, 200, s.vocab), 2));
  e2.run();
  EXPECT_EQ(e2.out(a2).start_step, 0);
  EXPECT_EQ(e2.out(b2).start_step, 0);
  e2.expect_whole();
}

TEST(EngineSim, FcfsStartsRequestsInArrivalOrderAndNoneStarves) {
  SimSetup s{.n_blocks = 30, .block_size = 4, .max_num_batched_tokens = 16, .max_num_seqs = 4};
  SimEngine e(s);
  std::mt19937 rng(11);
  std::vector<RequestId> ids;
  for (int i = 0; i < 200; ++i) {
    // Short requests arrive behind long ones: none may overtake.
    const int len = i % 7 == 0 ? 60 : 2 + rng() % 5;
    ids.push_back(e.add(greedy_request(random_tokens(rng, len, s.vocab), 1 + rng() % 20)));
    if (i % 3 == 0) e.step();
  }
  e.run();
  int64_t last_start = -1;
  for (RequestId id : ids) {
    ASSERT_TRUE(e.out(id).done);
    EXPECT_GE(e.out(id).start_step, last_start) << "request " << id << " overtaken";
    last_start = e.out(id).start_step;
  }
  e.expect_whole();
}

TEST(EngineSim, PriorityPolicyAdmitsLowerValuesFirst) {
  SimSetup s;
  s.max_num_seqs = 1;
  s.policy = SchedulingPolicy::Priority;
  SimEngine e(s);
  const RequestId running = e.add(greedy_request({1, 2}, 5));
  e.step();
  Request low = greedy_request({3, 4}, 5);
  low.priority = 5;
  Request high = greedy_request({5, 6}, 5);
  high.priority = -1;
  const RequestId l = e.add(low);
  const RequestId h = e.add(high);
  e.run();
  EXPECT_LT(e.out(running).start_step, e.out(h).start_step);
  EXPECT_LT(e.out(h).start_step, e.out(l).start_step);
  e.expect_whole();
}

TEST(EngineSim, ValidationRejectsWhatCanNeverRun) {
  SimSetup s{.n_blocks = 10, .block_size = 4, .max_model_len = 100};
  SimEngine e(s);
  const auto reason = [&](const Request& r) {
    auto v = e.core().validate(r);
    return v ? v->message : std::string();
  };
  EXPECT_EQ(reason(greedy_request({1, 2}, 10)), "");
  EXPECT_NE(reason(greedy_request({}, 10)).find("empty"), std::string::npos);
  EXPECT_NE(reason(greedy_request({1, 1000}, 10)).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(reason(greedy_request({1, -1}, 10)).find("outside the vocabulary"), std::string::npos);
  EXPECT_NE(reason(greedy_request(std::vector<int32_t>(60, 1), 50)).find("exceeds the context of 100"),
            std::string::npos);
  // 30 + 20 - 1 tokens need 13 blocks of 4; the cache has 10.
  EXPECT_NE(reason(greedy_request(std::vector<int32_t>(30, 1), 20)).find("whole cache has 10"), std::string::npos);
  Request bad_n = greedy_request({1}, 5);
  bad_n.n = 0;
  EXPECT_NE(reason(bad_n).find("n = 0"), std::string::npos);
  Request bad_t = greedy_request({1}, 5);
  bad_t.sampling.temperature = -1;
  EXPECT_NE(reason(bad_t), "");
  EXPECT_THROW(e.core().add(99, bad_t), Error);
  e.expect_whole();
}

namespace {
// Fails the step whose number is `fail_at`, otherwise delegates to the simulator.
class FailingExecutor : public Executor {
 public:
  FailingExecutor(SimulatedExecutor& inner, int fail_at) : inner_(inner), fail_at_(fail_at) {}
  void add_sequence(SeqId s, const SamplingParams& p, std::span<const int32_t> t) override {
    inner_.add_sequence(s, p, t);
  }
  void remove_sequence(SeqId s) override { inner_.remove_sequence(s); }
  size_t n_sequences() const override { return inner_.n_sequences(); }
  void execute(const StepInput& in, StepOutput& out) override {
    if (step_++ == fail_at_) fail("device lost");
    inner_.execute(in, out);
  }
  int max_batch_tokens() const override { return inner_.max_batch_tokens(); }
  int max_logits_rows() const override { return inner_.max_logits_rows(); }

 private:
  SimulatedExecutor& inner_;
  int fail_at_;
  int step_ = 0;
};
}  // namespace

TEST(EngineSim, AFailedStepEndsItsRequestsWithErrorAndLeaksNothing) {
  SimulatorConfig sc;
  sc.vocab_size = 100;
  sc.n_blocks = 32;
  sc.block_size = 4;
  SimulatedExecutor sim(sc);
  FailingExecutor failing(sim, 3);
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = 8;
  ec.scheduler.max_num_seqs = 2;
  ec.n_blocks = 32;
  ec.block_size = 4;
  ec.vocab_size = 100;
  ec.check_invariants = true;
  EngineCore core(ec, failing);
  core.add(1, greedy_request({1, 2, 3}, 10));
  core.add(2, greedy_request({4, 5, 6}, 10));
  core.add(3, greedy_request({7, 8, 9}, 10));  // waits (2 seqs max) and is not in the failed step
  std::map<RequestId, FinishReason> finish;
  std::string error;
  while (core.has_work()) {
    StepResult r = core.step();
    if (!r.error.empty()) error = r.error;
    for (const auto& ev : r.events)
      if (ev.request_done) finish[ev.request] = ev.finish;
  }
  EXPECT_NE(error.find("device lost"), std::string::npos);
  EXPECT_EQ(finish[1], FinishReason::Error);
  EXPECT_EQ(finish[2], FinishReason::Error);
  EXPECT_EQ(finish[3], FinishReason::Length);
  EXPECT_EQ(core.stats().requests_failed, 2);
  EXPECT_TRUE(core.is_idle());
}

TEST(EngineSim, AbortOfEveryStateFreesAtOnce) {
  SimSetup s;
  s.max_num_seqs = 2;
  SimEngine e(s);
  std::mt19937 rng(8);
  const RequestId decoding = e.add(greedy_request({1, 2, 3}, 50));
  const RequestId prefilling = e.add(greedy_request(random_tokens(rng, 200, s.vocab), 5));
  Request forked = greedy_request({4, 5, 6}, 50);
  forked.n = 3;
  const RequestId waiting = e.add(forked);
  for (int i = 0; i < 3; ++i) e.step();
  ASSERT_FALSE(e.out(decoding).tokens[0].empty());
  ASSERT_TRUE(e.out(prefilling).tokens[0].empty());
  ASSERT_EQ(e.out(waiting).start_step, -1);
  e.abort(prefilling);
  e.abort(waiting);
  e.abort(decoding);
  e.abort(decoding);  // twice: no effect
  EXPECT_EQ(e.out(waiting).finish, std::vector<FinishReason>(3, FinishReason::Abort));
  EXPECT_EQ(e.out(decoding).finish[0], FinishReason::Abort);
  EXPECT_FALSE(e.core().has_work());
  e.expect_whole();
}

// Scale: tens of thousands of requests through the simulator in well under a second.
TEST(EngineSim, TwentyThousandRequestsAtScale) {
  // Invariants are O(requests) a step: checked at the end instead.
  SimSetup s{.n_blocks = 2048,
             .block_size = 16,
             .max_num_batched_tokens = 2048,
             .max_num_seqs = 128,
             .max_model_len = 2048,
             .eos = 2,
             .eos_one_in = 50,
             .check_invariants = false};
  SimEngine e(s);
  std::mt19937 rng(21);
  std::vector<int32_t> system_prompt = random_tokens(rng, 64, s.vocab);
  for (int i = 0; i < 20000; ++i) {
    auto p = system_prompt;
    const auto tail = random_tokens(rng, 1 + rng() % 32, s.vocab);
    p.insert(p.end(), tail.begin(), tail.end());
    e.add(greedy_request(p, 1 + rng() % 32));
  }
  e.run();
  const EngineStats st = e.core().stats();
  EXPECT_EQ(st.requests_finished, 20000);
  EXPECT_GT(st.prefix.hit_tokens, 19000 * 64);  // the system prompt is cached
  EXPECT_GT(e.sim().elapsed_seconds(), 0);
  e.expect_whole();
}
