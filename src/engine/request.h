#pragma once
// The engine's public request API: what a client submits, how it is refused, and the
// per-request output channel it reads. Contract: docs/design/engine-loop.md.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

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
};

// One thing that happened to a choice: a new token, its end, or both.
struct StreamEvent {
  int32_t choice = 0;
  int32_t token = -1;                        // a new output token, or -1
  FinishReason finish = FinishReason::None;  // set on the choice's last event
  std::string error;                         // FinishReason::Error: what went wrong
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
  explicit RequestStream(int n_choices) : n_choices_(n_choices) {}

  // Blocks for the next event; false once the stream is closed and drained.
  bool next(StreamEvent& event);
  // The next event if one is ready.
  std::optional<StreamEvent> try_next();
  // Reads to the end and gathers the tokens of every choice.
  RequestOutput collect();
  bool closed() const;
  int n_choices() const { return n_choices_; }

  // Engine side.
  void push(StreamEvent event, bool close);

 private:
  const int n_choices_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<StreamEvent> events_;
  bool closed_ = false;
};

}  // namespace tessera
