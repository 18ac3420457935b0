#pragma once
// The engine's single-threaded core: scheduler, KV block manager and an executor, advanced
// one step at a time. Engine (engine.h) runs it on its own thread behind queues; tests and
// the offline batch runner drive it directly. Contract: docs/design/engine-loop.md.
#include <optional>
#include <string>
#include <vector>

#include "engine/executor.h"
#include "engine/request.h"
#include "kv/block_manager.h"
#include "sched/admission.h"
#include "sched/scheduler.h"

namespace tessera {

struct EngineConfig {
  SchedulerConfig scheduler;
  int n_blocks = 0;          // KV blocks (the executor's cache must have as many)
  int block_size = 16;
  bool prefix_caching = true;
  std::string model_fingerprint;  // part of every prefix key
  int32_t vocab_size = 0;
  int max_n = 16;            // most choices per request
  AdmissionLimits admission; // used by Engine
  bool check_invariants = false;  // after every step (tests): slow, throws on a broken one
  // Pads every forward to at least this many rows with a throwaway sequence, for backends
  // whose kernels change with the row count (the CPU matmul repacks weight panels from 8
  // rows on, with a different summation order): every token is then computed the same way
  // whatever the batch, and greedy outputs do not depend on batching. 0 = off. The padding
  // sequence uses KV blocks [n_blocks, n_blocks + n_pad_blocks()), which the executor's
  // cache must have in addition.
  int min_forward_rows = 0;
  int n_pad_blocks() const { return min_forward_rows > 0 ? (min_forward_rows + block_size - 1) / block_size : 0; }
};

struct EngineStats {
  int64_t steps = 0;
  int64_t scheduled_tokens = 0;
  int64_t generated_tokens = 0;
  int64_t preemptions = 0;
  int64_t forks = 0;
  int64_t block_copies = 0;
  int64_t requests_finished = 0;  // every choice stopped or hit its length
  int64_t requests_aborted = 0;
  int64_t requests_failed = 0;
  PrefixCacheStats prefix;
  size_t waiting = 0;
  size_t running = 0;
  int kv_free_blocks = 0;
  int kv_total_blocks = 0;
};

struct StepResult {
  std::vector<SeqEvent> events;
  std::vector<RequestId> started;  // scheduled for the first time in this step
  std::string error;               // the step failed: its requests ended with Error
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
  void add(RequestId id, const Request& request);
  // Ends the request's choices now (FinishReason::Abort) and frees its KV.
  std::vector<SeqEvent> abort(RequestId id, FinishReason reason = FinishReason::Abort);
  std::vector<SeqEvent> abort_all(FinishReason reason = FinishReason::Abort);
  // One step: schedule, build the batch, execute, sample, update. Nothing when idle.
  StepResult step();
  bool has_work() const { return scheduler_.has_work(); }
  bool contains(RequestId id) const { return scheduler_.contains(id); }

  EngineStats stats() const;
  const Scheduler& scheduler() const { return scheduler_; }
  const KvBlockManager& kv() const { return kv_; }
  // Scheduler and KV invariants, and that the executor holds exactly the live choices.
  void check_invariants() const;
  // No request state anywhere and every KV block free.
  bool is_idle() const;

 private:
  void forget_finished(const std::vector<SeqEvent>& events);

  EngineConfig config_;
  Executor& executor_;
  KvBlockManager kv_;
  Scheduler scheduler_;
  ForwardBatch batch_;
  std::vector<SampleTarget> samples_;
  std::vector<int32_t> tokens_;
  SequenceBlocks pad_seq_;          // the padding sequence's blocks (min_forward_rows)
  std::vector<int32_t> pad_tokens_;
  EngineStats counters_;
};

}  // namespace tessera
