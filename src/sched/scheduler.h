#pragma once
// The step scheduler (vLLM V1): every step decides {sequence -> number of new tokens} under
// a token budget and a sequence cap. There are no phases: a prefill chunk is a sequence with
// many new tokens, a decode one with one, a prefix-cache hit moves the computed count
// forward. Running sequences are served first, then waiting ones. Contract:
// docs/design/scheduler.md.
//
// One step is plan() (const: returns a SchedulePlan), commit(plan) (the one point where
// queues and KV change), the executor's forward and sampling, then update(output, tokens)
// (advance, append, stop checks, free). Only the engine thread calls a Scheduler.
#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_manager.h"
#include "sample/sampler.h"  // Logprobs
#include "sched/sequence.h"

namespace tessera {

// A closed set of policies. FCFS orders by arrival; Priority by (priority, arrival), lower
// first (vLLM's meaning). Either way the last in order is the first preempted. Under
// Priority a waiting sequence is served before the running ones it outranks, and preempts
// them (lowest first) when KV blocks or sequence slots are short.
enum class SchedulingPolicy : uint8_t { Fcfs, Priority };
std::string_view scheduling_policy_name(SchedulingPolicy p);  // "fcfs", "priority"
// "fcfs" or "priority"; throws naming the value otherwise.
SchedulingPolicy parse_scheduling_policy(std::string_view name);

// What happens to a sequence preempted for lack of KV blocks. Recompute frees its blocks
// and recomputes prompt + output when it resumes; Swap copies its KV to the host tier
// (KvBlockManager's host blocks) and back, falling back to recompute when the tier is full.
enum class PreemptionMode : uint8_t { Recompute, Swap };
std::string_view preemption_mode_name(PreemptionMode m);  // "recompute", "swap"

struct SchedulerConfig {
  int max_num_batched_tokens = 2048;     // tokens per step (all sequences)
  int max_num_seqs = 64;                 // sequences per step
  int max_partial_prefills = 4;          // sequences per step whose prefill this step does not finish
  int long_prefill_token_threshold = 0;  // most tokens one sequence gets per step; 0 = no cap
  int max_model_len = 4096;              // prompt + output tokens of one sequence
  // Logits rows one forward may return (the executor's limit); 0 = max_num_seqs. Every
  // scheduled sequence may take one; the rows above max_num_seqs are shared by the prefill
  // chunks of prompt-logprob requests, which need a row per prompt position.
  int max_logits_rows = 0;
  SchedulingPolicy policy = SchedulingPolicy::Fcfs;
  PreemptionMode preemption_mode = PreemptionMode::Recompute;
  std::function<bool(int32_t)> is_eog;  // end-of-generation tokens; empty = none
  void validate() const;
  int logits_rows() const { return max_logits_rows > 0 ? max_logits_rows : max_num_seqs; }
};

using SeqHandle = uint32_t;

// One sequence's share of a step.
struct ScheduledSeq {
  SeqHandle handle = 0;
  SeqId seq = 0;
  RequestId request = 0;
  int n_computed = 0;  // tokens already in KV before this step
  int n_new = 0;       // tokens computed this step: tokens[n_computed, n_computed + n_new)
  // Speculative decoding: the last n_draft of the n_new tokens are the sequence's draft[0,
  // n_draft), after its last token (n_new = 1 + n_draft); each takes a logits row, and
  // update() keeps only the KV of the ones verification accepted.
  int n_draft = 0;
  // Sampling: the logits row of the last new token is sampled once per entry of sample_seqs
  // (empty: no logits; one entry normally; n entries on the step that completes the prompt
  // of an n-choice request, which then forks).
  std::vector<SeqId> sample_seqs;
  // Prompt-logprob requests: positions [prompt_rows_begin, prompt_rows_end) of this chunk
  // need their logits (position p's row gives the logprob of prompt token p + 1). Each
  // position is scheduled once per request, across chunks, preemptions and swaps.
  int32_t prompt_rows_begin = 0;
  int32_t prompt_rows_end = 0;
  std::vector<int32_t> hits;  // plan only: prefix blocks adopted first (waiting sequences)
  bool from_waiting = false;  // plan only
  bool swap_in = false;       // its KV comes back from the host tier first
  int n_prompt_rows() const { return prompt_rows_end - prompt_rows_begin; }
};

struct SchedulePlan {
  uint64_t version = 0;              // the scheduler state it was made from
  std::vector<ScheduledSeq> seqs;    // batch order: running first, then admitted
  std::vector<SeqHandle> preempted;  // freed and requeued (recompute)
  std::vector<SeqHandle> swapped;    // moved to the host tier and requeued (swap)
  int n_tokens = 0;
};

struct SchedulerOutput {
  uint64_t step = 0;
  std::vector<ScheduledSeq> seqs;
  // In this order, before the forward: device -> host moves of the swapped-out sequences,
  // host -> device moves of the swapped-in ones, then copy-on-write copies.
  std::vector<BlockSwap> swap_out;
  std::vector<BlockSwap> swap_in;
  std::vector<BlockCopy> copies;
  std::vector<SeqId> preempted;    // recompute
  std::vector<SeqId> swapped;      // swap
  std::vector<RequestId> started;  // requests scheduled for the first time
  int n_tokens = 0;
  int n_samples() const;
  bool empty() const { return seqs.empty(); }
};

// What a step (or an abort) did to a request's choice.
struct SeqEvent {
  RequestId request = 0;
  SeqId seq = 0;
  int32_t choice = 0;
  int32_t token = -1;                        // a new output token, or -1
  FinishReason finish = FinishReason::None;  // the choice ended (the token, if any, is its last)
  bool request_done = false;                 // every choice of the request has ended
  std::optional<Logprobs> logprobs;          // the token's, when the request asked (EngineCore fills it)
};

struct SchedulerStats {
  int64_t steps = 0;
  int64_t preemptions = 0;  // recompute and swap
  int64_t swap_preemptions = 0;
  int64_t swap_fallbacks = 0;  // swap mode, but the host tier was full: recomputed
  int64_t scheduled_tokens = 0;
  int64_t forks = 0;
  int64_t draft_tokens_scheduled = 0;  // speculative tokens verified (accepted or not)
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvBlockManager& kv);
  ~Scheduler();

  const SchedulerConfig& config() const { return config_; }
  KvBlockManager& kv() { return kv_; }
  const KvBlockManager& kv() const { return kv_; }

  // Queues an admitted request (its first sequence waits; choices fork after the prompt).
  // Returns the id of choice 0; choice c is that id + c.
  SeqId add(SchedRequest request);
  // Ends every choice of the request now, freeing its KV. Unknown (finished) ids: no events.
  std::vector<SeqEvent> abort(RequestId id, FinishReason reason = FinishReason::Abort);
  // Ends one choice now with `reason` (not None), freeing its KV; the other choices carry
  // on, sharing their blocks as before, and the request ends with its last choice. A
  // choice of an n > 1 request not yet forked ends as it forks (its sampled token dropped),
  // so the prompt the siblings need is computed first. Unknown requests, choices out of
  // range and choices already ended: no events.
  std::vector<SeqEvent> finish_choice(RequestId id, int32_t choice, FinishReason reason);
  bool contains(RequestId id) const { return requests_.count(id) != 0; }
  std::vector<RequestId> request_ids() const;

  SchedulePlan plan() const;
  SchedulerOutput commit(const SchedulePlan& plan);
  SchedulerOutput schedule() { return commit(plan()); }
  // After the forward: `sampled` holds the tokens of every sample_seqs entry, in output
  // order: counts[i] of them for entry i (1 + the draft tokens verification accepted; empty
  // counts = one each). A speculative sequence's rejected draft positions are rolled back:
  // its computed count stops after the accepted ones, blocks past it are freed, and only
  // blocks of verified tokens reach the prefix cache. One event per emitted token, up to a
  // stop (tokens after it are dropped).
  std::vector<SeqEvent> update(const SchedulerOutput& output, std::span<const int32_t> sampled,
                               std::span<const int32_t> counts = {});
  // Speculative decoding: the tokens to verify after the sequence's last token the next time
  // it is scheduled (it must be decoding()); the plan may use fewer (token budget, logits
  // rows, max_tokens, max_model_len, KV) or none (a tree: a prefix of its nodes). Replaces
  // any earlier draft. parents: a tree's (Draft::parents), empty for a chain.
  void set_draft(SeqHandle h, std::vector<int32_t> draft, std::vector<int16_t> parents = {});
  // Running sequences in decode state, in scheduling order.
  std::vector<SeqHandle> decoding_sequences() const;
  // The step failed: its requests end with FinishReason::Error and their KV is freed
  // (those swapped out in the step too: their host copy may be incomplete).
  std::vector<SeqEvent> fail(const SchedulerOutput& output);

  const Sequence& sequence(SeqHandle h) const { return slots_[h]; }
  size_t n_requests() const { return requests_.size(); }
  // Choices not finished, including those still to fork.
  size_t n_live_choices() const;
  size_t n_waiting() const { return waiting_.size(); }  // swapped ones included
  size_t n_swapped() const;                             // waiting with their KV in the host tier
  size_t n_running() const { return running_.size(); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  const SchedulerStats& stats() const { return stats_; }

  // Throws naming the first broken invariant: queues, request counts, and that every
  // block's reference count equals the number of live sequences holding it.
  void check_invariants() const;
  // No request state left and every KV block free and unreferenced.
  bool is_idle() const;

 private:
  struct RequestState {
    SchedRequest spec;
    SeqId first_seq = 0;          // choice c has id first_seq + c
    std::vector<SeqHandle> seqs;  // live or not yet created (forked at the prompt's end)
    int n_live = 0;               // choices not finished (including not yet forked)
    bool forked = false;
    bool started = false;
    uint64_t arrival = 0;
    int32_t prompt_rows_next = 0;              // prompt logits: first position whose row is still needed
    std::vector<FinishReason> finish_at_fork;  // [n] finish_choice() before the fork, or empty
  };
  using QueueEntry = std::pair<OrderKey, SeqHandle>;

  SeqHandle new_slot();
  OrderKey order_key(const RequestState& r, int choice) const;
  void preempt(SeqHandle h, bool swap, std::vector<BlockSwap>& swaps);
  // The chunk's prompt-logit positions, and the largest chunk whose rows fit in `rows`.
  std::pair<int32_t, int32_t> prompt_rows(const Sequence& s, int n_computed, int n_new) const;
  int cap_for_rows(const Sequence& s, int n_computed, int n_new, int rows) const;
  void append_token(Sequence& s, int32_t token, std::vector<SeqEvent>& events);
  void finish(Sequence& s, FinishReason reason, std::vector<SeqEvent>& events, int32_t token);
  void fork(SeqHandle parent, std::span<const int32_t> tokens, std::vector<SeqEvent>& events);
  FinishReason stop_reason(const Sequence& s, const StopCriteria& stop, int32_t token) const;
  int prefill_chunk(const Sequence& s, int n_computed, int budget) const;
  // Draft tokens of a decoding sequence this step can verify.
  int draft_allowance(const Sequence& s, int budget_left, int rows_left) const;
  // Speculative update: keep the KV of the accepted draft tokens, roll back the rest.
  void update_speculative(Sequence& s, const ScheduledSeq& sc, std::span<const int32_t> tokens,
                          std::vector<SeqEvent>& events);

  SchedulerConfig config_;
  KvBlockManager& kv_;
  std::vector<Sequence> slots_;
  std::vector<SeqHandle> free_slots_;
  std::unordered_map<RequestId, RequestState> requests_;
  std::set<QueueEntry> waiting_;
  std::set<QueueEntry> running_;
  uint64_t version_ = 0;
  uint64_t next_arrival_ = 0;
  SeqId next_seq_id_ = 1;
  SchedulerStats stats_;
};

}  // namespace tessera
