#pragma once
// The open-loop load generator: requests are sent when the arrival process says, whether or
// not earlier ones have finished (only an optional concurrency cap holds them back, and the
// wait is recorded). One thread runs every request's state machine on one io_context.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchharness/http_client.h"
#include "benchharness/workload.h"

namespace tessera::bench {

// Everything measured about one request. Times in seconds; *_s of the run are relative to
// the run's start, latencies relative to the moment the request was sent (before connect).
struct RequestRecord {
  int64_t id = 0;  // order of sending
  int64_t conversation = 0;
  int turn = 0;
  int prefix_group = -1;
  int64_t input_tokens = 0;    // planned prompt tokens: system + history + user text
  int64_t max_tokens = 0;      // requested output tokens (ignore_eos)
  int64_t prompt_tokens = -1;  // the server's usage.prompt_tokens, -1 if not reported
  int64_t output_tokens = 0;   // usage.completion_tokens, or token chunks when not reported
  bool output_from_usage = false;
  double scheduled_s = 0;       // when the arrival process (or the previous turn) released it
  double send_s = 0;            // when it was sent (> scheduled_s only under a concurrency cap)
  double first_byte_s = -1;     // response's first byte, after send
  double ttft_s = -1;           // first chunk with generated text, after send
  double e2e_s = 0;             // last byte, after send
  double queue_s = -1;          // server-reported queue time, -1 if not reported
  std::vector<double> token_s;  // every chunk with generated text, after send
  int http_status = 0;
  bool ok = false;
  std::string error;  // why it failed

  std::vector<double> itl_s() const;  // gaps between consecutive token chunks
  // (e2e - ttft) / (output_tokens - 1); -1 with fewer than 2 output tokens.
  double tpot_s() const;
  nlohmann::json to_json() const;
  static RequestRecord from_json(const nlohmann::json& j);
};

struct Progress {
  double elapsed_s = 0;
  int64_t planned = 0, sent = 0, done = 0, failed = 0, in_flight = 0, waiting = 0;
  double recent_requests_per_s = 0;  // completions in the last window
  double recent_tokens_per_s = 0;    // token chunks received in the last window
};

struct LoadOptions {
  Endpoint endpoint;
  std::string model;  // "model" field of every request
  std::string api_key;
  std::string api = "chat";  // "chat" (/v1/chat/completions) or "completions" (/v1/completions)
  int max_concurrency = 0;   // 0: no cap
  double timeout_s = 600;    // per request
  double temperature = 0;
  bool ignore_eos = true;
  nlohmann::json extra_body = nlohmann::json::object();  // merged into every request body
  double progress_interval_s = 1.0;
  std::function<void(const Progress&)> on_progress;  // called on the run's thread
};

struct LoadResult {
  double duration_s = 0;               // first send to last completion
  std::vector<RequestRecord> records;  // by id (send order)
};

// Runs the plan against the server and returns when every request has finished or failed.
LoadResult run_load(const WorkloadPlan& plan, const LoadOptions& options);

// The JSON body of one request (exposed for tests).
nlohmann::json make_request_body(const LoadOptions& options, const PlannedConversation& conversation, int turn,
                                 const std::vector<std::string>& replies);

}  // namespace tessera::bench
