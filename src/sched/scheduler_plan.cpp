// Scheduler::plan(): one step's {sequence -> new tokens}, without changing anything.
// Contract: docs/design/scheduler.md ("A step").
#include <algorithm>
#include <vector>
#include <iterator>
#include <optional>
#include <tuple>

#include "core/draft_tree.h"
#include "sched/scheduler.h"

namespace tessera {

SchedulePlan Scheduler::plan() const {
  SchedulePlan p;
  p.version = version_;
  KvPlan kv(kv_);
  int budget = config_.max_num_batched_tokens;
  int n_partial = 0;
  // Every scheduled sequence may take one logits row (max_num_seqs <= rows); the rest are
  // shared by prompt-logit chunks.
  int extra_rows = config_.logits_rows() - config_.max_num_seqs;
  const bool swap_mode = config_.preemption_mode == PreemptionMode::Swap;
  const bool by_priority = config_.policy == SchedulingPolicy::Priority;
  const auto is_partial = [](const Sequence& s, int n_computed, int n_new) {
    return n_computed + n_new < static_cast<int>(s.tokens.size());
  };
  const auto take_rows = [&](const Sequence& s, ScheduledSeq& sc) {
    std::tie(sc.prompt_rows_begin, sc.prompt_rows_end) = prompt_rows(s, sc.n_computed, sc.n_new);
    const bool samples = !is_partial(s, sc.n_computed, sc.n_new);
    extra_rows -= std::max(0, sc.n_prompt_rows() + (samples ? 1 : 0) - 1);
  };

  // Running sequences in order; victims are taken from the back (running[end..)), so a
  // victim was never scheduled in this plan (or is the sequence being scheduled, which then
  // gives way).
  std::vector<SeqHandle> running;
  running.reserve(running_.size());
  for (const auto& e : running_) running.push_back(e.second);
  size_t end = running.size();
  size_t next_running = 0;                           // running[next_running] is the next one served
  int n_running = static_cast<int>(running.size());  // once this plan commits (the max_num_seqs cap)
  std::optional<OrderKey> last_victim;               // the lowest key preempted so far
  // Preempts running[--last] in `k`: swapped when the mode and the host tier allow, freed
  // otherwise. `record`: into the plan (else a trial on a copy of the KV plan).
  const auto take_victim = [&](KvPlan& k, size_t& last, bool record) {
    const SeqHandle v = running[--last];
    const bool swapped = swap_mode && k.swap_out(slots_[v].kv);
    if (!swapped) k.release(slots_[v].kv);
    if (!record) return;
    (swapped ? p.swapped : p.preempted).push_back(v);
    last_victim = slots_[v].key;
    --n_running;
  };

  // Who is served, in order. FCFS: running sequences, then waiting ones (swapped included).
  // Priority: both merged by key, so a waiting sequence that outranks running ones is
  // served before them and may preempt them.
  std::vector<SeqHandle> order;
  order.reserve(running_.size() + waiting_.size());
  if (by_priority) {
    std::vector<QueueEntry> merged;
    merged.reserve(running_.size() + waiting_.size());
    std::merge(running_.begin(), running_.end(), waiting_.begin(), waiting_.end(), std::back_inserter(merged));
    for (const auto& e : merged) order.push_back(e.second);
  } else {
    order = running;
    for (const auto& e : waiting_) order.push_back(e.second);
  }

  bool admitting = true;
  for (const SeqHandle h : order) {
    if (budget == 0 || static_cast<int>(p.seqs.size()) == config_.max_num_seqs) break;
    const Sequence& s = slots_[h];
    if (s.status == SeqStatus::Running) {
      const size_t i = next_running++;
      // The victims are the last running sequences in order, and nothing after them (waiting
      // ones they outrank included) may start this step.
      if (i >= end) break;
      const int n_new = cap_for_rows(s, s.n_computed(), prefill_chunk(s, s.n_computed(), budget), 1 + extra_rows);
      if (is_partial(s, s.n_computed(), n_new) && n_partial == config_.max_partial_prefills) continue;
      // Draft tokens ride along only where they fit: budget, rows, limits, then KV (a
      // speculative step gives way to a plain one before anyone is preempted).
      int n_draft = draft_allowance(s, budget - n_new, extra_rows);
      if (n_draft > 0 && !kv.reserve(s.kv, {}, n_new + n_draft)) n_draft = 0;
      bool fits = true;
      while (n_draft == 0 && !kv.reserve(s.kv, {}, n_new)) {
        take_victim(kv, end, true);
        if (end == i) {  // it was this sequence itself
          fits = false;
          break;
        }
      }
      if (!fits) break;
      ScheduledSeq sc;
      sc.handle = h;
      sc.n_computed = s.n_computed();
      sc.n_new = n_new + n_draft;
      sc.n_draft = n_draft;
      take_rows(s, sc);
      extra_rows -= n_draft;
      p.seqs.push_back(std::move(sc));
      budget -= n_new + n_draft;
      p.n_tokens += n_new + n_draft;
      if (is_partial(s, s.n_computed(), n_new)) ++n_partial;
      continue;
    }

    // A waiting sequence (swapped ones included). The first that cannot start stops
    // admission: nothing overtakes in its own order, so none starves. FCFS admits nothing
    // after a preemption (memory is short this step); priority admits only sequences that
    // outrank every victim of the step.
    if (admitting) {
      admitting = by_priority ? !last_victim || s.key < *last_victim : p.preempted.empty() && p.swapped.empty();
    }
    if (!admitting) {
      if (by_priority) continue;  // running sequences later in order are still served
      break;
    }
    const bool swapped = s.status == SeqStatus::Swapped;
    std::vector<int32_t> hits;
    if (!swapped && !requests_.at(s.request).spec.prompt_logits) {
      // A full hit must still compute one token to get logits.
      const int max_hit_blocks = (static_cast<int>(s.tokens.size()) - 1) / kv_.block_size();
      hits = kv_.find_prefix(s.kv.root, s.tokens, max_hit_blocks);
    }
    const int n_computed = swapped ? s.n_computed() : static_cast<int>(hits.size()) * kv_.block_size();
    const int n_new = cap_for_rows(s, n_computed, prefill_chunk(s, n_computed, budget), 1 + extra_rows);
    bool fits = !(is_partial(s, n_computed, n_new) && n_partial == config_.max_partial_prefills);
    if (fits && !(n_running < config_.max_num_seqs && kv.reserve(s.kv, hits, n_new))) {
      fits = false;
      if (by_priority) {
        // Room by preemption: running sequences it outranks give way, lowest first, but only
        // if that is enough (tried on a copy of the KV plan first: no victim in vain).
        KvPlan trial = kv;
        size_t last = end;
        int n_run = n_running;
        while (last > next_running && s.key < slots_[running[last - 1]].key) {
          take_victim(trial, last, false);
          --n_run;
          if (n_run < config_.max_num_seqs && trial.reserve(s.kv, hits, n_new)) {
            fits = true;
            break;
          }
        }
        if (fits) {
          while (end > last) take_victim(kv, end, true);
          fits = kv.reserve(s.kv, hits, n_new);  // the trial's exact moves: it succeeds
        }
      }
    }
    if (!fits) {
      admitting = false;
      if (by_priority) continue;
      break;
    }
    ScheduledSeq sc;
    sc.handle = h;
    sc.n_computed = n_computed;
    sc.n_new = n_new;
    sc.hits = std::move(hits);
    sc.from_waiting = true;
    sc.swap_in = swapped;
    take_rows(s, sc);
    p.seqs.push_back(std::move(sc));
    budget -= n_new;
    p.n_tokens += n_new;
    ++n_running;
    if (is_partial(s, n_computed, n_new)) ++n_partial;
  }
  return p;
}

int Scheduler::draft_allowance(const Sequence& s, int budget_left, int rows_left) const {
  if (s.draft.empty() || !s.decoding()) return 0;
  const RequestState& r = requests_.at(s.request);
  // The step that completes an n > 1 prompt samples every choice from one row and forks:
  // drafts start after the fork, each choice with its own.
  if (r.spec.n > 1 && !r.forked) return 0;
  const StopCriteria& stop = r.spec.stop;
  const int n_tokens = static_cast<int>(s.tokens.size());
  // Every draft token kept still leaves room for the token sampled after them: never past
  // max_tokens or max_model_len, so no KV is written for a position that cannot be emitted.
  // max_tokens bounds the tokens a step can emit: a chain's length, a tree's depth (its
  // nodes each take a slot, a row and budget: the other limits count them).
  const int emit_left = stop.max_tokens - s.n_output() - 1;
  int fits = static_cast<int>(s.draft.size());
  if (!s.draft_parents.empty()) {
    const std::vector<int> depth = draft_tree_depths(s.draft_parents);
    for (int j = 0; j < fits; ++j)
      if (depth[static_cast<size_t>(j)] > emit_left) fits = j;  // the longest prefix within the depth
  } else {
    fits = std::min(fits, emit_left);
  }
  const int n = std::min({fits, budget_left, rows_left, config_.max_model_len - n_tokens - 1});
  return std::max(0, n);
}

}  // namespace tessera
