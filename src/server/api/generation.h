#pragma once
// The generation driver: one HTTP request's generation from admission to its last byte.
// It submits one engine request per prompt (n choices each), then, every time the engine
// reports events (RequestStream's on_event, on the engine thread), posts a drain onto the
// connection's executor, so detokenizing, stop strings and JSON never run on the engine
// thread. It writes SSE chunks as text is released, or one JSON response at the end, ends a
// choice in the engine as soon as it stops on a stop string (Engine::finish_sequence; its
// siblings carry on), aborts the engine requests when the client has gone
// (Exchange::on_abandon), and reports each engine request to the metrics when it ends.
//
// All member functions run on the exchange's executor (Exchange::post), one at a time.
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/api/access_log.h"
#include "server/api/choice_output.h"
#include "server/api/kv_roles.h"
#include "server/api/request_params.h"
#include "server/api/response_json.h"
#include "server/http/exchange.h"
#include "server/metrics.h"

namespace tessera::api {

// Where finished requests and refusals are reported (ServerMetrics in the server; tests
// capture them). Either may be empty.
struct ApiHooks {
  std::function<void(const RequestRecord&)> record;
  std::function<void(int http_status, std::string_view reason)> record_rejection;
  // One line per finished generation request (access_log.h); empty: none.
  std::function<void(const AccessRecord&)> access_log;
  // Generations alive (answer not complete, or engine requests not yet closed): shutdown
  // waits for 0 so the last chunks reach their clients.
  std::shared_ptr<std::atomic<int>> live = std::make_shared<std::atomic<int>>(0);
};

struct PromptInput {
  std::vector<int32_t> tokens;  // [n_prompt]
  std::string text;             // the prompt as text, for echo
};

struct GenerationPlan {
  Endpoint endpoint = Endpoint::Completions;
  GenerationOptions options;
  std::vector<PromptInput> prompts;      // one engine request each
  std::vector<SamplingParams> sampling;  // per prompt (max_tokens depends on its length)
  bool echo = false;                     // completions: the prompt leads each choice's text
  std::string tenant;
  std::string tenant_salt;
  // Chat with tools (tool_choice not "none"): each choice's output is read for tool calls in
  // this format (message.tool_calls, streamed tool_calls deltas).
  std::optional<ToolFormat> tool_format;
  std::string id;       // "cmpl-..." / "chatcmpl-..."
  int64_t created = 0;  // unix seconds
  // Disaggregation (kv_roles.h): the prefill worker's lease, or the decode worker's import
  // (one prompt, n = 1, for either).
  KvPlan kv;
};

class Generation : public std::enable_shared_from_this<Generation> {
 public:
  // Submits every prompt. A refusal of any of them answers the error (and withdraws the
  // others) before anything was sent; otherwise streaming starts at once. Call on the
  // exchange's executor.
  static void start(std::shared_ptr<http::Exchange> exchange, Engine& engine, const ServedModel& model,
                    const ApiHooks& hooks, GenerationPlan plan);

  Generation(std::shared_ptr<http::Exchange> exchange, Engine& engine, const ServedModel& model, const ApiHooks& hooks,
             GenerationPlan plan);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

 private:
  using Clock = std::chrono::steady_clock;

  struct Choice {
    explicit Choice(ChoiceOutput out, size_t part_index) : output(std::move(out)), part(part_index) {}
    ChoiceOutput output;
    size_t part = 0;
    bool started = false;  // the echo prefix / role chunk is out
    bool done = false;
    FinishReason finish = FinishReason::None;
    ojson stop_reason = nullptr;          // the stop string or stop token id that ended it (vLLM's)
    std::string text;                     // complete responses: everything released
    std::vector<Logprobs> chat_logprobs;  // not yet sent (streaming) or all (complete)
    std::optional<CompletionLogprobs> completion_logprobs;
    std::optional<ToolCallParser> tools;  // streaming chat with tools
    std::optional<Clock::time_point> first_token, last_token;
    std::vector<double> gaps;  // seconds between consecutive tokens
  };
  struct Part {  // one prompt: one engine request
    RequestId id = 0;
    std::shared_ptr<RequestStream> stream;
    bool engine_closed = false;  // its stream is closed and drained
    bool abort_sent = false;
    bool recorded = false;
    bool progress_read = false;
    // The engine's RequestProgress, shared (published before the first event; read then).
    std::shared_ptr<const RequestProgress> progress = std::make_shared<const RequestProgress>();
  };

  void schedule_drain();
  void drain();
  void handle(size_t part_index, const StreamEvent& event, Clock::time_point now);
  void begin_choice(Choice& choice, int index);
  void release(Choice& choice, int index, std::string text, std::optional<FinishReason> finish);
  // Streaming chat with tools: text through the choice's tool-call parser, written as content
  // and tool_calls deltas.
  void release_tool_text(Choice& choice, int index, const std::string& text, std::optional<FinishReason> finish);
  // The complete response's choice of a chat with tools: the text parsed for calls.
  ojson tool_choice_json(Choice& choice, int index, ojson logprobs) const;
  void close_choice(Choice& choice, int index, FinishReason finish, std::string text);
  // The choice's logprobs not yet sent, as its endpoint writes them (null without logprobs).
  ojson take_logprobs(Choice& choice);
  void on_abandon();
  void after_change();
  void record_part(size_t part_index);
  void finish_response();
  // Prefill worker: the answer's kv_transfer_params, naming the lease the request left.
  ojson lease_params();
  // The access-log line, once, when the answer is complete, refused or abandoned.
  void log_access(int status);
  Usage usage() const;
  int n_per_prompt() const { return plan_.options.n; }

  std::shared_ptr<http::Exchange> exchange_;
  Engine& engine_;
  const ServedModel& model_;
  const ApiHooks hooks_;  // a copy: may outlive the server by a drain
  GenerationPlan plan_;
  std::vector<Part> parts_;
  std::vector<Choice> choices_;       // [prompts * n], index = prompt * n + choice
  std::shared_ptr<Generation> self_;  // alive until every stream closed and the answer is out
  std::atomic<bool> drain_posted_{false};
  bool responded_ = false;
  bool abandoned_ = false;
  bool logged_ = false;
  std::optional<std::string> error_;  // a choice ended with FinishReason::Error
};

}  // namespace tessera::api
