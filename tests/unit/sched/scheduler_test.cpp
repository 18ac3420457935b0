// The scheduler alone: plan is const, commit is the one change, budgets and caps hold,
// victims are the last in order, and update's stop checks.
#include "sched/scheduler.h"

#include <gtest/gtest.h>

#include "core/error.h"

using namespace tessera;

namespace {

SchedRequest request(RequestId id, int n_prompt, int max_tokens, int32_t priority = 0, int n = 1) {
  SchedRequest r;
  r.id = id;
  r.prompt.assign(n_prompt, 7);
  r.stop.max_tokens = max_tokens;
  r.priority = priority;
  r.n = n;
  return r;
}

SchedulerConfig config(int max_tokens, int max_seqs, int max_partial = 4, int max_model_len = 4096) {
  SchedulerConfig c;
  c.max_num_batched_tokens = max_tokens;
  c.max_num_seqs = max_seqs;
  c.max_partial_prefills = max_partial;
  c.max_model_len = max_model_len;
  return c;
}

// Runs one step with every sampled token = `token`.
std::vector<SeqEvent> step(Scheduler& s, SchedulerOutput& out, int32_t token = 5) {
  out = s.schedule();
  std::vector<int32_t> sampled(out.n_samples(), token);
  auto events = s.update(out, sampled);
  s.check_invariants();
  return events;
}

}  // namespace

TEST(Scheduler, PlanIsConstAndAStalePlanIsRefused) {
  KvBlockManager kv({.n_blocks = 16, .block_size = 4});
  Scheduler s(config(8, 4), kv);
  s.add(request(1, 10, 3));
  s.add(request(2, 3, 3));
  const SchedulePlan a = s.plan();
  const SchedulePlan b = s.plan();
  ASSERT_EQ(a.seqs.size(), b.seqs.size());
  EXPECT_EQ(a.n_tokens, 8);
  EXPECT_EQ(kv.n_free(), 16);  // planning took nothing
  EXPECT_EQ(s.n_waiting(), 2u);
  const SchedulerOutput out = s.commit(a);
  EXPECT_THROW(s.commit(b), Error);  // made from the state before a's commit
  EXPECT_EQ(out.n_tokens, 8);
  // Request 1 gets its first 8 tokens (partial prefill); request 2 nothing (budget spent).
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].request, 1u);
  EXPECT_TRUE(out.seqs[0].sample_seqs.empty());  // not at its last token: no logits
  std::vector<int32_t> none;
  s.update(out, none);
  s.check_invariants();
}

TEST(Scheduler, BudgetsAndCapsHoldEveryStep) {
  KvBlockManager kv({.n_blocks = 64, .block_size = 4});
  Scheduler s(config(10, 3, 1), kv);
  for (RequestId id = 1; id <= 8; ++id) s.add(request(id, 1 + id * 3, 4));
  SchedulerOutput out;
  int steps = 0;
  while (s.has_work()) {
    step(s, out);
    EXPECT_LE(out.n_tokens, 10);
    EXPECT_LE(out.seqs.size(), 3u);
    int partial = 0;
    for (const auto& sc : out.seqs)
      if (sc.sample_seqs.empty()) ++partial;
    EXPECT_LE(partial, 1);
    ASSERT_LT(++steps, 1000);
  }
  EXPECT_TRUE(s.is_idle());
}

TEST(Scheduler, PreemptsTheLastRunningSequenceAndResumesIt) {
  KvBlockManager kv({.n_blocks = 4, .block_size = 2, .prefix_caching = false});
  Scheduler s(config(16, 4), kv);
  s.add(request(1, 3, 6));  // 2 blocks now, up to 4 later
  s.add(request(2, 3, 6));
  SchedulerOutput out;
  step(s, out);  // both prefill: 4 blocks, pool full
  EXPECT_EQ(kv.n_free(), 0);
  step(s, out);  // both decode into their second block
  step(s, out);  // both need a third block: request 2 (last) is preempted
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], s.sequence(out.seqs[0].handle).id + 1);  // request 2's sequence
  EXPECT_EQ(s.n_waiting(), 1u);
  EXPECT_EQ(s.stats().preemptions, 1);
  while (s.has_work()) step(s, out);
  EXPECT_TRUE(s.is_idle());
}

TEST(Scheduler, StopChecks) {
  KvBlockManager kv({.n_blocks = 16, .block_size = 4});
  SchedulerConfig c = config(64, 4, 4, 8);
  c.is_eog = [](int32_t t) { return t == 2; };
  Scheduler s(c, kv);
  SchedRequest eos = request(1, 2, 10);
  SchedRequest eos_ignored = request(2, 2, 3);
  eos_ignored.stop.ignore_eos = true;
  SchedRequest stop_id = request(3, 2, 10);
  stop_id.stop.stop_token_ids = {2};
  stop_id.stop.ignore_eos = true;
  SchedRequest long_one = request(4, 5, 100);  // max_model_len 8: 3 output tokens
  for (auto* r : {&eos, &eos_ignored, &stop_id, &long_one}) s.add(*r);
  SchedulerOutput out;
  std::map<RequestId, std::pair<int, FinishReason>> seen;
  while (s.has_work()) {
    for (const SeqEvent& e : step(s, out, 2)) {
      if (e.token >= 0) ++seen[e.request].first;
      if (e.finish != FinishReason::None) seen[e.request].second = e.finish;
    }
  }
  EXPECT_EQ(seen[1], std::make_pair(1, FinishReason::Stop));
  EXPECT_EQ(seen[2], std::make_pair(3, FinishReason::Length));
  EXPECT_EQ(seen[3], std::make_pair(1, FinishReason::Stop));
  EXPECT_EQ(seen[4].second, FinishReason::Stop);  // token 2 is eos for it
  EXPECT_TRUE(s.is_idle());
}

TEST(Scheduler, ForkHappensOnTheStepThatCompletesThePrompt) {
  KvBlockManager kv({.n_blocks = 16, .block_size = 4});
  Scheduler s(config(4, 8), kv);
  s.add(request(1, 6, 2, 0, 3));
  SchedulerOutput out;
  step(s, out);  // tokens 0..3
  EXPECT_EQ(s.n_running(), 1u);
  auto events = step(s, out);  // tokens 4..5, logits sampled 3 times, fork
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].sample_seqs.size(), 3u);
  EXPECT_EQ(s.n_running(), 3u);
  EXPECT_EQ(events.size(), 3u);
  EXPECT_EQ(kv.n_free(), 14);  // 2 blocks shared by 3 sequences
  EXPECT_EQ(kv.ref_count(s.sequence(out.seqs[0].handle).kv.table.blocks[0]), 3);
  while (s.has_work()) step(s, out);
  EXPECT_TRUE(s.is_idle());
}

TEST(Scheduler, SwapModeMovesTheVictimToTheHostTierAndBack) {
  KvBlockManager kv({.n_blocks = 4, .block_size = 2, .prefix_caching = false, .n_host_blocks = 8});
  SchedulerConfig c = config(16, 4);
  c.preemption_mode = PreemptionMode::Swap;
  Scheduler s(c, kv);
  s.add(request(1, 3, 6));
  s.add(request(2, 3, 6));
  SchedulerOutput out;
  step(s, out);
  step(s, out);
  const Sequence& victim = s.sequence(1);  // request 2's sequence (handle 1)
  const std::vector<int32_t> device = victim.kv.table.blocks;
  step(s, out);  // both need a third block: request 2 is swapped out
  ASSERT_EQ(out.swapped.size(), 1u);
  EXPECT_TRUE(out.preempted.empty());
  ASSERT_EQ(out.swap_out.size(), 2u);
  EXPECT_EQ(out.swap_out[0].device, device[0]);
  EXPECT_EQ(out.swap_out[1].device, device[1]);
  EXPECT_EQ(victim.status, SeqStatus::Swapped);
  EXPECT_EQ(victim.n_computed(), 4);  // kept: it resumes where it stopped
  const std::vector<int32_t> host = victim.kv.host_blocks;
  EXPECT_EQ(kv.n_host_free(), 6);
  EXPECT_EQ(s.stats().swap_preemptions, 1);
  bool swapped_in = false;
  while (s.has_work()) {
    step(s, out);
    if (!out.swap_in.empty()) {
      swapped_in = true;
      ASSERT_EQ(out.swap_in.size(), 2u);
      EXPECT_EQ(out.swap_in[0].host, host[0]);
      EXPECT_EQ(out.swap_in[1].host, host[1]);
      ASSERT_EQ(out.seqs.size(), 1u);
      EXPECT_EQ(out.seqs[0].n_computed, 4);  // no recompute
      EXPECT_EQ(out.seqs[0].n_new, 1);
    }
  }
  EXPECT_TRUE(swapped_in);
  EXPECT_EQ(s.stats().swap_fallbacks, 0);
  EXPECT_TRUE(s.is_idle());
}

TEST(Scheduler, PromptLogitRowsFitTheRowBudgetAndComeOnce) {
  KvBlockManager kv({.n_blocks = 32, .block_size = 4});
  SchedulerConfig c = config(64, 2);
  c.max_logits_rows = 5;  // 3 rows beyond one per sequence
  Scheduler s(c, kv);
  SchedRequest r = request(1, 12, 2);
  r.prompt_logits = true;
  s.add(r);
  s.add(request(2, 12, 2));
  SchedulerOutput out;
  std::vector<int32_t> rows_seen;
  while (s.has_work()) {
    step(s, out);
    int rows = 0;
    for (const ScheduledSeq& sc : out.seqs) {
      rows += sc.n_prompt_rows() + (sc.sample_seqs.empty() ? 0 : 1);
      if (sc.request == 1)
        for (int32_t p = sc.prompt_rows_begin; p < sc.prompt_rows_end; ++p) rows_seen.push_back(p);
      else
        EXPECT_EQ(sc.n_prompt_rows(), 0);
    }
    EXPECT_LE(rows, 5);
  }
  std::vector<int32_t> want(11);  // positions 0..10 give prompt tokens 1..11
  for (int i = 0; i < 11; ++i) want[i] = i;
  EXPECT_EQ(rows_seen, want);
  EXPECT_TRUE(s.is_idle());
}
