#pragma once
// The engine's single-threaded core: scheduler, KV block manager and an executor, advanced
// one step at a time. Engine (engine.h) runs it on its own thread behind queues; tests and
// the offline batch runner drive it directly. Contract: docs/design/engine-loop.md.
#include <chrono>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/executor.h"
#include "engine/kv_transfer.h"
#include "engine/request.h"
#include "kv/block_manager.h"
#include "sched/admission.h"
#include "sched/scheduler.h"
#include "spec/draft_length.h"
#include "spec/drafter.h"
#include "spec/step_cost.h"
#include "spec/spec_config.h"

namespace tessera {

// A 400 refusal whose message is built from its parts (validation in engine_core*.cpp).
template <typename... Parts>
Rejection invalid_request(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return Rejection{RejectReason::InvalidRequest, os.str()};
}

struct EngineConfig {
  SchedulerConfig scheduler;  // scheduler.preemption_mode Swap needs n_host_blocks > 0
  int n_blocks = 0;           // KV blocks (the executor's cache must have as many)
  int block_size = 16;
  int n_host_blocks = 0;       // host tier for swap preemption (at most the executor's)
  int64_t kv_block_bytes = 0;  // bytes of one block (all layers, K and V): for the swap byte counters
  // The local (sliding-window) layers' own pool (KvBlockManager::Config::window and
  // n_local_blocks; the executor's cache has the same local group), or 0 and 0: none.
  int window = 0;
  int n_local_blocks = 0;
  bool prefix_caching = true;
  std::string model_fingerprint;  // part of every prefix key
  int32_t vocab_size = 0;
  int max_n = 16;                 // most choices per request
  AdmissionLimits admission;      // used by Engine
  bool check_invariants = false;  // after every step (tests): slow, throws on a broken one
  // Speculative decoding (docs/design/spec-decode.md); off by default. Draft tokens take
  // logits rows: scheduler.max_logits_rows must leave room (ModelEngine adds it).
  SpeculativeConfig speculative;
  // The drafter of a model method (draft_model, early_exit), built with the target by
  // ModelEngine (engine/model_drafter.h); other methods' drafters come from make_drafter.
  // Used only while `speculative` is enabled and names a model method (an n-gram config
  // ignores it). One EngineCore at a time may use it.
  std::shared_ptr<Drafter> drafter;
};

// vLLM's spec_decode counters: verifications with at least one draft token, draft tokens
// verified, draft tokens accepted, and accepted tokens per draft position (index j: the
// (j+1)-th draft token of a step was accepted).
struct SpecDecodeStats {
  int64_t drafts = 0;
  int64_t draft_tokens = 0;
  int64_t accepted_tokens = 0;
  int64_t tree_drafts = 0;                // drafts verified as trees of several candidates (counted in drafts too)
  std::vector<int64_t> accepted_per_pos;  // [num_speculative_tokens]
  double acceptance_rate() const {
    return draft_tokens > 0 ? static_cast<double>(accepted_tokens) / static_cast<double>(draft_tokens) : 0.0;
  }
};

// Disaggregation's engine-side counters (engine/kv_transfer.h): leases on the prefill side,
// import reservations on the decode side.
struct KvTransferEngineStats {
  int64_t leases_created = 0;
  int64_t leases_released = 0;  // after a pull, or by request
  int64_t leases_expired = 0;
  int64_t exported_blocks = 0;  // staged for a pull
  int64_t imports = 0;          // requests that brought KV
  int64_t imported_blocks = 0;
  int64_t imports_cancelled = 0;  // reservations given back without an import (a failed pull)
  int active_leases = 0;
  int leased_blocks = 0;
  int active_reservations = 0;  // reserved or imported, not yet taken by their request
  int reserved_blocks = 0;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t scheduled_tokens = 0;
  int64_t generated_tokens = 0;
  // Prompt tokens of requests whose prefill completed, counted once per request at its
  // first sampled token (vLLM's prompt_tokens_total: the whole prompt, cached or not).
  int64_t prompt_tokens = 0;
  int64_t preemptions = 0;     // recompute and swap
  int64_t swaps_out = 0;       // sequences preempted by swapping their KV to the host tier
  int64_t swaps_in = 0;        // sequences whose KV came back
  int64_t swap_out_bytes = 0;  // bytes copied device -> host
  int64_t swap_in_bytes = 0;   // bytes copied host -> device
  int64_t swap_fallbacks = 0;  // swap mode, host tier full: recomputed instead
  int64_t forks = 0;
  int64_t block_copies = 0;
  int64_t requests_finished = 0;  // every choice stopped or hit its length
  int64_t requests_aborted = 0;
  int64_t requests_failed = 0;
  PrefixCacheStats prefix;
  SpecDecodeStats spec;
  size_t waiting = 0;  // sequences, swapped ones included
  size_t running = 0;
  size_t swapped = 0;
  int kv_free_blocks = 0;
  int kv_total_blocks = 0;
  // The sliding-window layers' own pool (0 blocks when the model has none or it is disabled).
  int kv_window_free_blocks = 0;
  int kv_window_total_blocks = 0;
  int host_free_blocks = 0;
  int host_total_blocks = 0;
  KvTransferEngineStats transfer;
};

// A request scheduled for the first time.
struct RequestStart {
  RequestId id = 0;
  int32_t cached_prompt_tokens = 0;                    // served from the prefix cache
  std::chrono::steady_clock::time_point scheduled_at;  // when the step was scheduled
};

struct StepResult {
  // Events carry the token's Logprobs when the request asked for them.
  std::vector<SeqEvent> events;
  std::vector<RequestStart> started;
  // Requests whose prompt logprobs (Request::prompt_logprobs) are complete, published once,
  // in or before the step of their first token event: entries for positions 1..n_prompt-1.
  std::vector<std::pair<RequestId, std::shared_ptr<const std::vector<Logprobs>>>> prompt_logprobs;
  std::string error;  // the step failed: its requests ended with Error
  // Requests with Request::kv_lease_seconds that ended normally in this step, and their leases.
  std::vector<std::pair<RequestId, KvLeaseInfo>> leases;
};

class EngineCore {
 public:
  EngineCore(const EngineConfig& config, Executor& executor);
  ~EngineCore();
  EngineCore(const EngineCore&) = delete;
  EngineCore& operator=(const EngineCore&) = delete;

  const EngineConfig& config() const { return config_; }
  // Why the request can never be served, or nothing. Reads only the configuration: safe
  // from any thread.
  std::optional<Rejection> validate(const Request& request) const;
  // Queues a request (validate() first: throws tessera::Error with its message otherwise).
  // Request::logprobs and prompt_logprobs are honoured here.
  void add(RequestId id, const Request& request);
  // Ends the request's choices now (FinishReason::Abort) and frees its KV.
  std::vector<SeqEvent> abort(RequestId id, FinishReason reason = FinishReason::Abort);
  std::vector<SeqEvent> abort_all(FinishReason reason = FinishReason::Abort);
  // Ends one choice of a request now (e.g. FinishReason::Stop on a stop string the server
  // matched) and frees its KV; its siblings carry on. See Scheduler::finish_choice.
  std::vector<SeqEvent> finish_choice(RequestId id, int32_t choice, FinishReason reason);
  // One step: schedule, build the batch, execute, sample, update. Nothing when idle.
  StepResult step();
  bool has_work() const { return scheduler_.has_work(); }
  bool contains(RequestId id) const { return scheduler_.contains(id); }

  EngineStats stats() const;
  const Scheduler& scheduler() const { return scheduler_; }
  const KvBlockManager& kv() const { return kv_; }
  // Scheduler and KV invariants, and that the executor holds exactly the live choices.
  void check_invariants() const;
  // No request state anywhere, no lease or import reservation, and every KV block free.
  bool is_idle() const;

  // Disaggregation (engine/kv_transfer.h, engine_core_kv.cpp). What this engine's blocks are
  // (throws when the executor cannot move blocks).
  KvIdentity kv_identity() const;
  // Prefill side: lease `id`'s blocks staged in host memory (the lease stays until released
  // or expired). Throws naming why not (unknown, expired or released lease).
  std::shared_ptr<const KvBlocksPayload> export_lease(uint64_t id);
  // Gives lease `id`'s blocks back; false when there is no such lease (expired, released).
  bool release_lease(uint64_t id);
  // Releases the leases whose time is up at `now`; how many.
  int expire_leases(std::chrono::steady_clock::time_point now);
  // When the next lease expires, if any.
  std::optional<std::chrono::steady_clock::time_point> next_lease_expiry() const;
  // Decode side: n_blocks fresh blocks held for an import, all or nothing; throws (saying how
  // many are free) when the cache cannot give them now. The request that uses it (add with
  // Request::kv_import) writes the staged bytes in; cancel_import gives them back.
  KvImportReservation reserve_import(int32_t n_blocks);
  // Gives a reservation's blocks back; false when unknown (used or cancelled already).
  bool cancel_import(uint64_t id);

 private:
  // The sequence's local-layer table for the forward batch, or null without a local pool.
  const SequenceBlocks* local_table(const SeqKv& kv) const { return kv_.windowed() ? &kv.local : nullptr; }
  // What a request asked for besides tokens (only requests that asked have an entry).
  struct Extras {
    bool logprobs = false;
    int32_t prompt_logprobs = -1;  // k, or -1
    int32_t n_prompt = 0;
    std::vector<Logprobs> prompt;  // entries so far, for positions 1, 2, ...
    bool published = false;
  };
  // Speculative decoding: a draft for every decoding sequence that speculates this step.
  void propose_drafts();
  // Adaptive draft lengths k (aligned with cand, indices into decoding; k[c] <= cap[c]) from
  // the measured step cost and each sequence's acceptance (spec/step_cost.h), with a probe
  // while they are all 0.
  void plan_adaptive_drafts(const std::vector<SeqHandle>& decoding, const std::vector<size_t>& cand,
                            const std::vector<int>& cap, std::vector<int>& k);
  // The drafter's proposals for the candidates with k[c] > 0 (aligned with cand, empty
  // elsewhere), checked, with its time per position folded into draft_seconds_per_pos_.
  // Whether a request's drafts may be trees (the executor verifies them; no grammar, no logprobs).
  bool tree_allowed(RequestId request, const SamplingParams* sampling) const;
  // Throws naming what is wrong with a drafter's answer to q (sizes, a tree's shape).
  void check_draft(Draft& d, const DraftQuery& q) const;
  std::vector<Draft> run_drafter(const std::vector<SeqHandle>& decoding, const std::vector<size_t>& cand,
                                 const std::vector<int>& k);
  void count_verifications(const SchedulerOutput& out);
  void build_batch(const SchedulerOutput& out);
  void attach_logprobs(std::vector<SeqEvent>& events) const;
  void gather_prompt_logprobs(const SchedulerOutput& out, StepResult& result);
  void forget_finished(const std::vector<SeqEvent>& events);
  // Disaggregation (engine_core_kv.cpp): validation of the transfer fields of a request, the
  // import at add(), leases for requests that end in a step, holds released once started.
  std::optional<Rejection> validate_transfer(const Request& r) const;
  void import_kv(RequestId id, const Request& r, const BlockHash& root);
  void lease_finished(const std::vector<SeqEvent>& events, StepResult& result);
  void release_import_hold(RequestId id);

  EngineConfig config_;
  Executor& executor_;
  bool trees_ = false;  // executor_.supports_draft_trees()
  KvBlockManager kv_;
  Scheduler scheduler_;
  ForwardBatch batch_;
  std::vector<SampleTarget> samples_;
  std::vector<PromptLogprobTarget> prompt_targets_;
  std::vector<RequestId> prompt_target_owner_;  // [prompt_targets_]
  StepOutput output_;
  std::unordered_map<RequestId, Extras> extras_;
  std::unordered_map<RequestId, int32_t> awaiting_first_token_;  // request -> prompt length
  EngineStats counters_;
  // Speculative decoding state: the drafter, the requests that speculate, each sequence's
  // draft length policy, and the drafts (with their q, when the drafter has one) proposed
  // for the coming step.
  std::shared_ptr<Drafter> drafter_;
  std::unordered_set<RequestId> speculating_;
  std::unordered_map<SeqId, SamplingParams> draft_sampling_;  // each speculating choice's (seed per choice)
  std::unordered_map<SeqId, DraftLength> draft_length_;
  std::unordered_map<SeqId, Draft> drafts_;
  // Adaptive draft lengths: this engine's forward time per row count, and the drafter's time
  // per draft position (exponentially weighted), measured on its own steps.
  StepCostModel step_cost_;
  double draft_seconds_per_pos_ = 0;
  static constexpr int kExploreEvery = 16;  // plain steps before a probing draft (engine_core.cpp)
  int plain_steps_ = 0;                     // consecutive steps the plan gave no draft
  std::vector<int32_t> chunk_;              // a speculative sequence's step tokens: last token + draft
  // Disaggregation state. Prefill side: requests that want a lease when they end, and the
  // leases (each a SeqKv holding its blocks). Decode side: reservations not yet used, and
  // imported blocks held for their request until it is scheduled (so no allocation evicts
  // them from the prefix index before the request adopts them).
  struct LeaseWanted {
    std::vector<int32_t> prompt;
    double seconds = 0;
    BlockHash root;
    std::string tenant_salt, adapter_id;
  };
  struct Lease {
    SeqKv kv;
    std::vector<int32_t> tokens;  // kv's tokens
    std::string tenant_salt, adapter_id;
    std::chrono::steady_clock::time_point expires;
  };
  std::unordered_map<RequestId, LeaseWanted> lease_wanted_;
  std::unordered_map<uint64_t, Lease> leases_;
  std::unordered_map<uint64_t, std::pair<SeqKv, std::shared_ptr<HostKvTier>>> reservations_;
  std::unordered_map<RequestId, SeqKv> import_holds_;
  uint64_t next_reservation_ = 1;
  KvTransferEngineStats transfer_;
};

}  // namespace tessera
