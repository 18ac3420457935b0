#pragma once
// `tessera serve --role router`: an OpenAI-compatible front for prefill and decode workers
// (docs/design/disaggregation.md, "The router"). Each /v1/completions or /v1/chat/completions
// request goes first to a prefill worker (max_tokens = 1, stream = false, kv_transfer_params
// {"do_remote_decode": true}), then, with the kv_transfer_params that worker answered, to a
// decode worker, whose answer (streamed or not) passes through as it comes. Which worker of
// each list takes a call is the policy's choice (worker_choice.h): by default the decode
// worker with the fewest calls in flight, and the prefill worker the request's prompt prefix
// hashes to unless it is busier than the rest; or plain round-robin.
//
// Failures: a prefill worker that cannot be reached or answers an error leaves the request to
// the decode worker without a handle (it prefills locally); a decode worker that cannot be
// reached or breaks off before its answer began is a 502 naming it; one that breaks off
// mid-stream ends the stream with an error event. The router checks no API key itself: it
// forwards the Authorization header to both workers, which check it (so the tenant, and the
// prefix-cache salt the KV carries, is the same on both).
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "server/http/exchange.h"
#include "server/router/worker_choice.h"

namespace tessera::router {

struct RouterOptions {
  std::vector<std::string> prefill_urls;  // "http://host:port"; at least one
  std::vector<std::string> decode_urls;   // at least one
  std::chrono::milliseconds connect_timeout{5000};
  // Each read or write to a worker must make progress within this (a non-streamed answer
  // arrives only at the end of its generation).
  std::chrono::milliseconds idle_timeout{600000};
  int client_threads = 1;
  RouterPolicy policy = RouterPolicy::Load;  // --router-policy
};

class Router {
 public:
  // Throws tessera::Error naming a malformed worker URL or an empty list.
  explicit Router(RouterOptions options);
  ~Router();
  Router(const Router&) = delete;
  Router& operator=(const Router&) = delete;

  http::Handler handler();
  // Its own Prometheus text (tessera:router_*).
  std::string render_metrics() const;

  struct Impl;  // shared with the requests in flight (router.cpp)

 private:
  static std::string render(const Impl& impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace tessera::router
