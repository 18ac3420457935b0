#include "server/api/api_server.h"

#include <chrono>
#include <mutex>
#include <random>

#include "core/version.h"
#include "server/api/api_error.h"
#include "server/api/kv_transfer_params.h"
#include "server/api/prompt_input.h"
#include "server/api/response_json.h"

namespace tessera::api {

namespace {

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

http::Response json_response(const ojson& body, int status = 200) {
  http::Response r;
  r.status = status;
  r.body = dump_json(body);
  return r;
}

}  // namespace

// The routes: a path and the one method it answers (anything else on it is a 405); a GET
// route answers HEAD too (the transport leaves the body out).
struct Route {
  std::string_view path;
  std::string_view method;
  bool needs_key;
};

namespace {
constexpr Route kRoutes[] = {
    {"/", "GET", false},
    {"/health", "GET", false},
    {"/ready", "GET", false},
    {"/metrics", "GET", false},  // needs a key with metrics_require_key
    {"/version", "GET", false},
    {"/v1/models", "GET", true},
    {"/v1/completions", "POST", true},
    {"/v1/chat/completions", "POST", true},
    {"/tokenize", "POST", true},
    {"/detokenize", "POST", true},
};
constexpr std::string_view kModelPrefix = "/v1/models/";

// The first header of that (lowercase) name; names arrive lowercased (exchange.h).
std::optional<std::string_view> find_header(const http::Request& req, std::string_view name) {
  for (const auto& [k, v] : req.headers)
    if (k == name) return std::string_view(v);
  return std::nullopt;
}

}  // namespace

std::string random_id(std::string_view prefix) {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  uint64_t a, b;
  {
    std::lock_guard lock(mutex);
    a = rng();
    b = rng();
  }
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return std::string(prefix) + buf;
}

ApiServer::ApiServer(Engine& engine, ServedModel model, ApiServerOptions options)
    : engine_(engine), model_(std::move(model)), options_(std::move(options)) {
  TESSERA_CHECK(model_.tokenizer != nullptr, "api: the served model has no tokenizer");
  if (model_.created == 0) model_.created = unix_now();
  if (options_.prompt_threads > 0) prompt_workers_ = std::make_unique<PromptWorkers>(options_.prompt_threads);
  if (options_.kv.role == ServeRole::Decode) {
    TESSERA_CHECK(options_.kv.puller != nullptr, "api: a decode worker needs a KV puller");
    TESSERA_CHECK(options_.kv.pull_threads >= 1, "api: a decode worker needs at least one pull thread");
    pull_workers_ = std::make_unique<PromptWorkers>(options_.kv.pull_threads);
  }
  if (options_.kv.role == ServeRole::Prefill)
    TESSERA_CHECK(options_.kv.lease_seconds > 0 && options_.kv.block_size > 0,
                  "api: a prefill worker needs a lease time and the block size");
}

void ApiServer::handle(std::shared_ptr<http::Exchange> exchange) {
  // Generations attach to the exchange's executor: run every handler there too, so a
  // request's state is only ever touched by one thread at a time.
  exchange->post([this, exchange] { dispatch(exchange); });
}

void ApiServer::dispatch(const std::shared_ptr<http::Exchange>& exchange) {
  try {
    route(exchange);
  } catch (const ApiError& e) {
    exchange->respond(error_response(e));
  } catch (const std::exception& e) {
    exchange->respond(error_response(
        ApiError(500, std::string("internal error: ") + e.what(), "server_error", std::nullopt, std::nullopt)));
  }
}

void ApiServer::route(const std::shared_ptr<http::Exchange>& exchange) {
  const http::Request& req = exchange->request();
  const Route* route = nullptr;
  for (const Route& r : kRoutes)
    if (req.path == r.path) route = &r;
  const bool model_path = !route && req.path.size() > kModelPrefix.size() && req.path.starts_with(kModelPrefix);
  if (!route && !model_path)
    throw ApiError(404, "no route for " + req.method + " " + req.path, "invalid_request_error", std::nullopt,
                   "not_found");
  const std::string_view method = route ? route->method : "GET";
  const bool head_of_get = method == "GET" && req.method == "HEAD";
  if (req.method != method && !head_of_get) {
    const std::string allow = method == "GET" ? "GET, HEAD" : std::string(method);
    throw ApiError(405, "method " + req.method + " is not allowed on " + req.path + "; use " + allow,
                   "invalid_request_error", std::nullopt, "method_not_allowed", {{"Allow", allow}});
  }

  const Tenant tenant = model_path || needs_key(*route) ? authenticate(req) : Tenant{};

  if (model_path) return exchange->respond(model_by_id(std::string_view(req.path).substr(kModelPrefix.size())));
  const std::string_view path = route->path;
  if (path == "/") {
    if (options_.chat_page_html.empty())
      throw ApiError(404, "this server has no chat page", "invalid_request_error", std::nullopt, "not_found");
    http::Response r;
    r.content_type = "text/html; charset=utf-8";
    r.body = options_.chat_page_html;
    return exchange->respond(std::move(r));
  }
  if (path == "/health") return exchange->respond(health(false));
  if (path == "/version") return exchange->respond(version_response());
  if (path == "/ready") return exchange->respond(health(true));
  if (path == "/metrics") {
    if (!options_.render_metrics)
      throw ApiError(404, "metrics are not enabled", "invalid_request_error", std::nullopt, "not_found");
    http::Response r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = options_.render_metrics();
    return exchange->respond(std::move(r));
  }
  if (path == "/v1/models") return exchange->respond(models());
  if (path == "/tokenize" || path == "/detokenize") {
    // Tokenizing a long text takes milliseconds: not on an I/O thread.
    const bool encode = path == "/tokenize";
    return off_io_threads(exchange, tenant.name, [this, exchange, encode] {
      auto r =
          std::make_shared<http::Response>(encode ? tokenize(exchange->request()) : detokenize(exchange->request()));
      return std::function<void()>([exchange, r] { exchange->respond(std::move(*r)); });
    });
  }
  generate(exchange, path == "/v1/completions" ? Endpoint::Completions : Endpoint::Chat, tenant);
}

bool ApiServer::needs_key(const Route& route) const {
  return route.needs_key || (route.path == "/metrics" && options_.metrics_require_key);
}

Tenant ApiServer::authenticate(const http::Request& req) const {
  // Two credentials are ambiguous (a proxy may have checked the other one): refuse both.
  size_t authorizations = 0;
  for (const auto& header : req.headers) authorizations += header.first == "authorization";
  if (authorizations > 1) {
    if (options_.hooks.record_rejection) options_.hooks.record_rejection(400, "invalid_value");
    throw ApiError(400, "more than one Authorization header", "invalid_request_error", std::nullopt, "invalid_value");
  }
  const std::optional<Tenant> t = options_.keys.authenticate(find_header(req, "authorization"));
  if (t) return *t;
  if (options_.hooks.record_rejection) options_.hooks.record_rejection(401, "invalid_api_key");
  throw ApiError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'", "invalid_request_error",
                 std::nullopt, "invalid_api_key", {{"WWW-Authenticate", "Bearer"}});
}

std::optional<http::Response> ApiServer::filter_headers(const http::Request& req) const {
  if (!options_.keys.enabled()) return std::nullopt;
  bool key_needed = req.path.size() > kModelPrefix.size() && req.path.starts_with(kModelPrefix);
  for (const Route& r : kRoutes)
    if (req.path == r.path) key_needed = needs_key(r);
  if (!key_needed) return std::nullopt;
  try {
    authenticate(req);
  } catch (const ApiError& e) {
    return error_response(e);
  }
  return std::nullopt;
}

void ApiServer::generate(const std::shared_ptr<http::Exchange>& exchange, Endpoint endpoint, const Tenant& tenant) {
  if (draining()) {
    if (options_.hooks.record_rejection) options_.hooks.record_rejection(503, "server_draining");
    log_refusal(exchange->request(), tenant, 503);
    throw ApiError(503, "the server is shutting down and admits no new requests", "service_unavailable_error",
                   std::nullopt, "server_draining", {{"Retry-After", "5"}});
  }
  off_io_threads(exchange, tenant.name, [this, exchange, endpoint, tenant] {
    GenerationPlan plan;
    try {
      plan = prepare(exchange->request(), endpoint, tenant);
    } catch (const ApiError& e) {
      log_refusal(exchange->request(), tenant, e.status);
      throw;
    }
    if (plan.kv.pull) {
      auto shared = std::make_shared<GenerationPlan>(std::move(plan));
      return std::function<void()>(
          [this, exchange, tenant, shared] { pull_then_start(exchange, tenant.name, shared); });
    }
    return std::function<void()>([this, exchange, plan = std::move(plan)]() mutable {
      Generation::start(exchange, engine_, model_, options_.hooks, std::move(plan));
    });
  });
}

void ApiServer::pull_then_start(const std::shared_ptr<http::Exchange>& exchange, const std::string& tenant,
                                std::shared_ptr<GenerationPlan> plan) {
  options_.hooks.live->fetch_add(1);  // shutdown waits for requests still pulling
  plan->kv.off_io = [this, tenant](std::function<void()> fn) { pull_workers_->submit(tenant, std::move(fn)); };
  pull_workers_->submit(tenant, [this, exchange, plan, live = options_.hooks.live] {
    try {
      plan->kv.pulled = pull_kv(engine_, options_.kv, *plan->kv.pull);
    } catch (const std::exception& e) {  // pull_kv handles transfer failures; anything else
      note_fallback(options_.kv.counters, options_.kv.log, plan->kv.pull->address(), e.what());
    }
    exchange->post([this, exchange, plan, live] {
      Generation::start(exchange, engine_, model_, options_.hooks, std::move(*plan));
      live->fetch_sub(1);
    });
  });
}

void ApiServer::log_refusal(const http::Request& request, const Tenant& tenant, int status) const {
  if (!options_.hooks.access_log) return;
  AccessRecord r;
  r.tenant = tenant.name;
  r.status = status;
  r.e2e_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - request.received_at).count();
  options_.hooks.access_log(r);
}

void ApiServer::off_io_threads(const std::shared_ptr<http::Exchange>& exchange, const std::string& tenant,
                               std::function<std::function<void()>()> work) {
  if (!prompt_workers_) {
    work()();  // errors propagate to handle()'s caller, which answers them
    return;
  }
  // Counted as live from here, so shutdown waits for requests still being prepared.
  options_.hooks.live->fetch_add(1);
  prompt_workers_->submit(tenant, [exchange, work = std::move(work), live = options_.hooks.live] {
    std::function<void()> then;  // back on the connection's executor
    try {
      then = work();
    } catch (const ApiError& e) {
      then = [exchange, e] { exchange->respond(error_response(e)); };
    } catch (const std::exception& e) {
      const ApiError error(500, std::string("internal error: ") + e.what(), "server_error", std::nullopt, std::nullopt);
      then = [exchange, error] { exchange->respond(error_response(error)); };
    }
    exchange->post([live, then = std::move(then)] {
      then();
      live->fetch_sub(1);
    });
  });
}

GenerationPlan ApiServer::prepare(const http::Request& request, Endpoint endpoint, const Tenant& tenant) const {
  GenerationPlan plan;
  try {
    const json body = parse_json_body(request.body);
    plan = endpoint == Endpoint::Chat ? parse_chat_request(body, model_) : parse_completion_request(body, model_);
    apply_role(body, plan);
  } catch (const ApiError& e) {
    if (options_.hooks.record_rejection) options_.hooks.record_rejection(e.status, e.code.value_or("invalid_request"));
    throw;
  }
  plan.tenant = tenant.name;
  plan.tenant_salt = tenant.salt;
  plan.id = random_id(endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-");
  plan.created = unix_now();
  return plan;
}

void ApiServer::apply_role(const json& body, GenerationPlan& plan) const {
  const KvRoleOptions& role = options_.kv;
  if (role.role == ServeRole::Colocated) return;  // kv_transfer_params is not read at all
  const std::optional<KvTransferParams> params = parse_kv_transfer_params(body);
  plan.kv.counters = role.counters;
  plan.kv.log = role.log;
  if (role.role == ServeRole::Prefill) {
    // The router asks for the prompt's KV and the first token, as one non-streamed answer.
    if (plan.prompts.size() != 1)
      invalid_param("prompt", "invalid_value", "a prefill worker takes one prompt, not ", plan.prompts.size());
    if (plan.options.n != 1) invalid_param("n", "invalid_value", "a prefill worker runs n = 1, not ", plan.options.n);
    if (plan.options.stream)
      invalid_param("stream", "invalid_value", "a prefill worker answers with one JSON body: send stream = false");
    plan.options.max_tokens = 1;
    plan.sampling[0].max_tokens = 1;
    // A decode worker computes at least the last prompt token itself: a prompt without a
    // full block before it leaves nothing to lease (the answer's handle is then null).
    if (plan.prompts[0].tokens.size() > static_cast<size_t>(role.block_size))
      plan.kv.lease_seconds = role.lease_seconds;
    plan.kv.server_host = role.kv_host;
    plan.kv.server_port = role.kv_port;
    return;
  }
  // Decode: pull when the prefill worker left a lease with blocks in it.
  if (!params || !params->handle || params->handle->n_blocks == 0) return;
  if (plan.prompts.size() != 1 || plan.options.n != 1)
    invalid_param("kv_transfer_params", "invalid_value",
                  "kv_transfer_params with a remote_handle needs one prompt and n = 1 (the KV of one prefill)");
  plan.kv.pull = params->handle;
}

http::Response ApiServer::health(bool ready) const {
  if (draining())
    return error_response(
        ApiError(503, "the server is draining", "service_unavailable_error", std::nullopt, "server_draining"));
  if (const std::string err = engine_.internal_error(); !err.empty() || engine_.stopping())
    return error_response(ApiError(503, "the engine has failed: " + (err.empty() ? "stopped" : err),
                                   "service_unavailable_error", std::nullopt, "engine_failed"));
  return json_response(ojson{{"status", ready ? "ready" : "ok"}});
}

http::Response version_response() {
  ojson v;
  v["version"] = std::string(version());
  // null when the build did not come from a git checkout
  v["git_commit"] = git_commit().empty() ? ojson(nullptr) : ojson(std::string(git_commit()));
  return json_response(v);
}

namespace {
ojson model_card(const ServedModel& m) {
  ojson card;
  card["id"] = m.name;
  card["object"] = "model";
  card["created"] = m.created;
  card["owned_by"] = "tessera";
  card["root"] = m.name;
  card["parent"] = nullptr;
  card["max_model_len"] = m.max_model_len;
  return card;
}
}  // namespace

http::Response ApiServer::models() const {
  ojson list;
  list["object"] = "list";
  list["data"] = ojson::array({model_card(model_)});
  return json_response(list);
}

http::Response ApiServer::model_by_id(std::string_view id) const {
  if (id != model_.name)
    throw ApiError(404, "the model '" + std::string(id) + "' does not exist; this server serves '" + model_.name + "'",
                   "invalid_request_error", "model", "model_not_found");
  return json_response(model_card(model_));
}

}  // namespace tessera::api
