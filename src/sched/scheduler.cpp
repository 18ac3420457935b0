#include "sched/scheduler.h"

#include <algorithm>
#include <tuple>

#include "core/draft_tree.h"
#include "core/error.h"

namespace tessera {

std::string_view finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::None:
      return "none";
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    case FinishReason::Error:
      return "error";
  }
  return "unknown";
}

std::string_view preemption_mode_name(PreemptionMode m) { return m == PreemptionMode::Swap ? "swap" : "recompute"; }

std::string_view scheduling_policy_name(SchedulingPolicy p) {
  return p == SchedulingPolicy::Priority ? "priority" : "fcfs";
}

SchedulingPolicy parse_scheduling_policy(std::string_view name) {
  if (name == "fcfs") return SchedulingPolicy::Fcfs;
  if (name == "priority") return SchedulingPolicy::Priority;
  fail("scheduling policy '", name, "' is not one of fcfs, priority");
}

void SchedulerConfig::validate() const {
  TESSERA_CHECK(max_num_batched_tokens >= 1, "scheduler: max_num_batched_tokens ", max_num_batched_tokens,
                " must be at least 1");
  TESSERA_CHECK(max_num_seqs >= 1, "scheduler: max_num_seqs ", max_num_seqs, " must be at least 1");
  TESSERA_CHECK(max_partial_prefills >= 1, "scheduler: max_partial_prefills ", max_partial_prefills,
                " must be at least 1");
  TESSERA_CHECK(long_prefill_token_threshold >= 0, "scheduler: long_prefill_token_threshold ",
                long_prefill_token_threshold, " is negative");
  TESSERA_CHECK(max_model_len >= 2, "scheduler: max_model_len ", max_model_len, " must be at least 2");
  TESSERA_CHECK(max_logits_rows == 0 || max_logits_rows >= max_num_seqs, "scheduler: max_logits_rows ", max_logits_rows,
                " is below max_num_seqs ", max_num_seqs);
}

int SchedulerOutput::n_samples() const {
  int n = 0;
  for (const auto& s : seqs) n += static_cast<int>(s.sample_seqs.size());
  return n;
}

Scheduler::Scheduler(const SchedulerConfig& config, KvBlockManager& kv) : config_(config), kv_(kv) {
  config_.validate();
}

Scheduler::~Scheduler() {
  // Give the blocks back so the pool (which may outlive us) stays whole.
  for (RequestId id : request_ids()) abort(id);
}

std::vector<RequestId> Scheduler::request_ids() const {
  std::vector<RequestId> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, r] : requests_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

SeqHandle Scheduler::new_slot() {
  if (!free_slots_.empty()) {
    const SeqHandle h = free_slots_.back();
    free_slots_.pop_back();
    return h;
  }
  slots_.emplace_back();
  return static_cast<SeqHandle>(slots_.size() - 1);
}

OrderKey Scheduler::order_key(const RequestState& r, int choice) const {
  const int64_t prio = config_.policy == SchedulingPolicy::Priority ? r.spec.priority : 0;
  return OrderKey{prio, r.arrival, choice};
}

SeqId Scheduler::add(SchedRequest request) {
  TESSERA_CHECK(!request.prompt.empty(), "scheduler: request ", request.id, " has an empty prompt");
  TESSERA_CHECK(request.n >= 1, "scheduler: request ", request.id, " asks for n = ", request.n);
  TESSERA_CHECK(!requests_.count(request.id), "scheduler: request id ", request.id, " is already in use");
  TESSERA_CHECK(static_cast<int>(request.prompt.size()) < config_.max_model_len, "scheduler: request ", request.id,
                " prompt of ", request.prompt.size(), " tokens leaves no room in max_model_len ",
                config_.max_model_len);
  const RequestId id = request.id;
  RequestState r;
  r.arrival = next_arrival_++;
  r.first_seq = next_seq_id_;
  next_seq_id_ += request.n;
  r.n_live = request.n;
  r.seqs.assign(request.n, UINT32_MAX);
  r.spec = std::move(request);
  const SeqHandle h = new_slot();
  Sequence& s = slots_[h];
  s = Sequence{};
  s.id = r.first_seq;
  s.request = id;
  s.choice = 0;
  s.key = order_key(r, 0);
  s.status = SeqStatus::Waiting;
  s.tokens = r.spec.prompt;
  s.n_prompt = static_cast<int32_t>(s.tokens.size());
  s.kv.root = r.spec.prefix_root;
  r.seqs[0] = h;
  waiting_.insert({s.key, h});
  const SeqId first = r.first_seq;
  requests_.emplace(id, std::move(r));
  ++version_;
  return first;
}

size_t Scheduler::n_swapped() const {
  size_t n = 0;
  for (const auto& [key, h] : waiting_) n += slots_[h].status == SeqStatus::Swapped;
  return n;
}

size_t Scheduler::n_live_choices() const {
  size_t n = 0;
  for (const auto& [id, r] : requests_) n += r.n_live;
  return n;
}

int Scheduler::prefill_chunk(const Sequence& s, int n_computed, int budget) const {
  int n = std::min(static_cast<int>(s.tokens.size()) - n_computed, budget);
  if (config_.long_prefill_token_threshold > 0) n = std::min(n, config_.long_prefill_token_threshold);
  return n;
}

std::pair<int32_t, int32_t> Scheduler::prompt_rows(const Sequence& s, int n_computed, int n_new) const {
  const RequestState& r = requests_.at(s.request);
  if (!r.spec.prompt_logits) return {0, 0};
  // Row p gives the logprob of prompt token p + 1, so rows run up to n_prompt - 2.
  const int32_t begin = std::max(n_computed, r.prompt_rows_next);
  const int32_t end = std::min(n_computed + n_new, s.n_prompt - 1);
  return end > begin ? std::pair{begin, end} : std::pair{0, 0};
}

int Scheduler::cap_for_rows(const Sequence& s, int n_computed, int n_new, int rows) const {
  const RequestState& r = requests_.at(s.request);
  if (!r.spec.prompt_logits) return n_new;
  const int lo = std::max(n_computed, static_cast<int>(r.prompt_rows_next));
  if (lo >= s.n_prompt - 1) return n_new;  // no prompt row left
  // A chunk of n takes min(n_computed + n, n_prompt - 1) - lo prompt rows, plus the sampled
  // row when it ends the prompt (then n_prompt - lo in all): at most `rows` when
  // n <= lo - n_computed + rows.
  return std::min(n_new, lo - n_computed + rows);
}

SchedulerOutput Scheduler::commit(const SchedulePlan& p) {
  TESSERA_CHECK(p.version == version_, "scheduler: plan made from state ", p.version, " committed at state ", version_);
  ++version_;
  SchedulerOutput out;
  out.step = static_cast<uint64_t>(stats_.steps++);
  // Releases first (swap-outs take host slots), then swap-ins and prefix adoptions, then
  // allocations: the order KvPlan simulated, so every allocation below succeeds.
  for (SeqHandle h : p.preempted) {
    out.preempted.push_back(slots_[h].id);
    preempt(h, false, out.swap_out);
  }
  for (SeqHandle h : p.swapped) {
    out.swapped.push_back(slots_[h].id);
    preempt(h, true, out.swap_out);
  }
  // Adoptions before swap-ins: a swap-in takes fresh blocks and may evict a free cached one,
  // which must not be a block another sequence of this plan adopts.
  for (const ScheduledSeq& sc : p.seqs) {
    Sequence& s = slots_[sc.handle];
    if (sc.from_waiting && !sc.swap_in && kv_.prefix_caching() && !requests_.at(s.request).spec.prompt_logits) {
      kv_.adopt_prefix(s.kv, sc.hits);
      kv_.record_lookup(static_cast<int>(s.tokens.size()), static_cast<int>(sc.hits.size()) * kv_.block_size());
    }
  }
  for (const ScheduledSeq& sc : p.seqs) {
    if (!sc.swap_in) continue;
    Sequence& s = slots_[sc.handle];
    TESSERA_CHECK(s.status == SeqStatus::Swapped && kv_.swap_in(s.kv, out.swap_in), "scheduler: plan reserved ",
                  "the swap-in of sequence ", s.id, " but it failed");
  }
  for (const ScheduledSeq& plan_sc : p.seqs) {
    Sequence& s = slots_[plan_sc.handle];
    TESSERA_CHECK(s.n_computed() == plan_sc.n_computed, "scheduler: sequence ", s.id, " computed count moved");
    const bool ok = kv_.allocate_slots(s.kv, plan_sc.n_new, out.copies);
    TESSERA_CHECK(ok, "scheduler: plan reserved KV for sequence ", s.id, " but allocation failed");
    RequestState& r = requests_.at(s.request);
    if (plan_sc.from_waiting) {
      waiting_.erase({s.key, plan_sc.handle});
      running_.insert({s.key, plan_sc.handle});
      s.status = SeqStatus::Running;
      if (!r.started) {
        r.started = true;
        out.started.push_back(r.spec.id);
      }
    }
    ScheduledSeq sc;
    sc.handle = plan_sc.handle;
    sc.seq = s.id;
    sc.request = s.request;
    sc.n_computed = plan_sc.n_computed;
    sc.n_new = plan_sc.n_new;
    sc.prompt_rows_begin = plan_sc.prompt_rows_begin;
    sc.prompt_rows_end = plan_sc.prompt_rows_end;
    sc.n_draft = plan_sc.n_draft;
    TESSERA_CHECK(sc.n_draft == 0 || (s.decoding() && sc.n_draft <= static_cast<int>(s.draft.size())),
                  "scheduler: sequence ", s.id, " scheduled ", sc.n_draft, " draft tokens it does not have");
    stats_.draft_tokens_scheduled += sc.n_draft;
    if (sc.n_computed + sc.n_new - sc.n_draft == static_cast<int>(s.tokens.size())) {
      if (!r.forked && r.spec.n > 1) {
        for (int c = 0; c < r.spec.n; ++c) sc.sample_seqs.push_back(r.first_seq + c);
      } else {
        sc.sample_seqs.push_back(s.id);
      }
    }
    out.n_tokens += sc.n_new;
    out.seqs.push_back(std::move(sc));
  }
  stats_.scheduled_tokens += out.n_tokens;
  return out;
}

void Scheduler::preempt(SeqHandle h, bool swap, std::vector<BlockSwap>& swaps) {
  Sequence& s = slots_[h];
  TESSERA_CHECK(s.status == SeqStatus::Running, "scheduler: preempting sequence ", s.id, " that is not running");
  s.draft.clear();
  s.draft_parents.clear();
  if (swap) {
    TESSERA_CHECK(kv_.swap_out(s.kv, swaps), "scheduler: plan reserved host slots for sequence ", s.id,
                  " but the swap-out failed");
    s.status = SeqStatus::Swapped;
    ++stats_.swap_preemptions;
  } else {
    // In swap mode a recompute means the host tier was full.
    if (config_.preemption_mode == PreemptionMode::Swap) ++stats_.swap_fallbacks;
    kv_.free(s.kv);
    s.status = SeqStatus::Waiting;
  }
  running_.erase({s.key, h});
  waiting_.insert({s.key, h});
  ++s.n_preemptions;
  ++stats_.preemptions;
}

std::vector<SeqEvent> Scheduler::update(const SchedulerOutput& out, std::span<const int32_t> sampled,
                                        std::span<const int32_t> counts) {
  const size_t n_samples = static_cast<size_t>(out.n_samples());
  TESSERA_CHECK(counts.empty() || counts.size() == n_samples, "scheduler: ", counts.size(), " token counts for ",
                n_samples, " samples");
  size_t n_sampled = counts.empty() ? n_samples : 0;
  for (int32_t c : counts) n_sampled += static_cast<size_t>(c);
  TESSERA_CHECK(sampled.size() == n_sampled, "scheduler: ", sampled.size(), " sampled tokens for ", n_sampled,
                " expected");
  ++version_;
  std::vector<SeqEvent> events;
  size_t k = 0;       // next token in `sampled`
  size_t target = 0;  // next sample target
  for (const ScheduledSeq& sc : out.seqs) {
    Sequence& s = slots_[sc.handle];
    TESSERA_CHECK(s.id == sc.seq && s.status == SeqStatus::Running, "scheduler: sequence ", sc.seq,
                  " changed between commit and update");
    if (sc.n_draft > 0) {
      const size_t count = counts.empty() ? 1 : static_cast<size_t>(counts[target]);
      TESSERA_CHECK(sc.sample_seqs.size() == 1 && count >= 1 && count <= static_cast<size_t>(sc.n_draft) + 1,
                    "scheduler: ", count, " tokens for sequence ", s.id, " that verified ", sc.n_draft,
                    " draft tokens");
      update_speculative(s, sc, sampled.subspan(k, count), events);
      k += count;
      ++target;
      continue;
    }
    s.draft.clear();
    s.draft_parents.clear();
    s.kv.add_computed(sc.n_new);
    kv_.cache_full_blocks(s.kv, s.tokens);
    if (sc.prompt_rows_end > sc.prompt_rows_begin) {
      RequestState& r = requests_.at(s.request);
      r.prompt_rows_next = std::max(r.prompt_rows_next, sc.prompt_rows_end);
    }
    if (sc.sample_seqs.empty()) continue;
    for (size_t i = 0; i < sc.sample_seqs.size(); ++i)
      TESSERA_CHECK(counts.empty() || counts[target + i] == 1, "scheduler: ", counts[target + i],
                    " tokens for sequence ", sc.sample_seqs[i], " that verified no draft");
    const auto tokens = sampled.subspan(k, sc.sample_seqs.size());
    k += sc.sample_seqs.size();
    target += sc.sample_seqs.size();
    if (sc.sample_seqs.size() > 1)
      fork(sc.handle, tokens, events);
    else
      append_token(s, tokens[0], events);
  }
  return events;
}

void Scheduler::update_speculative(Sequence& s, const ScheduledSeq& sc, std::span<const int32_t> tokens,
                                   std::vector<SeqEvent>& events) {
  // tokens = the accepted draft prefix, then one sampled token. The KV written this step
  // holds the last token and all n_draft draft tokens; keep the last token and the accepted
  // ones, give back the rest.
  const int n_accepted = static_cast<int>(tokens.size()) - 1;
  // A chain's accepted tokens are its first ones; a tree's, a path from its root (the
  // executor moved that path's KV to these positions).
  const auto nodes = std::span(s.draft).first(static_cast<size_t>(sc.n_draft));
  for (int j = 0, node = -1; j < n_accepted; ++j) {
    const int next = s.draft_parents.empty()
                         ? j
                         : draft_tree_child(nodes, std::span(s.draft_parents).first(nodes.size()), node, tokens[j]);
    TESSERA_CHECK(next >= 0 && next < sc.n_draft && tokens[j] == s.draft[next], "scheduler: accepted token ", j,
                  " of sequence ", s.id, " is not its draft token");
    node = next;
  }
  s.kv.add_computed(sc.n_new);
  kv_.truncate(s.kv, sc.n_computed + 1 + n_accepted);
  // The prefix index sees the accepted tokens in place (verified: they are output now).
  const size_t n_before = s.tokens.size();
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.begin() + n_accepted);
  kv_.cache_full_blocks(s.kv, s.tokens);
  s.tokens.resize(n_before);
  s.draft.clear();
  s.draft_parents.clear();
  for (const int32_t token : tokens) {
    append_token(s, token, events);
    if (s.status == SeqStatus::Finished) break;  // a stop: the tokens after it are dropped
  }
}

void Scheduler::set_draft(SeqHandle h, std::vector<int32_t> draft, std::vector<int16_t> parents) {
  Sequence& s = slots_.at(h);
  TESSERA_CHECK(s.decoding(), "scheduler: draft for sequence ", s.id, " that is not decoding");
  TESSERA_CHECK(parents.empty() || parents.size() == draft.size(), "scheduler: a draft tree of ", draft.size(),
                " tokens with ", parents.size(), " parents");
  ++version_;
  s.draft = std::move(draft);
  s.draft_parents = std::move(parents);
}

std::vector<SeqHandle> Scheduler::decoding_sequences() const {
  std::vector<SeqHandle> out;
  for (const auto& [key, h] : running_)
    if (slots_[h].decoding()) out.push_back(h);
  return out;
}

void Scheduler::fork(SeqHandle parent_handle, std::span<const int32_t> tokens, std::vector<SeqEvent>& events) {
  const Sequence& parent0 = slots_[parent_handle];
  RequestState& r = requests_.at(parent0.request);
  TESSERA_CHECK(!r.forked && static_cast<int>(tokens.size()) == r.spec.n, "scheduler: bad fork of request ", r.spec.id);
  r.forked = true;
  ++stats_.forks;
  for (int c = 1; c < r.spec.n; ++c) {
    const SeqHandle h = new_slot();  // may move slots_: look the parent up again
    const Sequence& parent = slots_[parent_handle];
    Sequence& child = slots_[h];
    child = Sequence{};
    child.id = r.first_seq + c;
    child.request = parent.request;
    child.choice = c;
    child.key = order_key(r, c);
    child.status = SeqStatus::Running;
    child.tokens = parent.tokens;
    child.n_prompt = parent.n_prompt;
    kv_.fork(parent.kv, child.kv);
    r.seqs[c] = h;
    running_.insert({child.key, h});
  }
  // Append after every child exists, so a child finishing at once does not free the
  // request before its siblings are made. Choices finished early (finish_choice before the
  // fork) end here instead, dropping their token.
  const std::vector<SeqHandle> handles = r.seqs;
  const std::vector<FinishReason> early = std::move(r.finish_at_fork);
  for (int c = 0; c < static_cast<int>(handles.size()); ++c) {
    if (!early.empty() && early[c] != FinishReason::None)
      finish(slots_[handles[c]], early[c], events, -1);
    else
      append_token(slots_[handles[c]], tokens[c], events);
  }
}

FinishReason Scheduler::stop_reason(const Sequence& s, const StopCriteria& stop, int32_t token) const {
  if (!stop.ignore_eos && config_.is_eog && config_.is_eog(token)) return FinishReason::Stop;
  if (std::find(stop.stop_token_ids.begin(), stop.stop_token_ids.end(), token) != stop.stop_token_ids.end())
    return FinishReason::Stop;
  if (s.n_output() >= stop.max_tokens) return FinishReason::Length;
  if (static_cast<int>(s.tokens.size()) >= config_.max_model_len) return FinishReason::Length;
  return FinishReason::None;
}

void Scheduler::append_token(Sequence& s, int32_t token, std::vector<SeqEvent>& events) {
  s.tokens.push_back(token);
  const FinishReason reason = stop_reason(s, requests_.at(s.request).spec.stop, token);
  if (reason != FinishReason::None) {
    finish(s, reason, events, token);
    return;
  }
  events.push_back(SeqEvent{s.request, s.id, s.choice, token, FinishReason::None, false, std::nullopt});
}

void Scheduler::finish(Sequence& s, FinishReason reason, std::vector<SeqEvent>& events, int32_t token) {
  const SeqHandle h = static_cast<SeqHandle>(&s - slots_.data());
  kv_.free(s.kv);  // device blocks and host slots
  (s.status == SeqStatus::Running ? running_ : waiting_).erase({s.key, h});
  s.status = SeqStatus::Finished;
  const RequestId id = s.request;
  const SeqId seq = s.id;
  const int32_t choice = s.choice;
  s.tokens = {};  // give the memory back now; the slot is reused
  s.draft = {};
  s.draft_parents = {};
  free_slots_.push_back(h);
  RequestState& r = requests_.at(id);
  r.seqs[choice] = UINT32_MAX;
  const bool done = --r.n_live == 0;
  events.push_back(SeqEvent{id, seq, choice, token, reason, done, std::nullopt});
  if (done) requests_.erase(id);
}

std::vector<SeqEvent> Scheduler::abort(RequestId id, FinishReason reason) {
  std::vector<SeqEvent> events;
  const auto it = requests_.find(id);
  if (it == requests_.end()) return events;
  ++version_;
  RequestState& r = it->second;
  const int n = r.spec.n;
  // Choices never forked end too, so a reader sees every choice finish.
  const bool unforked = !r.forked;
  for (int c = 0; c < n; ++c) {
    RequestState& rr = requests_.at(id);
    const SeqHandle h = rr.seqs[c];
    if (h != UINT32_MAX) {
      finish(slots_[h], reason, events, -1);
    } else if (unforked && c > 0) {
      const bool done = --rr.n_live == 0;
      events.push_back(SeqEvent{id, rr.first_seq + c, c, -1, reason, done, std::nullopt});
      if (done) requests_.erase(id);
    }
    if (!requests_.count(id)) break;
  }
  return events;
}

std::vector<SeqEvent> Scheduler::finish_choice(RequestId id, int32_t choice, FinishReason reason) {
  TESSERA_CHECK(reason != FinishReason::None, "scheduler: finishing choice ", choice, " of request ", id,
                " without a reason");
  std::vector<SeqEvent> events;
  const auto it = requests_.find(id);
  if (it == requests_.end()) return events;
  RequestState& r = it->second;
  if (choice < 0 || choice >= r.spec.n) return events;
  if (r.spec.n > 1 && !r.forked) {
    // Choice 0's sequence is still computing the prompt every choice shares.
    if (r.finish_at_fork.empty()) r.finish_at_fork.assign(r.spec.n, FinishReason::None);
    if (r.finish_at_fork[choice] == FinishReason::None) r.finish_at_fork[choice] = reason;
    return events;
  }
  const SeqHandle h = r.seqs[choice];
  if (h == UINT32_MAX) return events;  // already ended
  ++version_;
  finish(slots_[h], reason, events, -1);
  return events;
}

std::vector<SeqEvent> Scheduler::fail(const SchedulerOutput& out) {
  std::vector<RequestId> ids;
  for (const ScheduledSeq& sc : out.seqs) ids.push_back(sc.request);
  for (SeqId seq : out.swapped)
    for (const auto& [id, r] : requests_)
      if (seq >= r.first_seq && seq < r.first_seq + static_cast<SeqId>(r.spec.n)) ids.push_back(id);
  std::vector<SeqEvent> events;
  for (RequestId id : ids) {
    auto more = abort(id, FinishReason::Error);  // no-op for one already ended
    events.insert(events.end(), more.begin(), more.end());
  }
  return events;
}

void Scheduler::check_invariants() const {
  kv_.check_invariants();
  std::vector<int32_t> refs(kv_.n_blocks(), 0);
  std::vector<int32_t> local_refs(kv_.n_local_blocks(), 0);
  std::vector<int32_t> host_refs(kv_.n_host_blocks(), 0);
  size_t n_live_seqs = 0;
  for (const auto& [id, r] : requests_) {
    TESSERA_CHECK(r.spec.id == id, "scheduler invariant: request ", id, " filed under another id");
    int live = 0;
    for (int c = 0; c < r.spec.n; ++c) {
      const SeqHandle h = r.seqs[c];
      if (h == UINT32_MAX) {
        if (!r.forked && c > 0) ++live;  // a choice still to fork
        continue;
      }
      ++live;
      ++n_live_seqs;
      const Sequence& s = slots_[h];
      TESSERA_CHECK(s.request == id && s.choice == c && s.id == r.first_seq + c, "scheduler invariant: slot ", h,
                    " does not hold choice ", c, " of request ", id);
      const bool in_waiting = waiting_.count({s.key, h}) != 0;
      const bool in_running = running_.count({s.key, h}) != 0;
      const bool should_wait = s.status == SeqStatus::Waiting || s.status == SeqStatus::Swapped;
      TESSERA_CHECK(
          in_waiting + in_running == 1 && (should_wait ? in_waiting : s.status == SeqStatus::Running && in_running),
          "scheduler invariant: sequence ", s.id, " is not in exactly the queue of its status");
      TESSERA_CHECK(s.n_computed() < static_cast<int>(s.tokens.size()), "scheduler invariant: sequence ", s.id,
                    " has nothing left to compute");
      TESSERA_CHECK(s.n_output() <= r.spec.stop.max_tokens, "scheduler invariant: sequence ", s.id,
                    " has more output than max_tokens");
      if (s.status == SeqStatus::Waiting) {
        TESSERA_CHECK(s.kv.table.blocks.empty() && s.n_computed() == 0 && !s.kv.swapped(),
                      "scheduler invariant: waiting sequence ", s.id, " holds KV");
      } else if (s.status == SeqStatus::Swapped) {
        TESSERA_CHECK(s.kv.table.blocks.empty() && s.n_computed() > 0 &&
                          static_cast<int>(s.kv.host_blocks.size()) == kv_.blocks_for(s.n_computed()),
                      "scheduler invariant: swapped sequence ", s.id, " holds ", s.kv.n_blocks(), " device and ",
                      s.kv.host_blocks.size(), " host blocks for ", s.n_computed(), " tokens");
      } else {
        TESSERA_CHECK(s.kv.n_blocks() == kv_.blocks_for(s.n_computed()) && !s.kv.swapped(),
                      "scheduler invariant: sequence ", s.id, " holds ", s.kv.n_blocks(), " blocks for ",
                      s.n_computed(), " tokens");
      }
      kv_.check_local_table(s.kv);
      for (int32_t b : s.kv.table.blocks) ++refs[b];
      for (int32_t b : s.kv.local.blocks)
        if (b != kDropped) ++local_refs[b];
      for (int32_t hb : s.kv.host_blocks) ++host_refs[hb];
      for (int32_t hb : s.kv.local_host_blocks) ++host_refs[hb];
    }
    TESSERA_CHECK(live == r.n_live && live > 0, "scheduler invariant: request ", id, " counts ", r.n_live,
                  " live choices, found ", live);
  }
  TESSERA_CHECK(n_live_seqs == waiting_.size() + running_.size(),
                "scheduler invariant: ", waiting_.size() + running_.size(), " queued sequences but ", n_live_seqs,
                " live");
  for (int32_t b = 0; b < kv_.n_blocks(); ++b)
    TESSERA_CHECK(refs[b] == kv_.ref_count(b), "scheduler invariant: block ", b, " has ref ", kv_.ref_count(b), " but ",
                  refs[b], " sequences hold it");
  for (int32_t b = 0; b < kv_.n_local_blocks(); ++b)
    TESSERA_CHECK(local_refs[b] == kv_.local_ref_count(b), "scheduler invariant: local block ", b, " has ref ",
                  kv_.local_ref_count(b), " but ", local_refs[b], " sequences hold it");
  for (int32_t hb = 0; hb < kv_.n_host_blocks(); ++hb)
    TESSERA_CHECK(host_refs[hb] == (kv_.host_used(hb) ? 1 : 0), "scheduler invariant: host slot ", hb,
                  kv_.host_used(hb) ? " is used" : " is free", " but ", host_refs[hb], " sequences hold it");
}

bool Scheduler::is_idle() const { return requests_.empty() && waiting_.empty() && running_.empty() && kv_.is_whole(); }

}  // namespace tessera
