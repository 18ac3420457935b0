#pragma once
// The serving engine: one engine thread owns the EngineCore (scheduler, KV metadata,
// executor); clients on any thread submit requests through a queue and read tokens from a
// per-request stream. Contract: docs/design/engine-loop.md.
//
//   Engine engine(config, executor);
//   SubmitResult r = engine.submit(request);      // validated and admitted, or refused
//   if (!r.ok()) return http_error(http_status(r.rejection->reason), r.rejection->message);
//   StreamEvent e;
//   while (r.stream->next(e)) send(e);            // tokens, then each choice's finish
//   engine.abort(r.id);                           // client went away: freed within one step
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine_core.h"
#include "engine/request.h"
#include "sched/admission.h"

namespace tessera {

struct SubmitResult {
  RequestId id = 0;
  std::shared_ptr<RequestStream> stream;  // null when rejected
  std::optional<Rejection> rejection;
  bool ok() const { return !rejection.has_value(); }
};

class Engine {
 public:
  // Starts the engine thread. The executor must outlive the engine.
  Engine(const EngineConfig& config, Executor& executor);
  // stop(): aborts whatever is left and joins the thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Thread-safe. Validates (400), applies admission limits (429) and draining (503) before
  // returning; an accepted request is queued for the engine thread. The stream's
  // progress() gets scheduled_at and cached_prompt_tokens when the request is first
  // scheduled, and prompt_logprobs (if asked) before the first token event.
  // on_event: see RequestStream (called on the engine thread after every event).
  SubmitResult submit(Request request, std::function<void()> on_event = {});
  // Thread-safe. Ends the request at the next step boundary; unknown or finished ids are
  // ignored.
  void abort(RequestId id);
  // Thread-safe. Ends one choice of the request at the next step boundary with `reason`
  // (not None; FinishReason::Stop for a stop string the server matched): its KV blocks are
  // freed at once (blocks its siblings share stay theirs), its stream gets the choice's
  // finish event, and the request ends when its last choice does. Unknown or finished
  // requests and choices are ignored.
  void finish_sequence(RequestId id, int32_t choice, FinishReason reason = FinishReason::Stop);
  // Stops admitting (new submits get Draining), waits up to `timeout` for the requests in
  // flight to finish, then aborts the rest. Returns when no request is left.
  void drain(std::chrono::milliseconds timeout);
  // Aborts everything and stops the engine thread. Idempotent; call from one thread.
  void stop();

  // Prefill/decode disaggregation (engine/kv_transfer.h, docs/design/disaggregation.md).
  // Thread-safe; the blocking ones wait for the engine thread (one message, handled between
  // steps) and throw tessera::Error naming what went wrong.
  // What this engine's blocks are (throws when its executor cannot move them).
  KvIdentity kv_identity() const;
  // Prefill side: lease `id`'s blocks staged in host memory; the lease stays until released
  // or expired.
  std::shared_ptr<const KvBlocksPayload> export_kv_lease(uint64_t id);
  // Gives lease `id`'s blocks back now (after a completed pull); unknown ids are ignored.
  void release_kv_lease(uint64_t id);
  // Decode side: n_blocks blocks held for an import, or an Error saying the cache has no room.
  KvImportReservation reserve_kv_import(int32_t n_blocks);
  // Gives a reservation's blocks back (a failed pull); unknown ids are ignored.
  void cancel_kv_import(uint64_t id);

  // Thread-safe snapshots, refreshed after every step.
  EngineStats stats() const;
  size_t n_in_flight() const;
  // Messages submitted but not yet taken by the engine thread (queue depth).
  size_t n_queued_messages() const;
  bool stopping() const;
  // The first error the engine thread could not attribute to a step (a broken invariant,
  // with check_invariants on), or "".
  std::string internal_error() const;
  // After stop(): the core, for checks that the pool is whole.
  const EngineCore& core() const;

 private:
  // Messages to the engine thread (a plain struct: a request, an abort, one choice's early
  // finish, or abort-all).
  struct Message {
    enum class Kind : uint8_t { Add, Abort, FinishChoice, AbortAll, Call } kind = Kind::Add;
    RequestId id = 0;
    Request request;
    std::shared_ptr<RequestStream> stream;
    int32_t choice = 0;                        // FinishChoice
    FinishReason reason = FinishReason::None;  // FinishChoice
    std::function<void(EngineCore&)> call;     // Call: run on the engine thread
  };
  // Runs fn(core_) on the engine thread and returns its result (or rethrows its exception).
  template <typename Fn>
  auto call(Fn fn) -> decltype(fn(std::declval<EngineCore&>()));
  void post(Message message);
  struct Live {
    std::shared_ptr<RequestStream> stream;
    std::string tenant;
    int64_t n_prompt = 0;
    int64_t budget_tokens = 0;  // prompt + max_tokens x n: the tenant's in-flight tokens
    bool started = false;       // its RequestProgress lives in the stream (one copy)
  };

  void run();
  void handle(Message& message);
  void deliver(std::vector<SeqEvent>& events, const std::string& error);
  void publish_progress(const StepResult& step);
  void end_all_live(const std::string& error);
  void publish();

  EngineCore core_;
  AdmissionControl admission_;

  mutable std::mutex mutex_;      // guards everything below it
  std::condition_variable wake_;  // engine thread: messages or stop
  std::condition_variable idle_;  // drain(): in-flight count changed
  std::vector<Message> inbox_;
  bool stop_ = false;
  RequestId next_id_ = 1;
  size_t in_flight_ = 0;
  EngineStats stats_;
  std::string internal_error_;

  // Engine thread only.
  std::unordered_map<RequestId, Live> live_;
  std::thread thread_;
};

}  // namespace tessera
