// Swap preemption through the engine loop over the simulator: the simulator keeps its own
// host tier and moves values through the swap lists, so a lost, misplaced or missing swap
// changes outputs. Invariants (device pool and host tier) are checked after every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "core/error.h"
#include "unit/engine/sim_harness.h"

using namespace tessera;
using namespace tessera::testing;

namespace {

SimSetup swap_setup(int n_blocks, int n_host_blocks) {
  SimSetup s{.n_blocks = n_blocks,
             .block_size = 4,
             .max_num_batched_tokens = 16,
             .max_num_seqs = 4,
             .preemption = PreemptionMode::Swap,
             .n_host_blocks = n_host_blocks};
  return s;
}

}  // namespace

TEST(EngineSimSwap, SwappedAndResumedEqualsUninterrupted) {
  // Two long decodes on 10 blocks: the later one is swapped out when the earlier grows.
  SimEngine e(swap_setup(10, 16));
  const Request a = greedy_request({1, 2, 3, 4, 5}, 30);
  const Request b = greedy_request({6, 7, 8}, 30);
  const RequestId ia = e.add(a);
  const RequestId ib = e.add(b);
  e.run();
  EXPECT_EQ(e.out(ia).tokens[0], e.reference(a));
  EXPECT_EQ(e.out(ib).tokens[0], e.reference(b));
  const EngineStats st = e.core().stats();
  EXPECT_GT(st.swaps_out, 0);
  EXPECT_EQ(st.swaps_in, st.swaps_out);  // every swapped sequence came back
  EXPECT_EQ(st.swap_fallbacks, 0);
  EXPECT_EQ(st.swap_out_bytes, e.sim().n_swapped_out_blocks() * 100);  // harness: 100 bytes a block
  EXPECT_EQ(st.swap_in_bytes, e.sim().n_swapped_in_blocks() * 100);
  EXPECT_EQ(st.swap_out_bytes, st.swap_in_bytes);
  EXPECT_EQ(st.host_total_blocks, 16);
  e.expect_whole();
}

TEST(EngineSimSwap, AFullHostTierFallsBackToRecompute) {
  SimEngine e(swap_setup(10, 1));  // room for one block: most victims hold more
  std::vector<std::pair<RequestId, Request>> reqs;
  for (int i = 0; i < 4; ++i) {
    Request r = greedy_request({i + 1, i + 2, i + 3}, 25);
    reqs.emplace_back(e.add(r), r);
  }
  e.run();
  for (const auto& [id, r] : reqs) EXPECT_EQ(e.out(id).tokens[0], e.reference(r)) << id;
  EXPECT_GT(e.core().stats().swap_fallbacks, 0);
  EXPECT_EQ(e.core().stats().preemptions, e.core().stats().swaps_out + e.core().stats().swap_fallbacks);
  e.expect_whole();
}

TEST(EngineSimSwap, SwapModeNeedsAHostTier) {
  SimulatorConfig sc;
  sc.n_blocks = 8;
  sc.block_size = 4;
  sc.n_host_blocks = 4;
  SimulatedExecutor sim(sc);
  EngineConfig ec;
  ec.n_blocks = 8;
  ec.block_size = 4;
  ec.vocab_size = 100;
  ec.scheduler.preemption_mode = PreemptionMode::Swap;
  EXPECT_THROW(EngineCore(ec, sim), Error);  // n_host_blocks = 0
  ec.n_host_blocks = 5;
  EXPECT_THROW(EngineCore(ec, sim), Error);  // more than the executor holds
  ec.n_host_blocks = 4;
  EngineCore ok(ec, sim);
  EXPECT_EQ(ok.stats().host_total_blocks, 4);
}

// Random arrivals, n, priorities and aborts (swapped sequences included) under a tight
// budget in swap mode, thousands of steps with invariants after each: survivors equal runs
// alone, aborted ones are prefixes, device pool and host tier whole at the end.
TEST(EngineSimSwap, RandomWorkloadWithAbortsStaysExactAndLeakFree) {
  std::mt19937 rng(91);
  SimSetup s = swap_setup(48, 40);
  s.max_num_batched_tokens = 24;
  s.max_num_seqs = 8;
  s.eos = 1;
  s.eos_one_in = 50;
  s.policy = SchedulingPolicy::Priority;
  SimEngine e(s);
  std::vector<std::pair<RequestId, Request>> reqs;
  std::set<RequestId> aborted;
  int n_swapped_aborts = 0;
  for (int to_submit = 500; to_submit > 0 || e.core().has_work();) {
    for (int i = rng() % 3; i > 0 && to_submit > 0; --i, --to_submit) {
      Request r = greedy_request(random_tokens(rng, 1 + rng() % 60, 8), 1 + rng() % 50);
      r.priority = static_cast<int32_t>(rng() % 3);
      if (rng() % 5 == 0) {
        r.n = 2 + rng() % 2;
        r.sampling.temperature = 1.0f;
        r.sampling.seed = rng();
      }
      reqs.emplace_back(e.add(r), r);
    }
    if (rng() % 6 == 0) {
      std::vector<RequestId> live;
      for (const auto& [id, o] : e.outputs())
        if (e.core().contains(id)) live.push_back(id);
      if (!live.empty()) {
        const RequestId victim = live[rng() % live.size()];
        const int host_free = e.core().kv().n_host_free();
        e.abort(victim);
        if (e.core().kv().n_host_free() > host_free) ++n_swapped_aborts;
        aborted.insert(victim);
      }
    }
    e.step();
    ASSERT_FALSE(HasFatalFailure());
    ASSERT_LT(e.steps(), 200000);
  }
  const EngineStats st = e.core().stats();
  EXPECT_GT(e.steps(), 1000);
  EXPECT_GT(st.swaps_out, 20);
  EXPECT_GT(st.swaps_in, 20);
  EXPECT_GT(n_swapped_aborts, 0);
  EXPECT_GT(st.forks, 5);
  expect_exact_or_prefix(e, reqs, aborted);
  e.expect_whole();
}

// Swap with a sliding-window pool: only the live window of the local layers goes to the
// host and comes back (the simulator checks each window's oldest key through the local
// table); a long decode holds a few local blocks however long it grows.
TEST(EngineSimSwap, SlidingWindowPoolSwapsOnlyTheWindow) {
  SimSetup s = swap_setup(48, 40);
  s.max_num_batched_tokens = 24;
  s.max_num_seqs = 8;
  s.window = 9;
  s.n_local_blocks = 16;  // (9 - 1 + 24) / 4 + 2 = 10 for a step, a few windows more
  SimEngine e(s);
  std::mt19937 rng(17);
  std::vector<std::pair<RequestId, Request>> reqs;
  for (int i = 0; i < 60; ++i) {
    Request r = greedy_request(random_tokens(rng, 1 + rng() % 40, 6), 20 + rng() % 60);
    if (rng() % 4 == 0) {
      r.n = 2;
      r.sampling.temperature = 1.0f;
      r.sampling.seed = rng();
    }
    reqs.emplace_back(e.add(r), r);
  }
  int max_local_used = 0;
  while (e.core().has_work()) {
    e.step();
    ASSERT_FALSE(HasFatalFailure());
    max_local_used = std::max(max_local_used, e.core().kv().n_local_blocks() - e.core().kv().n_local_free());
  }
  expect_exact_or_prefix(e, reqs, {});
  const EngineStats st = e.core().stats();
  EXPECT_GT(st.swaps_out, 5);
  EXPECT_EQ(st.swaps_in, st.swaps_out);
  EXPECT_LE(max_local_used, 16);
  e.expect_whole();

  // One sequence of 8 + 300 tokens (77 full blocks) never holds more than 3 local blocks.
  s.n_blocks = 80;
  SimEngine one(s);
  const Request r = greedy_request({1, 2, 3, 4, 5, 6, 7, 8}, 300);
  const RequestId id = one.add(r);
  int most = 0;
  while (one.core().has_work()) {
    one.step();
    most = std::max(most, one.core().kv().n_local_blocks() - one.core().kv().n_local_free());
  }
  EXPECT_EQ(one.out(id).tokens[0], one.reference(r));
  EXPECT_LE(most, 4);  // the 8-token prompt's 2, then window 9 + the written block: at most 4
  one.expect_whole();
}

namespace {
// Fails the first swap-out, otherwise delegates to the simulator.
class SwapFailingExecutor : public Executor {
 public:
  explicit SwapFailingExecutor(SimulatedExecutor& inner) : inner_(inner) {}
  void add_sequence(SeqId s, const SamplingParams& p, std::span<const int32_t> t) override {
    inner_.add_sequence(s, p, t);
  }
  void remove_sequence(SeqId s) override { inner_.remove_sequence(s); }
  size_t n_sequences() const override { return inner_.n_sequences(); }
  void execute(const StepInput& in, StepOutput& out) override { inner_.execute(in, out); }
  int max_batch_tokens() const override { return inner_.max_batch_tokens(); }
  int max_logits_rows() const override { return inner_.max_logits_rows(); }
  int n_host_blocks() const override { return inner_.n_host_blocks(); }
  void swap_out(std::span<const BlockSwap> swaps) override {
    if (!swaps.empty() && !failed_) {
      failed_ = true;
      fail("host copy failed");
    }
    inner_.swap_out(swaps);
  }
  void swap_in(std::span<const BlockSwap> swaps) override { inner_.swap_in(swaps); }

 private:
  SimulatedExecutor& inner_;
  bool failed_ = false;
};
}  // namespace

// A step whose swap-out fails ends the swapped requests too (their host copy is not
// trustworthy) along with the step's own; the rest carry on and nothing leaks.
TEST(EngineSimSwap, AFailedSwapEndsTheSwappedRequestsAndLeaksNothing) {
  SimulatorConfig sc;
  sc.vocab_size = 100;
  sc.n_blocks = 10;
  sc.block_size = 4;
  sc.n_host_blocks = 16;
  SimulatedExecutor sim(sc);
  SwapFailingExecutor failing(sim);
  EngineConfig ec;
  ec.scheduler.max_num_batched_tokens = 16;
  ec.scheduler.max_num_seqs = 4;
  ec.scheduler.preemption_mode = PreemptionMode::Swap;
  ec.n_blocks = 10;
  ec.block_size = 4;
  ec.n_host_blocks = 16;
  ec.vocab_size = 100;
  ec.check_invariants = true;
  EngineCore core(ec, failing);
  core.add(1, greedy_request({1, 2, 3, 4, 5}, 30));
  core.add(2, greedy_request({6, 7, 8}, 30));
  std::map<RequestId, FinishReason> finish;
  std::string error;
  while (core.has_work()) {
    const StepResult r = core.step();
    if (!r.error.empty()) error = r.error;
    for (const auto& ev : r.events)
      if (ev.request_done) finish[ev.request] = ev.finish;
  }
  EXPECT_NE(error.find("host copy failed"), std::string::npos);
  EXPECT_EQ(finish[1], FinishReason::Error);  // in the failed step
  EXPECT_EQ(finish[2], FinishReason::Error);  // swapped out in it
  EXPECT_TRUE(core.is_idle());
  EXPECT_EQ(core.kv().n_host_free(), 16);
}
