#include "server/http/exchange.h"

#include <nlohmann/json.hpp>

namespace tessera::http {

std::optional<std::string_view> Request::header(std::string_view name) const {
  for (const auto& [key, value] : headers)
    if (key == name) return std::string_view(value);
  return std::nullopt;
}

Response error_response(int status, std::string_view message, std::optional<std::string> param,
                        std::optional<std::string> code, std::string_view type) {
  if (type.empty()) type = status >= 500 ? "server_error" : "invalid_request_error";
  nlohmann::json error = {
      // Replace rather than throw on bytes that are not UTF-8 (messages may quote input).
      {"message", std::string(message)},
      {"type", std::string(type)},
      {"param", param ? nlohmann::json(*param) : nlohmann::json(nullptr)},
      {"code", code ? nlohmann::json(*code) : nlohmann::json(nullptr)},
  };
  Response response;
  response.status = status;
  response.content_type = "application/json";
  response.body =
      nlohmann::json{{"error", std::move(error)}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  return response;
}

}  // namespace tessera::http
