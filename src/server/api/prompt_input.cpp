#include "server/api/prompt_input.h"

#include <algorithm>
#include <iterator>

#include "server/api/api_error.h"
#include "server/api/tool_request.h"
#include "template/jinja_ast.h"
#include "template/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace tessera::api {

namespace {

constexpr size_t kMaxMessages = 4096;
constexpr size_t kMaxRoleBytes = 64;

PromptInput text_prompt(const ServedModel& model, const json& value, const std::string& param, bool add_special) {
  std::string text = value.get<std::string>();
  check_text(text, param, kMaxPromptBytes);
  if (text.empty()) invalid_param(param, "invalid_value", "'", param, "' must not be empty");
  PromptInput p;
  // User text: spelled special tokens stay plain text (token-id prompts can carry any token).
  p.tokens = model.tokenizer->encode(text, add_special, /*parse_special=*/false);
  if (p.tokens.empty()) invalid_param(param, "invalid_value", "'", param, "' tokenizes to no tokens");
  p.text = std::move(text);
  return p;
}

PromptInput token_prompt(const ServedModel& model, const json& value, const std::string& param) {
  PromptInput p;
  p.tokens = parse_token_ids(value, param, model.vocab_size, static_cast<size_t>(std::max(model.max_model_len, 1)));
  if (p.tokens.empty()) invalid_param(param, "invalid_value", "'", param, "' must not be empty");
  p.text = model.tokenizer->decode(p.tokens, /*skip_special=*/false);
  return p;
}

std::vector<PromptInput> parse_prompts(const json& body, const ServedModel& model) {
  const Fields f(body);
  const bool add_special = f.boolean("add_special_tokens").value_or(true);
  const json* v = f.get("prompt");
  if (!v) invalid_param("prompt", "missing_required_parameter", "'prompt' is required");
  std::vector<PromptInput> prompts;
  if (v->is_string()) {
    prompts.push_back(text_prompt(model, *v, "prompt", add_special));
    return prompts;
  }
  if (!v->is_array())
    invalid_param("prompt", "invalid_type",
                  "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of "
                  "token ids, got ",
                  json_type_name(*v));
  if (v->empty()) invalid_param("prompt", "invalid_value", "'prompt' must not be empty");
  const json& first = v->front();
  if (first.is_number()) {  // one prompt of token ids
    prompts.push_back(token_prompt(model, *v, "prompt"));
    return prompts;
  }
  if (v->size() > static_cast<size_t>(kMaxPrompts))
    invalid_param("prompt", "invalid_value", "'prompt' has ", v->size(), " prompts, at most ", kMaxPrompts,
                  " are allowed");
  // All prompt text together is bounded before any of it is tokenized.
  size_t total_bytes = 0;
  for (const json& item : *v)
    if (item.is_string()) total_bytes += item.get_ref<const std::string&>().size();
  if (total_bytes > kMaxPromptBytes)
    invalid_param("prompt", "invalid_value", "the prompts hold ", total_bytes, " bytes of text, at most ",
                  kMaxPromptBytes, " are allowed");
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    const std::string param = "prompt[" + std::to_string(i) + "]";
    if (item.is_string() && first.is_string())
      prompts.push_back(text_prompt(model, item, param, add_special));
    else if (item.is_array() && first.is_array())
      prompts.push_back(token_prompt(model, item, param));
    else
      invalid_param("prompt", "invalid_type", "'prompt' mixes types: entry ", i, " is ", json_type_name(item),
                    ", entry 0 is ", json_type_name(first));
  }
  return prompts;
}

}  // namespace

void check_model_name(const json& body, const ServedModel& model) {
  const std::optional<std::string> name = Fields(body).string("model", 1024);
  if (name && *name != model.name)
    throw ApiError(404, "the model '" + *name + "' does not exist; this server serves '" + model.name + "'",
                   "invalid_request_error", "model", "model_not_found");
}

GenerationPlan parse_completion_request(const json& body, const ServedModel& model) {
  check_model_name(body, model);
  // Tools belong to chat: a completion must not answer as if it had read them.
  for (const char* field : {"tools", "tool_choice", "functions", "function_call"})
    if (Fields(body).has(field))
      throw ApiError(400, detail::concat("'", field, "' applies to /v1/chat/completions only"), "invalid_request_error",
                     std::string(field), "unsupported_parameter");
  GenerationPlan plan;
  plan.endpoint = Endpoint::Completions;
  plan.prompts = parse_prompts(body, model);
  plan.options = parse_generation_options(body, Endpoint::Completions, model);
  plan.echo = Fields(body).boolean("echo").value_or(false);
  for (size_t i = 0; i < plan.prompts.size(); ++i)
    plan.sampling.push_back(
        sampling_for_prompt(plan.options, static_cast<int64_t>(plan.prompts[i].tokens.size()), model,
                            plan.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]"));
  return plan;
}

json normalize_messages(const json& messages) {
  if (!messages.is_array())
    invalid_param("messages", "invalid_type", "'messages' must be an array of messages, got ",
                  json_type_name(messages));
  if (messages.empty()) invalid_param("messages", "invalid_value", "'messages' must not be empty");
  if (messages.size() > kMaxMessages)
    invalid_param("messages", "invalid_value", "'messages' has ", messages.size(), " messages, at most ", kMaxMessages,
                  " are allowed");
  json out = json::array();
  size_t total_bytes = 0;  // all message text: bounded before the template or tokenizer runs
  auto count = [&](size_t bytes, const std::string& param) {
    total_bytes += bytes;
    if (total_bytes > kMaxPromptBytes)
      invalid_param(param, "invalid_value", "the messages hold more than ", kMaxPromptBytes, " bytes of text (at '",
                    param, "')");
  };
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object())
      invalid_param(param, "invalid_type", "'", param, "' must be an object, got ", json_type_name(m));
    const Fields f(m, param + ".");
    const std::optional<std::string> role = f.string("role", kMaxRoleBytes);
    if (!role || role->empty())
      invalid_param(param + ".role", "missing_required_parameter", "'", param, ".role' is required");
    // Roles reach the template's text: only the known ones (the JSON escape keeps a hostile
    // one printable in the message).
    if (std::find_if(std::begin(kChatRoles), std::end(kChatRoles), [&](const char* r) { return *role == r; }) ==
        std::end(kChatRoles))
      invalid_param(param + ".role", "invalid_value", "'", param, ".role' is ", json(*role).dump(),
                    "; it must be one of system, user, assistant, tool, developer");
    json msg = m;  // other keys (name, tool_calls, ...) pass through to the template, as data
    for (auto it = m.begin(); it != m.end(); ++it)
      if (it.value().is_string()) count(it.value().get_ref<const std::string&>().size(), param + "." + it.key());
    // tool_calls' arguments become objects, as templates read them; their text counts too.
    count(normalize_tool_calls(msg, param), param + ".tool_calls");
    const json* content = f.get("content");
    const std::string cparam = param + ".content";
    if (!content) {
      if (*role != "assistant") invalid_param(cparam, "missing_required_parameter", "'", cparam, "' is required");
      msg["content"] = nullptr;
    } else if (content->is_string()) {
      check_text(content->get_ref<const std::string&>(), cparam, kMaxPromptBytes);
    } else if (content->is_array()) {
      // Content parts: only text is understood; images and audio need a multimodal model.
      std::string text;
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string pparam = cparam + "[" + std::to_string(k) + "]";
        if (!part.is_object()) invalid_param(pparam, "invalid_type", "'", pparam, "' must be an object");
        const Fields pf(part, pparam + ".");
        const std::string type = pf.string("type", 64).value_or("");
        if (type != "text" && type != "input_text")
          invalid_param(pparam + ".type", "invalid_value", "content part type '", type,
                        "' is not supported; only 'text' is");
        const std::optional<std::string> t = pf.string("text", kMaxPromptBytes);
        if (!t) invalid_param(pparam + ".text", "missing_required_parameter", "'", pparam, ".text' is required");
        count(t->size(), pparam + ".text");
        if (!text.empty()) text += "\n";  // as vLLM joins text parts
        text += *t;
      }
      check_text(text, cparam, kMaxPromptBytes);
      msg["content"] = text;
    } else {
      invalid_param(cparam, "invalid_type", "'", cparam, "' must be a string or an array of content parts, got ",
                    json_type_name(*content));
    }
    out.push_back(std::move(msg));
  }
  return out;
}

namespace {
int json_depth(const json& j) {  // nlohmann parsed it, so the recursion is already bounded
  int d = 0;
  if (j.is_structured())
    for (const auto& item : j) d = std::max(d, json_depth(item));
  return d + (j.is_structured() ? 1 : 0);
}
}  // namespace

json parse_template_kwargs(const json* kwargs) {
  if (!kwargs || kwargs->is_null()) return json::object();
  const std::string param = "chat_template_kwargs";
  if (!kwargs->is_object())
    invalid_param(param, "invalid_type", "'", param, "' must be an object, got ", json_type_name(*kwargs));
  if (kwargs->size() > kMaxTemplateKwargs)
    invalid_param(param, "invalid_value", "'", param, "' has ", kwargs->size(), " keys, at most ", kMaxTemplateKwargs,
                  " are allowed");
  for (auto it = kwargs->begin(); it != kwargs->end(); ++it)
    if (ChatTemplate::is_reserved_variable(it.key()))
      invalid_param(param + "." + it.key(), "invalid_value", "'", param, "' must not set '", it.key(),
                    "': the server sets it (messages, tools, add_generation_prompt and the special tokens "
                    "come from the request's own fields and the model)");
  if (json_depth(*kwargs) > kMaxTemplateKwargsDepth)
    invalid_param(param, "invalid_value", "'", param, "' nests deeper than ", kMaxTemplateKwargsDepth, " levels");
  const size_t bytes = kwargs->dump().size();
  if (bytes > kMaxTemplateKwargsBytes)
    invalid_param(param, "invalid_value", "'", param, "' is ", bytes, " bytes as JSON, at most ",
                  kMaxTemplateKwargsBytes, " are allowed");
  return *kwargs;
}

RenderedChat render_chat(const ServedModel& model, const json& messages, bool add_generation_prompt,
                         const json& extra) {
  if (!model.chat)
    invalid_request("chat_template_missing", "this server has no chat template for '", model.name,
                    "'; start it with --chat-template FILE");
  try {
    return model.chat(messages, add_generation_prompt, extra);
  } catch (const jinja::RaisedException& e) {
    // raise_exception(): the template judged the client's messages.
    invalid_param("messages", "invalid_value", "the chat template refused the messages: ", e.what());
  } catch (const Error& e) {
    // Anything else is the model's template failing on its own (a runtime error, a limit):
    // not the client's fault.
    throw ApiError(500, std::string("the model's chat template failed: ") + e.what(), "server_error", std::nullopt,
                   "chat_template_error");
  }
}

std::vector<int32_t> tokenize_chat(const Tokenizer& tok, const RenderedChat& rendered, bool add_special) {
  return tok.encode_with_special_spans(rendered.text, add_special, rendered.template_spans);
}

GenerationPlan parse_chat_request(const json& body, const ServedModel& model) {
  check_model_name(body, model);
  const Fields f(body);
  const json* messages = f.get("messages");
  if (!messages) invalid_param("messages", "missing_required_parameter", "'messages' is required");
  const json normalized = normalize_messages(*messages);

  const bool continue_final = f.boolean("continue_final_message").value_or(false);
  const bool add_generation_prompt = f.boolean("add_generation_prompt").value_or(!continue_final);
  if (continue_final && add_generation_prompt)
    invalid_param("continue_final_message", "invalid_value",
                  "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  json extra = parse_template_kwargs(f.get("chat_template_kwargs"));
  const ToolRequest tools = parse_tool_request(f);
  // A template that never reads `tools` would drop them unseen: the model could not call one.
  if (tools.parse_output() && !model.tool_format)
    invalid_param("tools", "unsupported_parameter",
                  "'tools' needs a chat template with tool support, and this model's has none; serve it with "
                  "--chat-template naming one that renders 'tools' (or name the format with --tool-call-parser)");
  // The list as the request gives it, as transformers passes it; with tool_choice "none" too
  // (vLLM renders them then as well; only the output is not read for calls).
  if (!tools.tools.is_null()) extra["tools"] = tools.tools;
  RenderedChat rendered = render_chat(model, normalized, add_generation_prompt, extra);
  if (continue_final) {
    // End the prompt right after the last message's text, so the model continues it.
    const json& last = normalized.back()["content"];
    const std::string text = last.is_string() ? last.get<std::string>() : std::string();
    const size_t at = text.empty() ? std::string::npos : rendered.text.rfind(text);
    if (at == std::string::npos)
      invalid_param("continue_final_message", "invalid_value",
                    "the final message's text is not in the rendered prompt; it cannot be continued");
    const size_t end = at + text.size();
    rendered.text.resize(end);
    auto& spans = rendered.template_spans;  // cut with the text
    while (!spans.empty() && spans.back().first >= end) spans.pop_back();
    if (!spans.empty()) spans.back().second = std::min(spans.back().second, end);
  }

  GenerationPlan plan;
  plan.endpoint = Endpoint::Chat;
  PromptInput prompt;
  prompt.tokens = tokenize_chat(*model.tokenizer, rendered, f.boolean("add_special_tokens").value_or(false));
  if (prompt.tokens.empty()) invalid_param("messages", "invalid_value", "the messages render to an empty prompt");
  prompt.text = std::move(rendered.text);
  plan.options = parse_generation_options(body, Endpoint::Chat, model);
  if (tools.constrained()) {
    if (plan.options.sampling.grammar)
      invalid_param("tool_choice", "invalid_value", "'tool_choice' ",
                    tools.choice == ToolChoice::Required ? "'required'" : "naming a function",
                    " constrains the output, as does 'response_format' / guided_*: choose one");
    plan.options.sampling.grammar = tool_call_compiled_grammar(tools, *model.tool_format, model.grammar);
  } else if (tools.parse_output() && model.tool_format && !plan.options.sampling.grammar) {
    // "auto": free text, but a call the model opens is held to its function's schema.
    plan.options.sampling.grammar = auto_tool_call_compiled_grammar(tools, *model.tool_format, model.grammar);
  }
  if (tools.parse_output()) plan.tool_format = model.tool_format;
  plan.sampling.push_back(
      sampling_for_prompt(plan.options, static_cast<int64_t>(prompt.tokens.size()), model, "messages"));
  plan.prompts.push_back(std::move(prompt));
  return plan;
}

}  // namespace tessera::api
