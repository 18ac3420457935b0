#include "template/chat_template.h"

#include "core/error.h"

namespace tessera {

namespace {

jinja::Options jinja_options(const ChatTemplateOptions& o) {
  jinja::Options j = jinja::Options::huggingface();
  j.limits.max_output_bytes = o.max_output_bytes;
  j.limits.max_steps = o.max_steps;
  j.now = o.now;
  return j;
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source, ChatTemplateOptions options) : options_(std::move(options)) {
  try {
    template_ = std::make_shared<const jinja::Template>(jinja::Template::parse(source, jinja_options(options_)));
  } catch (const jinja::TemplateError& e) {
    throw Error(std::string("chat template: ") + e.what());
  }
}

template <typename Json>
jinja::Rendered ChatTemplate::apply_impl(const Json& messages, bool add_generation_prompt, const Json& extra) const {
  TESSERA_CHECK(messages.is_array(), "chat template: messages must be a JSON array, not ", messages.type_name());
  TESSERA_CHECK(extra.is_object(), "chat template: extra variables must be a JSON object, not ", extra.type_name());
  // The variables transformers passes to render(); `extra` may override any of them.
  std::vector<std::pair<std::string, jinja::Value>> vars;
  auto put = [&](const std::string& name, jinja::Value v) {
    for (auto& kv : vars)
      if (kv.first == name) {
        kv.second = std::move(v);
        return;
      }
    vars.emplace_back(name, std::move(v));
  };
  try {
    put("messages", jinja::from_json(messages));
    put("tools", jinja::Value::none());
    put("documents", jinja::Value::none());
    put("add_generation_prompt", jinja::Value(add_generation_prompt));
    // The special tokens are the model's, not data: trusted like the template's literals.
    put("bos_token", jinja::Value::trusted_string(options_.bos_token));
    put("eos_token", jinja::Value::trusted_string(options_.eos_token));
    for (auto it = extra.begin(); it != extra.end(); ++it) put(it.key(), jinja::from_json(it.value()));
    return template_->render_marked(vars);
  } catch (const jinja::RaisedException&) {
    throw;  // the template's own message, unchanged
  } catch (const jinja::TemplateError& e) {
    throw Error(std::string("chat template: ") + e.what());
  } catch (const Error& e) {
    throw Error(std::string("chat template: ") + e.what());
  }
}

std::string ChatTemplate::apply(const nlohmann::json& messages, bool add_generation_prompt,
                                const nlohmann::json& extra) const {
  return apply_impl(messages, add_generation_prompt, extra).text;
}

RenderedChat ChatTemplate::apply_marked(const nlohmann::json& messages, bool add_generation_prompt,
                                        const nlohmann::json& extra) const {
  jinja::Rendered r = apply_impl(messages, add_generation_prompt, extra);
  return RenderedChat{std::move(r.text), std::move(r.trusted)};
}

std::string ChatTemplate::apply(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                const nlohmann::ordered_json& extra) const {
  return apply_impl(messages, add_generation_prompt, extra).text;
}

RenderedChat ChatTemplate::apply_marked(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                        const nlohmann::ordered_json& extra) const {
  jinja::Rendered r = apply_impl(messages, add_generation_prompt, extra);
  return RenderedChat{std::move(r.text), std::move(r.trusted)};
}

bool ChatTemplate::renders_tools() const {
  static constexpr const char* kProbe = "tessera_probe_function_5c1e";
  const nlohmann::json messages = nlohmann::json::array({{{"role", "user"}, {"content", "Hello"}}});
  nlohmann::json function = {{"name", kProbe},
                             {"description", "Probe."},
                             {"parameters", {{"type", "object"}, {"properties", nlohmann::json::object()}}}};
  const nlohmann::json extra = {{"tools", nlohmann::json::array({{{"type", "function"}, {"function", function}}})}};
  try {
    return apply(messages, true, extra).find(kProbe) != std::string::npos;
  } catch (const Error&) {
    return false;  // a template that raises on this chat cannot be probed: treated as no tool support
  }
}

bool ChatTemplate::is_reserved_variable(std::string_view name) {
  static const char* const kNames[] = {
      "messages", "tools", "documents", "add_generation_prompt", "continue_final_message",
      // jinja2's and Hugging Face's globals
      "range", "dict", "namespace", "cycler", "joiner", "lipsum", "raise_exception", "strftime_now", "loop", "caller",
      "varargs", "kwargs", "true", "false", "none", "True", "False", "None"};
  for (const char* n : kNames)
    if (name == n) return true;
  auto ends_with = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  return ends_with("_token") || ends_with("_tokens");
}

const std::string& ChatTemplate::chatml_source() {
  // llama.cpp's LLM_CHAT_TEMPLATE_CHATML output, written as a template.
  static const std::string source =
      "{% for message in messages %}"
      "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
      "{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
  return source;
}

}  // namespace tessera
