#pragma once
// The OpenAI-compatible application: routes every HTTP request to its endpoint, checks the API
// key, parses and validates bodies, and hands generations to the Generation driver. Every
// refusal is an OpenAI-shaped error (api_error.h). Contract: docs/design/openai-api.md.
//
//   ApiServer api(engine, served_model, options);
//   http::HttpServer http(server_options, api.handler());
#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/api/auth.h"
#include "server/api/generation.h"
#include "server/api/kv_roles.h"
#include "server/api/prompt_workers.h"
#include "server/api/served_model.h"
#include "server/http/exchange.h"

namespace tessera::api {

struct ApiServerOptions {
  ApiKeys keys;                                 // none: no authentication
  std::string chat_page_html;                   // GET /; empty: 404
  std::function<std::string()> render_metrics;  // GET /metrics (Prometheus text); empty: 404
  bool metrics_require_key = false;             // with keys: /metrics needs one too
  ApiHooks hooks;                               // metrics of finished and refused requests
  // Threads that parse, render and tokenize generation requests off the I/O threads
  // (PromptWorkers); 0: on the connection's executor.
  int prompt_threads = 2;
  // Prefill/decode disaggregation: this worker's role (kv_roles.h); colocated by default.
  KvRoleOptions kv;
};

struct Route;

// GET /version: {"version": "0.1.0", "git_commit": "<sha>" | null}.
http::Response version_response();

class ApiServer {
 public:
  // engine must outlive the server; model.tokenizer must be set.
  ApiServer(Engine& engine, ServedModel model, ApiServerOptions options);

  // The transport's handler: moves the request onto its connection's executor and answers it
  // there. Never blocks and never throws.
  void handle(std::shared_ptr<http::Exchange> exchange);
  http::Handler handler() {
    return [this](std::shared_ptr<http::Exchange> e) { handle(std::move(e)); };
  }
  // For ServerOptions::header_filter: answers 401 on a protected route without a valid key
  // from the headers alone, before the body is read. The handler checks again.
  http::HeaderFilter header_filter() {
    return [this](const http::Request& r) -> std::optional<http::Response> { return filter_headers(r); };
  }
  std::optional<http::Response> filter_headers(const http::Request& request) const;

  // Shutdown: /health and /ready answer 503 and new generations are refused with 503, while
  // the ones in flight finish.
  void set_draining(bool on) { draining_.store(on); }
  bool draining() const { return draining_.load(); }
  const ServedModel& model() const { return model_; }
  // Generations still running or flushing their answer.
  int live_generations() const { return options_.hooks.live->load(); }

 private:
  void dispatch(const std::shared_ptr<http::Exchange>& exchange);
  void route(const std::shared_ptr<http::Exchange>& exchange);
  bool needs_key(const Route& route) const;
  // The access-log line of a generation request refused before it had an id.
  void log_refusal(const http::Request& request, const Tenant& tenant, int status) const;
  // The caller's tenant, or the 401 to answer (recorded as a rejection).
  Tenant authenticate(const http::Request& request) const;
  void generate(const std::shared_ptr<http::Exchange>& exchange, Endpoint endpoint, const Tenant& tenant);
  // Runs `work` on a prompt worker (inline without workers) and then the continuation it
  // returns on the exchange's executor; an exception from `work` is answered as an error.
  // On a prompt worker, fair per tenant (Tenant::name), or inline without workers.
  void off_io_threads(const std::shared_ptr<http::Exchange>& exchange, const std::string& tenant,
                      std::function<std::function<void()>()> work);
  // The body as a plan (parsed, rendered, tokenized): any thread. Throws ApiError, recorded
  // as a rejection.
  GenerationPlan prepare(const http::Request& request, Endpoint endpoint, const Tenant& tenant) const;
  // The role's part of the plan (options_.kv): a prefill worker's lease and max_tokens = 1, a
  // decode worker's handle to pull. Throws ApiError 400 for what the role cannot run.
  void apply_role(const json& body, GenerationPlan& plan) const;
  // Decode worker: pulls plan->kv.pull on a pull thread, then starts the generation on the
  // exchange's executor (with the import, or prefilling locally).
  void pull_then_start(const std::shared_ptr<http::Exchange>& exchange, const std::string& tenant,
                       std::shared_ptr<GenerationPlan> plan);
  http::Response health(bool ready) const;
  http::Response models() const;
  http::Response model_by_id(std::string_view id) const;
  http::Response tokenize(const http::Request& request) const;
  http::Response detokenize(const http::Request& request) const;

  Engine& engine_;
  ServedModel model_;
  ApiServerOptions options_;
  std::atomic<bool> draining_{false};
  std::unique_ptr<PromptWorkers> prompt_workers_;  // joined before the rest is destroyed
  std::unique_ptr<PromptWorkers> pull_workers_;    // decode role: KV pulls; joined first
};

// A fresh id: prefix + 32 random hex digits ("chatcmpl-...").
std::string random_id(std::string_view prefix);

}  // namespace tessera::api
