#include "server/api/json_fields.h"

#include "server/api/api_error.h"

namespace tessera::api {

namespace {

// The deepest nesting of arrays and objects, outside strings; stops early past `limit`.
int nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"')
      in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

json parse_json_body(std::string_view body, int max_depth) {
  if (body.empty()) invalid_request("invalid_json", "the request body is empty; a JSON object is expected");
  // A raw NUL is valid nowhere in JSON (nlohmann would stop reading at it).
  if (body.find('\0') != std::string_view::npos)
    invalid_request("invalid_json", "the request body contains a NUL byte");
  if (nesting_depth(body, max_depth) > max_depth)
    invalid_request("invalid_json", "the request body nests arrays and objects deeper than ", max_depth, " levels");
  json value;
  try {
    value = json::parse(body);
  } catch (const json::exception& e) {
    // nlohmann's message says where and why (e.g. "ill-formed UTF-8 byte", surrogates).
    invalid_request("invalid_json", "the request body is not valid JSON: ", e.what());
  }
  if (!value.is_object())
    invalid_request("invalid_json", "the request body must be a JSON object, got ", json_type_name(value));
  return value;
}

std::string json_type_name(const json& value) {
  switch (value.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    default:
      return "unknown";
  }
}

const json* Fields::get(std::string_view key) const {
  const auto it = object_.find(key);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<int64_t> Fields::integer(std::string_view key, int64_t lo, int64_t hi) const {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    // nlohmann stores every non-negative literal as unsigned: both bounds apply here too.
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo)))
      invalid_param(name(key), "invalid_value", "'", name(key), "' must be in [", lo, ", ", hi, "], got ", u);
    return static_cast<int64_t>(u);
  }
  if (!v->is_number_integer())
    invalid_param(name(key), "invalid_type", "'", name(key), "' must be an integer, got ", json_type_name(*v));
  const int64_t x = v->get<int64_t>();
  if (!(x >= lo && x <= hi))
    invalid_param(name(key), "invalid_value", "'", name(key), "' must be in [", lo, ", ", hi, "], got ", x);
  return x;
}

const json* Fields::get_typed(std::string_view key, bool (json::*is_type)() const noexcept, const char* what) const {
  const json* v = get(key);
  if (v && !(v->*is_type)())
    invalid_param(name(key), "invalid_type", "'", name(key), "' must be ", what, ", got ", json_type_name(*v));
  return v;
}

std::optional<double> Fields::number(std::string_view key) const {
  const json* v = get_typed(key, &json::is_number, "a number");
  return v ? std::optional<double>(v->get<double>()) : std::nullopt;
}

std::optional<bool> Fields::boolean(std::string_view key) const {
  const json* v = get_typed(key, &json::is_boolean, "a boolean");
  return v ? std::optional<bool>(v->get<bool>()) : std::nullopt;
}

std::optional<std::string> Fields::string(std::string_view key, size_t max_bytes) const {
  const json* v = get_typed(key, &json::is_string, "a string");
  if (!v) return std::nullopt;
  std::string s = v->get<std::string>();
  check_text(s, name(key), max_bytes);
  return s;
}

void check_text(const std::string& text, std::string_view param, size_t max_bytes) {
  if (text.size() > max_bytes)
    invalid_param(param, "invalid_value", "'", param, "' is ", text.size(), " bytes long, at most ", max_bytes,
                  " are allowed");
  if (text.find('\0') != std::string::npos)
    invalid_param(param, "invalid_value", "'", param, "' contains a NUL character");
}

}  // namespace tessera::api
