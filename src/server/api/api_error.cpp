#include "server/api/api_error.h"

namespace tessera::api {

ApiError from_rejection(const Rejection& rejection) {
  switch (rejection.reason) {
    case RejectReason::InvalidRequest:
      return ApiError(400, rejection.message, "invalid_request_error", std::nullopt, "invalid_request");
    case RejectReason::QueueFull:
      return ApiError(429, rejection.message, "rate_limit_error", std::nullopt, "queue_full", {{"Retry-After", "1"}});
    case RejectReason::TenantLimit:
      return ApiError(429, rejection.message, "rate_limit_error", std::nullopt, "rate_limit_exceeded",
                      {{"Retry-After", "1"}});
    case RejectReason::Draining:
      return ApiError(503, rejection.message, "service_unavailable_error", std::nullopt, "server_draining",
                      {{"Retry-After", "5"}});
  }
  return ApiError(500, rejection.message, "server_error", std::nullopt, std::nullopt);
}

ApiError from_sampling_error(const std::string& message,
                             const std::vector<std::pair<std::string, std::string>>& renames) {
  std::optional<std::string> param;
  const std::string marker = "parameter '";
  if (const size_t at = message.find(marker); at != std::string::npos) {
    const size_t begin = at + marker.size();
    if (const size_t end = message.find('\'', begin); end != std::string::npos) {
      param = message.substr(begin, end - begin);
      for (const auto& [from, to] : renames)
        if (*param == from) param = to;
    }
  }
  return ApiError(400, message, "invalid_request_error", param, "invalid_value");
}

nlohmann::ordered_json error_body(const ApiError& error) {
  nlohmann::ordered_json e;
  e["message"] = error.what();
  e["type"] = error.type;
  e["param"] = error.param ? nlohmann::ordered_json(*error.param) : nlohmann::ordered_json(nullptr);
  e["code"] = error.code ? nlohmann::ordered_json(*error.code) : nlohmann::ordered_json(nullptr);
  nlohmann::ordered_json body;
  body["error"] = std::move(e);
  return body;
}

http::Response error_response(const ApiError& error) {
  http::Response r;
  r.status = error.status;
  r.headers = error.headers;
  // Messages quote user input, which may hold anything: replace rather than throw.
  r.body = error_body(error).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  return r;
}

std::string error_event(const ApiError& error) {
  return "data: " + error_body(error).dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n\n";
}

}  // namespace tessera::api
