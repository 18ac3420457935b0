#include "server/router/router.h"

#include <atomic>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/error.h"
#include "server/exposition.h"
#include "server/router/upstream.h"
#include "server/router/worker_choice.h"

namespace tessera::router {

using json = nlohmann::json;

namespace {

constexpr size_t kMaxPrefillAnswerBytes = 16u << 20;  // one completion with max_tokens = 1

http::Response json_response(int status, const json& body) {
  http::Response r;
  r.status = status;
  r.body = body.dump();
  return r;
}

// The body sent to a prefill worker (vLLM's proxy convention), or none when the request
// cannot be split: not a JSON object, n > 1 or several prompts (a prefill worker leases the
// KV of one sequence). Those go to a decode worker as they are.
std::optional<json> prefill_body(const json& body) {
  if (!body.is_object()) return std::nullopt;
  if (const auto n = body.find("n"); n != body.end() && n->is_number_integer() && n->get<int64_t>() > 1)
    return std::nullopt;
  if (const auto p = body.find("prompt");
      p != body.end() && p->is_array() && p->size() > 1 && ((*p)[0].is_string() || (*p)[0].is_array()))
    return std::nullopt;
  json out = body;
  out["stream"] = false;
  out.erase("stream_options");
  out["max_tokens"] = 1;
  if (out.contains("max_completion_tokens")) out["max_completion_tokens"] = 1;
  out["kv_transfer_params"] = {{"do_remote_decode", true}, {"do_remote_prefill", false}};
  return out;
}

enum class Role { Prefill, Decode };
class InFlight;

}  // namespace

struct Router::Impl : std::enable_shared_from_this<Router::Impl> {
  explicit Impl(RouterOptions o) : options(std::move(o)), client(options.client_threads) {
    TESSERA_CHECK(!options.prefill_urls.empty(), "router: give at least one --prefill worker URL");
    TESSERA_CHECK(!options.decode_urls.empty(), "router: give at least one --decode worker URL");
    for (const std::string& u : options.prefill_urls) prefill.push_back(UpstreamUrl::parse(u));
    for (const std::string& u : options.decode_urls) decode.push_back(UpstreamUrl::parse(u));
    for (const UpstreamUrl& u : prefill) prefill_hashes.push_back(worker_hash(u.text));
    prefill_in_flight.assign(prefill.size(), 0);
    decode_in_flight.assign(decode.size(), 0);
    for (const UpstreamUrl& u : prefill)
      for (const char* outcome : {"ok", "refused", "failed"}) prefills[{u.text, outcome}] = 0;
    for (const UpstreamUrl& u : decode)
      for (const char* outcome : {"ok", "failed", "cancelled"}) decodes[{u.text, outcome}] = 0;
  }

  // Each picks a worker (worker_choice.h) and counts a call to it in flight until the returned
  // InFlight ends (below).
  std::shared_ptr<InFlight> start_prefill(std::optional<uint64_t> prefix_key);
  std::shared_ptr<InFlight> start_decode();
  void end_call(Role role, size_t worker) {
    std::lock_guard lock(mutex);
    --(role == Role::Prefill ? prefill_in_flight : decode_in_flight)[worker];
  }

  UpstreamRequest upstream_request(const http::Request& from, std::string path, std::string body) const {
    UpstreamRequest r;
    r.method = from.method == "HEAD" ? "GET" : from.method;
    r.path = std::move(path);
    r.body = std::move(body);
    for (const char* name : {"authorization", "x-request-id"})
      if (const auto v = from.header(name)) r.headers.emplace_back(name, std::string(*v));
    r.connect_timeout = options.connect_timeout;
    r.idle_timeout = options.idle_timeout;
    return r;
  }
  void count(std::map<std::pair<std::string, std::string>, uint64_t>& m, const std::string& worker,
             const std::string& outcome) {
    std::lock_guard lock(mutex);
    ++m[{worker, outcome}];
  }

  RouterOptions options;
  std::vector<UpstreamUrl> prefill, decode;
  std::vector<uint64_t> prefill_hashes;  // worker_hash of each prefill URL

  mutable std::mutex mutex;  // guards everything below: a choice reads and bumps the counts at once
  std::vector<int64_t> prefill_in_flight, decode_in_flight;  // by index in prefill / decode
  uint64_t prefill_rotation = 0, decode_rotation = 0;        // round-robin, and turns among ties
  uint64_t affinity_hits = 0, affinity_overloaded = 0;
  std::map<std::pair<std::string, std::string>, uint64_t> prefills, decodes;  // (worker, outcome)
  uint64_t requests = 0, skipped = 0, local_prefills = 0;

  UpstreamClient client;  // last: its threads stop first
};

namespace {

// One call counted in flight to a worker, from its choice until end(). The call's on_done ends
// it; its destructor does too, so a call dropped without on_done (the client stopping) still
// gives its count back. Holds the router weakly: it lives in the client's handlers.
class InFlight {
 public:
  InFlight(std::weak_ptr<Router::Impl> router, Role role, size_t worker)
      : router_(std::move(router)), role_(role), worker_(worker) {}
  ~InFlight() { end(); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

  size_t worker() const { return worker_; }
  void end() {
    if (ended_.exchange(true)) return;
    if (const std::shared_ptr<Router::Impl> router = router_.lock()) router->end_call(role_, worker_);
  }

 private:
  std::weak_ptr<Router::Impl> router_;
  Role role_;
  size_t worker_;
  std::atomic<bool> ended_{false};
};

}  // namespace

std::shared_ptr<InFlight> Router::Impl::start_prefill(std::optional<uint64_t> prefix_key) {
  std::lock_guard lock(mutex);
  size_t worker = 0;
  if (options.policy == RouterPolicy::RoundRobin) {
    worker = prefill_rotation++ % prefill.size();
  } else if (!prefix_key) {  // nothing to be affine to
    worker = least_loaded(prefill_in_flight, prefill_rotation++);
  } else {
    const PrefillChoice choice =
        choose_prefill_worker(*prefix_key, prefill_hashes, prefill_in_flight, prefill_rotation);
    if (choice.outcome == AffinityOutcome::Overloaded) ++prefill_rotation;  // only then did it take a turn
    ++(choice.outcome == AffinityOutcome::Hit ? affinity_hits : affinity_overloaded);
    worker = choice.worker;
  }
  ++prefill_in_flight[worker];
  return std::make_shared<InFlight>(weak_from_this(), Role::Prefill, worker);
}

std::shared_ptr<InFlight> Router::Impl::start_decode() {
  std::lock_guard lock(mutex);
  const size_t worker = options.policy == RouterPolicy::RoundRobin ? decode_rotation++ % decode.size()
                                                                   : least_loaded(decode_in_flight, decode_rotation++);
  ++decode_in_flight[worker];
  return std::make_shared<InFlight>(weak_from_this(), Role::Decode, worker);
}

namespace {

// One request through the router. Every member function runs on the exchange's executor
// (Exchange::post), one at a time; the upstream client's callbacks only post to it (and, on
// done, count the call out of flight at once: the count must not wait behind the executor).
//
// It holds the router weakly: the calls queued in the router's client hold the request, so a
// strong reference would keep the router, and the client's thread, alive from that thread.
class Routed : public std::enable_shared_from_this<Routed> {
 public:
  Routed(const std::shared_ptr<Router::Impl>& router, std::shared_ptr<http::Exchange> exchange)
      : router_(router), exchange_(std::move(exchange)) {}

  // A generation: prefill worker first (when the request can be split), then decode worker.
  void generate() {
    const std::shared_ptr<Router::Impl> router = lock_router();
    if (!router) return;
    {
      std::lock_guard lock(router->mutex);
      ++router->requests;
    }
    std::weak_ptr<Routed> weak = shared_from_this();
    exchange_->on_abandon([weak] {
      if (auto self = weak.lock()) self->cancel();
    });
    body_ = json::parse(exchange_->request().body, nullptr, /*allow_exceptions=*/false);
    std::optional<json> prefill = prefill_body(body_);
    if (!prefill) {
      {
        std::lock_guard lock(router->mutex);
        ++router->skipped;
      }
      // The decode worker judges the body (and answers its errors).
      return to_worker(*router, router->start_decode(), std::string(exchange_->request().body));
    }
    std::shared_ptr<InFlight> in_flight = router->start_prefill(prompt_prefix_key(body_));
    const UpstreamUrl& worker = router->prefill[in_flight->worker()];
    auto self = shared_from_this();
    auto answer = std::make_shared<std::string>();
    auto status = std::make_shared<int>(0);
    UpstreamHandlers h;
    h.on_head = [status](int s, std::string) { *status = s; };
    h.on_data = [answer](std::string data) {
      if (answer->size() < kMaxPrefillAnswerBytes) *answer += data;
    };
    h.on_done = [self, name = worker.text, answer, status, in_flight](std::string error) {
      in_flight->end();
      self->exchange_->post(
          [self, name, answer, status, error] { self->after_prefill(name, *status, *answer, error); });
    };
    const http::Request& req = exchange_->request();
    call_ = router->client.start(worker, router->upstream_request(req, req.path, prefill->dump()), std::move(h));
  }

  // GET /v1/models and /v1/models/{id}: the decode worker's answer.
  void pass_through() {
    if (const std::shared_ptr<Router::Impl> router = lock_router())
      to_worker(*router, router->start_decode(), std::string());
  }

 private:
  void after_prefill(const std::string& worker, int status, const std::string& answer, const std::string& error) {
    call_.reset();
    if (cancelled_) return;
    const std::shared_ptr<Router::Impl> router = lock_router();
    if (!router) return;
    json params;
    std::string outcome = "ok";
    if (!error.empty()) {
      outcome = "failed";
    } else if (status != 200) {
      outcome = "refused";
    } else {
      const json reply = json::parse(answer, nullptr, false);
      if (reply.is_object() && reply.contains("kv_transfer_params") && reply["kv_transfer_params"].is_object())
        params = reply["kv_transfer_params"];
      else
        outcome = "failed";  // a 200 without kv_transfer_params: not a prefill worker
    }
    router->count(router->prefills, worker, outcome);
    json decode = body_;
    if (outcome == "ok") {
      decode["kv_transfer_params"] = std::move(params);
    } else {
      decode.erase("kv_transfer_params");
      std::lock_guard lock(router->mutex);
      ++router->local_prefills;
    }
    to_worker(*router, router->start_decode(), decode.dump());
  }

  void to_worker(Router::Impl& router, std::shared_ptr<InFlight> in_flight, std::string body) {
    const UpstreamUrl& worker = router.decode[in_flight->worker()];
    worker_ = worker.text;
    auto self = shared_from_this();
    UpstreamHandlers h;
    h.on_head = [self](int status, std::string type) {
      self->exchange_->post([self, status, type = std::move(type)] { self->on_head(status, type); });
    };
    h.on_data = [self](std::string data) {
      self->exchange_->post([self, data = std::move(data)]() mutable { self->on_data(std::move(data)); });
    };
    h.on_done = [self, in_flight = std::move(in_flight)](std::string error) {
      in_flight->end();
      self->exchange_->post([self, error = std::move(error)] { self->on_done(error); });
    };
    const http::Request& req = exchange_->request();
    call_ = router.client.start(worker, router.upstream_request(req, req.path, std::move(body)), std::move(h));
  }

  void on_head(int status, const std::string& type) {
    status_ = status;
    content_type_ = type.empty() ? "application/json" : type;
    if (status == 200 && content_type_.starts_with("text/event-stream")) {
      streaming_ = true;
      exchange_->start_stream();
    }
  }

  void on_data(std::string data) {
    if (streaming_)
      exchange_->write(std::move(data));
    else
      answer_ += data;
  }

  void on_done(const std::string& error) {
    call_.reset();
    const std::string outcome = error.empty() ? "ok" : cancelled_ ? "cancelled" : "failed";
    if (const std::shared_ptr<Router::Impl> router = router_.lock()) router->count(router->decodes, worker_, outcome);
    if (error.empty()) {
      if (streaming_) return exchange_->end_stream();
      http::Response r;
      r.status = status_;
      r.content_type = content_type_;
      r.body = std::move(answer_);
      return exchange_->respond(std::move(r));
    }
    const std::string message = "decode worker " + worker_ + " failed: " + error;
    if (streaming_) {  // the answer began: end it with an error event, as a worker would
      const json event = {{"error", {{"message", message}, {"type", "server_error"}, {"code", "bad_gateway"}}}};
      exchange_->write("data: " + event.dump() + "\n\n");
      return exchange_->end_stream();
    }
    exchange_->respond(http::error_response(502, message, std::nullopt, "bad_gateway"));
  }

  void cancel() {
    cancelled_ = true;
    if (call_) call_->cancel();
  }

  // The router, or null after answering 503 (it is shutting down).
  std::shared_ptr<Router::Impl> lock_router() {
    std::shared_ptr<Router::Impl> router = router_.lock();
    if (!router) exchange_->respond(http::error_response(503, "the router is shutting down"));
    return router;
  }

  std::weak_ptr<Router::Impl> router_;
  std::shared_ptr<http::Exchange> exchange_;
  json body_;
  std::shared_ptr<UpstreamCall> call_;
  std::string worker_;  // the decode worker's URL
  int status_ = 0;
  std::string content_type_;
  bool streaming_ = false;
  bool cancelled_ = false;
  std::string answer_;
};

}  // namespace

Router::Router(RouterOptions options) : impl_(std::make_shared<Impl>(std::move(options))) {}

Router::~Router() = default;

http::Handler Router::handler() {
  std::weak_ptr<Impl> weak = impl_;
  return [weak](std::shared_ptr<http::Exchange> exchange) {
    auto impl = weak.lock();
    if (!impl) return exchange->respond(http::error_response(503, "the router is shutting down"));
    exchange->post([impl, exchange] {
      const http::Request& req = exchange->request();
      const bool get = req.method == "GET" || req.method == "HEAD";
      const auto wrong_method = [&](const char* allowed) {
        http::Response r =
            http::error_response(405, "method " + req.method + " is not allowed on " + req.path + "; use " + allowed,
                                 std::nullopt, "method_not_allowed");
        r.headers.emplace_back("Allow", allowed);
        exchange->respond(std::move(r));
      };
      if (req.path == "/health" || req.path == "/ready") {
        if (!get) return wrong_method("GET, HEAD");
        return exchange->respond(json_response(200, {{"status", req.path == "/ready" ? "ready" : "ok"}}));
      }
      if (req.path == "/metrics") {
        if (!get) return wrong_method("GET, HEAD");
        http::Response r;
        r.content_type = "text/plain; version=0.0.4; charset=utf-8";
        r.body = Router::render(*impl);
        return exchange->respond(std::move(r));
      }
      if (req.path == "/v1/models" || req.path.starts_with("/v1/models/")) {
        if (!get) return wrong_method("GET, HEAD");
        return std::make_shared<Routed>(impl, exchange)->pass_through();
      }
      if (req.path == "/v1/completions" || req.path == "/v1/chat/completions") {
        if (req.method != "POST") return wrong_method("POST");
        return std::make_shared<Routed>(impl, exchange)->generate();
      }
      exchange->respond(http::error_response(404,
                                             "no route for " + req.method + " " + req.path +
                                                 " (the router serves /v1/completions, /v1/chat/completions, "
                                                 "/v1/models, /health, /ready and /metrics)",
                                             std::nullopt, "not_found"));
    });
  };
}

std::string Router::render_metrics() const { return render(*impl_); }

std::string Router::render(const Impl& m) {
  ExpositionWriter w("");
  std::lock_guard lock(m.mutex);
  w.family("tessera:router_workers", "gauge", "Workers the router sends requests to, by role.");
  w.sample("tessera:router_workers", "role=\"prefill\"", static_cast<double>(m.prefill.size()));
  w.sample("tessera:router_workers", "role=\"decode\"", static_cast<double>(m.decode.size()));
  w.counter("tessera:router_requests_total", "Generation requests received.", static_cast<double>(m.requests));
  w.family("tessera:router_in_flight", "gauge",
           "Calls the router has open to each worker: started and not yet done, failed or cancelled.");
  const auto in_flight = [&](const std::vector<UpstreamUrl>& workers, const std::vector<int64_t>& counts,
                             const char* role) {
    for (size_t i = 0; i < workers.size(); ++i)
      w.sample("tessera:router_in_flight",
               "worker=\"" + escape_label_value(workers[i].text) + "\",role=\"" + role + "\"",
               static_cast<double>(counts[i]));
  };
  in_flight(m.prefill, m.prefill_in_flight, "prefill");
  in_flight(m.decode, m.decode_in_flight, "decode");
  w.family("tessera:router_prefix_affinity_total", "counter",
           "Prefill calls of policy load with a prompt prefix: hit (the prefix's worker took it) or overloaded "
           "(that worker had more than " +
               std::to_string(kAffinitySlack) + " calls in flight beyond the least loaded, which took it instead).");
  w.sample("tessera:router_prefix_affinity_total", "outcome=\"hit\"", static_cast<double>(m.affinity_hits));
  w.sample("tessera:router_prefix_affinity_total", "outcome=\"overloaded\"",
           static_cast<double>(m.affinity_overloaded));
  const auto by_worker = [&](const char* name, const char* help, const auto& counts) {
    w.family(name, "counter", help);
    for (const auto& [key, n] : counts)
      w.sample(name, "worker=\"" + escape_label_value(key.first) + "\",outcome=\"" + key.second + "\"",
               static_cast<double>(n));
  };
  by_worker("tessera:router_prefills_total",
            "Prefill calls by worker and outcome: ok (a handle came back), refused (an HTTP error), failed "
            "(unreachable, broken off, or no kv_transfer_params).",
            m.prefills);
  w.counter("tessera:router_prefills_skipped_total",
            "Requests sent straight to a decode worker: n > 1, several prompts, or not a JSON object.",
            static_cast<double>(m.skipped));
  w.counter("tessera:router_local_prefills_total",
            "Requests sent to a decode worker without a handle because the prefill call did not give one.",
            static_cast<double>(m.local_prefills));
  by_worker("tessera:router_decodes_total",
            "Decode calls by worker and outcome: ok (its answer passed through, whatever its status), failed (502 "
            "or a stream ended with an error event), cancelled (the client went away).",
            m.decodes);
  return w.take();
}

}  // namespace tessera::router
