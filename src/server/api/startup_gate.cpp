#include "server/api/startup_gate.h"

#include "server/api/api_error.h"
#include "server/api/api_server.h"

namespace tessera::api {

http::Response StartupGate::loading_response(const http::Request& request) {
  const bool get = request.method == "GET" || request.method == "HEAD";
  if (get && request.path == "/health") {
    http::Response r;
    r.body = R"({"status":"ok"})";
    return r;
  }
  if (get && request.path == "/version") return version_response();
  return error_response(ApiError(503, "the model is still loading; retry shortly", "service_unavailable_error",
                                 std::nullopt, "model_loading", {{"Retry-After", "5"}}));
}

void StartupGate::handle(std::shared_ptr<http::Exchange> exchange) {
  if (ApiServer* api = api_.load(std::memory_order_acquire)) return api->handle(std::move(exchange));
  // Answered on the exchange's executor, like every ApiServer answer.
  exchange->post([exchange] { exchange->respond(loading_response(exchange->request())); });
}

std::optional<http::Response> StartupGate::filter_headers(const http::Request& request) const {
  if (ApiServer* api = api_.load(std::memory_order_acquire)) return api->filter_headers(request);
  // Refused before the body is read (no point taking in a prompt that cannot run yet).
  http::Response r = loading_response(request);
  if (r.status == 200) return std::nullopt;
  return r;
}

}  // namespace tessera::api
