#pragma once
// Every refusal of the API layer is one typed exception, thrown where the problem is found and
// turned into an OpenAI-shaped error body at the handler boundary:
//   {"error": {"message": "...", "type": "...", "param": "..." | null, "code": "..." | null}}
// Contract (status, type and code of every case): docs/design/openai-api.md.
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

#include "core/error.h"
#include "engine/request.h"  // admission verdicts, through the engine's API
#include "server/http/exchange.h"

namespace tessera::api {

class ApiError : public Error {
 public:
  ApiError(int status, std::string message, std::string type, std::optional<std::string> param,
           std::optional<std::string> code, http::Headers headers = {})
      : Error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)),
        headers(std::move(headers)) {}

  int status;
  std::string type;
  std::optional<std::string> param;
  std::optional<std::string> code;
  http::Headers headers;  // e.g. Retry-After on 429
};

namespace detail {
template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}
}  // namespace detail

// 400 for a parameter: code "invalid_value" (out of range, malformed), "invalid_type"
// (wrong JSON type) or "missing_required_parameter".
template <typename... Parts>
[[noreturn]] void invalid_param(std::string_view param, std::string_view code, Parts&&... parts) {
  throw ApiError(400, detail::concat(std::forward<Parts>(parts)...), "invalid_request_error", std::string(param),
                 std::string(code));
}

// 400 about the request as a whole (no single parameter to name).
template <typename... Parts>
[[noreturn]] void invalid_request(std::string_view code, Parts&&... parts) {
  throw ApiError(400, detail::concat(std::forward<Parts>(parts)...), "invalid_request_error", std::nullopt,
                 std::string(code));
}

// The engine's typed refusal: 400 / 429 (with Retry-After) / 503.
ApiError from_rejection(const Rejection& rejection);
// A SamplingParams::validate() message ("sampling parameter 'top_p' must be ...") as a 400
// naming the parameter; `renames` maps internal names to the request's names
// (n_logprobs -> top_logprobs).
ApiError from_sampling_error(const std::string& message,
                             const std::vector<std::pair<std::string, std::string>>& renames = {});

// {"error": {...}} with keys in OpenAI's order.
nlohmann::ordered_json error_body(const ApiError& error);
http::Response error_response(const ApiError& error);
// The body of an SSE error frame, once stream headers are out: "data: {...}\n\n".
std::string error_event(const ApiError& error);

}  // namespace tessera::api
