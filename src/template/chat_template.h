#pragma once
// Renders a model's chat template (tokenizer.chat_template) the way Hugging Face transformers'
// apply_chat_template does: jinja2 ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) with HF's tojson, raise_exception and strftime_now, and the variables
// messages, tools (None unless given), documents (None unless given), add_generation_prompt,
// bos_token, eos_token, plus whatever `extra` holds.
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "template/jinja.h"
#include "template/rendered_chat.h"

namespace tessera {

struct ChatTemplateOptions {
  std::string bos_token, eos_token;  // exposed as bos_token / eos_token
  size_t max_output_bytes = 1 << 20;
  int64_t max_steps = 1'000'000;
  // strftime_now's clock (local time); empty: the system clock. Tests pin it.
  std::function<std::tm()> now;
};

class ChatTemplate {
 public:
  // Parses once; throws tessera::Error "chat template: line L, column C: ..." on bad syntax.
  ChatTemplate(std::string_view source, ChatTemplateOptions options = {});
  // messages: a JSON array of objects (role, content as string or list of parts, tool_calls, ...).
  // extra: more variables (tools, documents, enable_thinking, ...). Throws tessera::Error with the
  // template's own message on raise_exception, or naming the limit hit.
  std::string apply(const nlohmann::json& messages, bool add_generation_prompt,
                    const nlohmann::json& extra = nlohmann::json::object()) const;
  // The same, with the spans the template wrote (see RenderedChat).
  RenderedChat apply_marked(const nlohmann::json& messages, bool add_generation_prompt,
                            const nlohmann::json& extra = nlohmann::json::object()) const;
  // The same with ordered_json: object keys keep their order (tojson prints them as given, as
  // Python does; nlohmann::json sorts them).
  std::string apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                    const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  RenderedChat apply_marked(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                            const nlohmann::ordered_json& extra = nlohmann::ordered_json::object()) const;
  // Names a caller's extra variables must not take when they come from a client: what apply
  // sets itself (messages, tools, documents, add_generation_prompt), special tokens (any name
  // ending in _token or _tokens) and the globals (raise_exception, namespace, range, ...).
  static bool is_reserved_variable(std::string_view name);
  // Whether the template shows the model the tools it is given: a one-message chat rendered
  // with a probe function contains the probe's name. False when that render fails.
  bool renders_tools() const;
  // ChatML, for models that ship no template (what llama.cpp falls back to).
  static const std::string& chatml_source();

 private:
  template <typename Json>
  jinja::Rendered apply_impl(const Json& messages, bool add_generation_prompt, const Json& extra) const;

  ChatTemplateOptions options_;
  std::shared_ptr<const jinja::Template> template_;
};

}  // namespace tessera
