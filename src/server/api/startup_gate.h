#pragma once
// The HTTP listener opens before the model loads, so probes can tell "loading" from "dead".
// Until open(): GET/HEAD /health answers 200 (the process is alive), /version its build, and
// every other request 503 with code "model_loading" and Retry-After. After open() every
// request goes to the ApiServer (its /ready then answers 200). Contract:
// docs/design/http-server.md ("Start-up and shutdown").
//
//   StartupGate gate;
//   http::HttpServer server(options_with(gate.header_filter()), gate.handler());
//   server.start();            // listening
//   ... load the model, build ApiServer api ...
//   gate.open(api);            // serving
#include <atomic>
#include <memory>

#include "server/http/exchange.h"

namespace tessera::api {

class ApiServer;

class StartupGate {
 public:
  // From now on requests go to `api`, which must outlive the transport's use of the gate.
  void open(ApiServer& api) { api_.store(&api, std::memory_order_release); }
  bool is_open() const { return api_.load(std::memory_order_acquire) != nullptr; }

  void handle(std::shared_ptr<http::Exchange> exchange);
  std::optional<http::Response> filter_headers(const http::Request& request) const;

  http::Handler handler() {
    return [this](std::shared_ptr<http::Exchange> e) { handle(std::move(e)); };
  }
  http::HeaderFilter header_filter() {
    return [this](const http::Request& r) { return filter_headers(r); };
  }

  // What a request gets while the model loads.
  static http::Response loading_response(const http::Request& request);

 private:
  std::atomic<ApiServer*> api_{nullptr};
};

}  // namespace tessera::api
