#pragma once
// Reading request bodies: strict JSON (valid UTF-8, no lone surrogates, bounded nesting) and
// typed access to optional fields. A field that is absent or null takes its default; a field of
// the wrong type is a 400 naming it, never a silent default. Unknown keys are ignored and a
// duplicate key keeps its last value (as vLLM, through Python's json module, does). Objects keep
// their keys in the order the client wrote them (ordered_json): a JSON schema's properties reach
// the grammar, and so the output, in that order.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::api {

using json = nlohmann::ordered_json;  // request bodies keep their key order (a schema's properties)

inline constexpr int kMaxJsonDepth = 64;

// Parses a request body into a JSON object. Throws ApiError 400 (code "invalid_json") for
// malformed JSON, invalid UTF-8, nesting deeper than max_depth (found by a linear scan before
// parsing, so a 100k-deep body costs one pass) or a top level that is not an object.
json parse_json_body(std::string_view body, int max_depth = kMaxJsonDepth);

// Typed, optional fields of one JSON object; `prefix` is prepended to parameter names in
// errors (e.g. "stream_options.").
class Fields {
 public:
  explicit Fields(const json& object, std::string prefix = "") : object_(object), prefix_(std::move(prefix)) {}

  // The value, or nullptr when absent or null.
  const json* get(std::string_view key) const;
  bool has(std::string_view key) const { return get(key) != nullptr; }

  // A JSON integer in [lo, hi] (a float, even 10.0, or a bool is a type error).
  std::optional<int64_t> integer(std::string_view key, int64_t lo, int64_t hi) const;
  // Any JSON number, as a double (JSON cannot spell NaN or infinity; 1e400 fails to parse).
  std::optional<double> number(std::string_view key) const;
  std::optional<bool> boolean(std::string_view key) const;
  // A string of at most max_bytes bytes with no NUL character.
  std::optional<std::string> string(std::string_view key, size_t max_bytes) const;

  std::string name(std::string_view key) const { return prefix_ + std::string(key); }

 private:
  // The value, nullptr when absent or null; a 400 "must be <what>" when is_type rejects it.
  const json* get_typed(std::string_view key, bool (json::*is_type)() const noexcept, const char* what) const;

  const json& object_;
  std::string prefix_;
};

// The JSON type of a value, in the words of the JSON spec ("string", "array", ...).
std::string json_type_name(const json& value);

// Checks a piece of user text (a prompt, a message): no NUL characters and at most max_bytes.
void check_text(const std::string& text, std::string_view param, size_t max_bytes);

}  // namespace tessera::api
