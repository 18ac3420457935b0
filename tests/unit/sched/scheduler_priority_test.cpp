// The priority policy (docs/design/scheduler.md): a waiting sequence that outranks running
// ones is served before them and, when KV blocks or sequence slots are short, preempts them
// lowest first, recompute or swap, but never in vain; FCFS never preempts for a waiting one.
// Preempted sequences come back with their state intact and their outputs whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "sched/scheduler.h"

using namespace tessera;

namespace {

SchedRequest request(RequestId id, int n_prompt, int max_tokens, int32_t priority) {
  SchedRequest r;
  r.id = id;
  r.prompt.assign(n_prompt, 7);
  r.stop.max_tokens = max_tokens;
  r.priority = priority;
  return r;
}

SchedulerConfig config(SchedulingPolicy policy, int max_seqs = 4, PreemptionMode mode = PreemptionMode::Recompute) {
  SchedulerConfig c;
  c.max_num_batched_tokens = 16;
  c.max_num_seqs = max_seqs;
  c.policy = policy;
  c.preemption_mode = mode;
  return c;
}

struct Outcome {
  int n_tokens = 0;
  FinishReason finish = FinishReason::None;
};

// One step, every sampled token = 5; records each request's tokens and finish.
void step(Scheduler& s, SchedulerOutput& out, std::map<RequestId, Outcome>& seen) {
  out = s.schedule();
  std::vector<int32_t> sampled(out.n_samples(), 5);
  for (const SeqEvent& e : s.update(out, sampled)) {
    if (e.token >= 0) ++seen[e.request].n_tokens;
    if (e.finish != FinishReason::None) seen[e.request].finish = e.finish;
  }
  s.check_invariants();
}

// Two low-priority requests fill a 4-block pool (3-token prompts, 2 blocks each); then a
// high-priority one arrives.
struct FullPool {
  KvBlockManager kv;
  Scheduler s;
  SchedulerOutput out;
  std::map<RequestId, Outcome> seen;
  FullPool(SchedulingPolicy policy, PreemptionMode mode = PreemptionMode::Recompute)
      : kv({.n_blocks = 4, .block_size = 2, .prefix_caching = false, .n_host_blocks = 8}),
        s(config(policy, 4, mode), kv) {
    s.add(request(1, 3, 6, 5));
    s.add(request(2, 3, 6, 5));
    step(s, out, seen);  // both prefill: the pool is full
    EXPECT_EQ(kv.n_free(), 0);
    s.add(request(3, 3, 2, 0));
  }
  void finish() {
    while (s.has_work()) step(s, out, seen);
    EXPECT_TRUE(s.is_idle());
    for (RequestId id : {1, 2}) {
      EXPECT_EQ(seen[id].n_tokens, 6) << "request " << id;
      EXPECT_EQ(seen[id].finish, FinishReason::Length) << "request " << id;
    }
    EXPECT_EQ(seen[3].n_tokens, 2);
  }
};

}  // namespace

TEST(SchedulerPriority, HighPriorityArrivalPreemptsTheLowestRunningOne) {
  FullPool f(SchedulingPolicy::Priority);
  const SeqId victim = f.s.sequence(1).id;  // request 2: same priority as 1, later arrival
  step(f.s, f.out, f.seen);
  ASSERT_EQ(f.out.preempted.size(), 1u);
  EXPECT_EQ(f.out.preempted[0], victim);
  EXPECT_TRUE(f.out.swapped.empty());
  ASSERT_EQ(f.out.started.size(), 1u);
  EXPECT_EQ(f.out.started[0], 3u);
  ASSERT_EQ(f.out.seqs.size(), 2u);
  EXPECT_EQ(f.out.seqs[0].request, 3u);  // served first: it outranks request 1
  EXPECT_EQ(f.out.seqs[0].n_new, 3);
  EXPECT_EQ(f.out.seqs[1].request, 1u);
  EXPECT_EQ(f.s.sequence(1).status, SeqStatus::Waiting);
  EXPECT_EQ(f.s.sequence(1).n_computed(), 0);    // recompute: its KV is gone
  EXPECT_EQ(f.s.sequence(1).tokens.size(), 4u);  // but its prompt and output token stay
  EXPECT_EQ(f.s.stats().preemptions, 1);
  f.finish();
}

TEST(SchedulerPriority, SwapModeSwapsTheVictimOutAndResumesItWhereItStopped) {
  FullPool f(SchedulingPolicy::Priority, PreemptionMode::Swap);
  step(f.s, f.out, f.seen);
  ASSERT_EQ(f.out.swapped.size(), 1u);
  EXPECT_TRUE(f.out.preempted.empty());
  EXPECT_EQ(f.out.swap_out.size(), 2u);
  const Sequence& victim = f.s.sequence(1);
  EXPECT_EQ(victim.status, SeqStatus::Swapped);
  EXPECT_EQ(victim.n_computed(), 3);
  bool swapped_in = false;
  while (f.s.has_work()) {
    step(f.s, f.out, f.seen);
    for (const ScheduledSeq& sc : f.out.seqs) {
      if (sc.request != 2 || swapped_in) continue;
      swapped_in = true;
      EXPECT_GE(f.out.swap_in.size(), 2u);  // request 1 may come back in the same step
      EXPECT_EQ(sc.n_computed, 3);          // no recompute
      EXPECT_EQ(sc.n_new, 1);
    }
  }
  EXPECT_TRUE(swapped_in);
  f.finish();
}

TEST(SchedulerPriority, FcfsNeverPreemptsForAWaitingRequest) {
  FullPool f(SchedulingPolicy::Fcfs);
  step(f.s, f.out, f.seen);
  EXPECT_TRUE(f.out.preempted.empty());
  EXPECT_TRUE(f.out.started.empty());  // waits for blocks, whatever its priority field says
  EXPECT_EQ(f.s.stats().preemptions, 0);
  f.finish();
}

TEST(SchedulerPriority, NoVictimInVainAndNoneThatOutranksTheArrival) {
  KvBlockManager kv({.n_blocks = 4, .block_size = 2, .prefix_caching = false});
  Scheduler s(config(SchedulingPolicy::Priority), kv);
  std::map<RequestId, Outcome> seen;
  SchedulerOutput out;
  s.add(request(1, 3, 1, 1));  // outranks the arrival
  s.add(request(2, 3, 1, 9));
  step(s, out, seen);  // both prefill, and finish at once (max_tokens 1): the pool is free
  s.add(request(3, 3, 4, 1));
  s.add(request(4, 3, 4, 9));
  step(s, out, seen);  // 2 blocks each: full
  EXPECT_EQ(kv.n_free(), 0);
  // Priority 5 needs 4 blocks: preempting request 4 (priority 9) frees only 2 and request 3
  // (priority 1) outranks it, so nobody is preempted and it waits.
  s.add(request(5, 7, 1, 5));
  step(s, out, seen);
  EXPECT_TRUE(out.preempted.empty());
  EXPECT_TRUE(out.started.empty());
  EXPECT_EQ(out.seqs.size(), 2u);
  while (s.has_work()) step(s, out, seen);
  EXPECT_TRUE(s.is_idle());
  EXPECT_EQ(seen[5].n_tokens, 1);
}

TEST(SchedulerPriority, AFullSequenceCapGivesWayToAHigherPriority) {
  KvBlockManager kv({.n_blocks = 32, .block_size = 2, .prefix_caching = false});
  Scheduler s(config(SchedulingPolicy::Priority, /*max_seqs=*/1), kv);
  std::map<RequestId, Outcome> seen;
  SchedulerOutput out;
  s.add(request(1, 2, 8, 3));
  step(s, out, seen);
  s.add(request(2, 2, 3, 3));  // same priority, later: waits
  step(s, out, seen);
  EXPECT_TRUE(out.preempted.empty());
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].request, 1u);
  s.add(request(3, 2, 3, -2));  // outranks request 1: takes its slot
  step(s, out, seen);
  ASSERT_EQ(out.preempted.size(), 1u);
  ASSERT_EQ(out.seqs.size(), 1u);
  EXPECT_EQ(out.seqs[0].request, 3u);
  // Request 3 runs to its end, then 1 (ahead of 2 by arrival) resumes; 2 comes last.
  std::vector<RequestId> finish_order;
  while (s.has_work()) {
    step(s, out, seen);
    for (const auto& [id, o] : seen)
      if (o.finish != FinishReason::None &&
          std::find(finish_order.begin(), finish_order.end(), id) == finish_order.end())
        finish_order.push_back(id);
  }
  EXPECT_EQ(finish_order, (std::vector<RequestId>{3, 1, 2}));
  EXPECT_EQ(seen[1].n_tokens, 8);
  EXPECT_TRUE(s.is_idle());
}

TEST(SchedulerPriority, AWaitingHighPriorityOvertakesEarlierLowOnes) {
  KvBlockManager kv({.n_blocks = 32, .block_size = 2, .prefix_caching = false});
  Scheduler s(config(SchedulingPolicy::Priority, /*max_seqs=*/1), kv);
  std::map<RequestId, Outcome> seen;
  SchedulerOutput out;
  s.add(request(1, 2, 2, -5));  // runs; nobody outranks it
  step(s, out, seen);
  s.add(request(2, 2, 2, 4));
  s.add(request(3, 2, 2, 0));
  std::vector<RequestId> start_order;
  while (s.has_work()) {
    step(s, out, seen);
    EXPECT_TRUE(out.preempted.empty());
    for (RequestId id : out.started) start_order.push_back(id);
  }
  EXPECT_EQ(start_order, (std::vector<RequestId>{3, 2}));
  EXPECT_TRUE(s.is_idle());
}

TEST(SchedulerPriority, PolicyNames) {
  EXPECT_EQ(parse_scheduling_policy("priority"), SchedulingPolicy::Priority);
  EXPECT_EQ(parse_scheduling_policy("fcfs"), SchedulingPolicy::Fcfs);
  EXPECT_EQ(scheduling_policy_name(SchedulingPolicy::Priority), "priority");
  EXPECT_THROW(parse_scheduling_policy("lifo"), Error);
}
