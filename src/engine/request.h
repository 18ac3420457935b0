#pragma once
// The engine's public request API: what a client submits, how it is refused, and the
// per-request output channel it reads. Contract: docs/design/engine-loop.md.
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/kv_transfer.h"
#include "sample/sampler.h"  // Logprobs
#include "sample/sampling_params.h"
#include "sched/admission.h"
#include "sched/sequence.h"

namespace tessera {

struct Request {
  std::vector<int32_t> prompt;  // token ids, [1, max_model_len)
  SamplingParams sampling;      // max_tokens, stop_token_ids and ignore_eos are enforced by the engine
  int n = 1;                    // choices sharing the prompt's KV; choice c uses seed + c
  int32_t priority = 0;         // lower runs first under the priority policy
  std::string tenant;           // for per-tenant limits
  std::string tenant_salt;      // prefix-cache isolation; the server derives it from the credential
  std::string adapter_id;       // LoRA adapter ("" for none): part of the prefix key
  // Report, with every output token, its log-probability under the raw model distribution
  // (before temperature and the other processors) and the sampling.n_logprobs most likely
  // alternatives.
  bool logprobs = false;
  // -1: none. k >= 0: the log-probability of every prompt token from position 1 on, with the
  // k most likely alternatives (OpenAI echo + logprobs). Such a request takes no prefix-cache
  // hits (cached positions have no logits) but still publishes its blocks.
  int32_t prompt_logprobs = -1;
  // Speculative decoding, when the engine has it (--speculative-config): false opts this
  // request out. Requests with prompt_logprobs never speculate (for now).
  bool speculative = true;
  // Disaggregation (engine/kv_transfer.h, docs/design/disaggregation.md). Prefill side: > 0
  // keeps the prompt's leading full blocks pinned under a lease of this many seconds when the
  // request ends normally (RequestProgress::kv_lease); needs n = 1 and prefix caching.
  double kv_lease_seconds = 0;
  // Decode side: KV pulled from a prefill engine into a reservation (Engine::reserve_kv_import);
  // its tokens are the prompt's first ones and its tenant salt and adapter are the request's.
  // The blocks enter the prefix index, so the request starts after them.
  std::optional<KvImport> kv_import;
};

// One thing that happened to a choice: a new token, its end, or both.
struct StreamEvent {
  int32_t choice = 0;
  int32_t token = -1;                        // a new output token, or -1
  FinishReason finish = FinishReason::None;  // set on the choice's last event
  std::string error;                         // FinishReason::Error: what went wrong
  std::optional<Logprobs> logprobs;          // Request::logprobs: the new token's
};

// Request-level facts the engine thread publishes once, before the first token event.
struct RequestProgress {
  // When the request was first scheduled (left the waiting queue), and its prompt tokens
  // served from the prefix cache at that point.
  std::optional<std::chrono::steady_clock::time_point> scheduled_at;
  int32_t cached_prompt_tokens = 0;
  // Request::prompt_logprobs >= 0: entries for prompt positions 1..n_prompt-1 (position 0
  // has no logprob), set before the first token event is pushed.
  std::shared_ptr<const std::vector<Logprobs>> prompt_logprobs;
  // Request::kv_lease_seconds > 0 and the request ended normally: the lease on its prompt's
  // blocks, set before its last event is pushed.
  std::optional<KvLeaseInfo> kv_lease;
};

// What a finished request produced, choice by choice.
struct RequestOutput {
  std::vector<std::vector<int32_t>> tokens;  // [n][output tokens]
  std::vector<FinishReason> finish;          // [n]
  std::string error;
};

// A request's output channel: the engine thread writes, one reader reads (any thread).
// Closed after the last choice's finish event.
class RequestStream {
 public:
  // on_event, when set, is called on the engine thread after every push (outside the
  // stream's lock): an asynchronous reader uses it to schedule a try_next() drain. It must
  // be cheap and must not call back into the engine.
  explicit RequestStream(int n_choices, std::function<void()> on_event = {})
      : n_choices_(n_choices), on_event_(std::move(on_event)) {}

  // Blocks for the next event; false once the stream is closed and drained.
  bool next(StreamEvent& event);
  // The next event if one is ready.
  std::optional<StreamEvent> try_next();
  // Reads to the end and gathers the tokens of every choice.
  RequestOutput collect();
  bool closed() const;
  int n_choices() const { return n_choices_; }
  // The request's one RequestProgress as last published (never null; empty before the
  // request is scheduled). A published value is never changed: the engine publishes a new
  // one, so a reader may keep and share the pointer.
  std::shared_ptr<const RequestProgress> progress() const;

  // Engine side.
  void push(StreamEvent event, bool close);
  // Publishes the current progress with `edit` applied.
  void update_progress(const std::function<void(RequestProgress&)>& edit);

 private:
  const int n_choices_;
  const std::function<void()> on_event_;
  std::shared_ptr<const RequestProgress> progress_ = std::make_shared<const RequestProgress>();
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<StreamEvent> events_;
  bool closed_ = false;
};

}  // namespace tessera
