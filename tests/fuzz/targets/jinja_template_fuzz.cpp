// Jinja parser and renderer: any template source either parses or throws tessera::Error
// (TemplateError); a parsed template renders a fixed chat context or throws tessera::Error
// (runtime errors, raise_exception, limits). Limits are lowered so one input stays fast; a
// hang past libFuzzer's timeout means a loop the limits do not bound.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "template/jinja.h"

namespace {
const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Hi <b>there</b> \u00e9\u4e2d"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {"x": 1, "y": [1.5, null, true]}}}]},
      {"role": "tool", "content": [{"type": "text", "text": "42"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "n": 3
  })");
  return ctx;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::jinja::Options options = tessera::jinja::Options::huggingface();
  options.limits.max_steps = 20'000;
  options.limits.max_output_bytes = 64 * 1024;
  options.limits.max_loop_iterations = 5'000;
  options.limits.max_range_size = 5'000;
  options.now = [] { return std::tm{}; };  // no clock reads: reproducible
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  try {
    const tessera::jinja::Template t = tessera::jinja::Template::parse(source, options);
    (void)t.render(context());
  } catch (const tessera::Error&) {
  }
  return 0;
}
