#include "server/api/prompt_input.h"

#include "server/api/api_error.h"
#include "template/jinja_ast.h"
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
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    const std::string param = "prompt[" + std::to_string(i) + "]";
    if (item.is_string() && first.is_string()) prompts.push_back(text_prompt(model, item, param, add_special));
    else if (item.is_array() && first.is_array()) prompts.push_back(token_prompt(model, item, param));
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
  GenerationPlan plan;
  plan.endpoint = Endpoint::Completions;
  plan.prompts = parse_prompts(body, model);
  plan.options = parse_generation_options(body, Endpoint::Completions, model);
  plan.echo = Fields(body).boolean("echo").value_or(false);
  for (size_t i = 0; i < plan.prompts.size(); ++i)
    plan.sampling.push_back(sampling_for_prompt(plan.options, static_cast<int64_t>(plan.prompts[i].tokens.size()),
                                                model, plan.prompts.size() == 1 ? "prompt" : "prompt[" + std::to_string(i) + "]"));
  return plan;
}

json normalize_messages(const json& messages, std::vector<std::string>& user_texts) {
  if (!messages.is_array())
    invalid_param("messages", "invalid_type", "'messages' must be an array of messages, got ",
                  json_type_name(messages));
  if (messages.empty()) invalid_param("messages", "invalid_value", "'messages' must not be empty");
  if (messages.size() > kMaxMessages)
    invalid_param("messages", "invalid_value", "'messages' has ", messages.size(), " messages, at most ",
                  kMaxMessages, " are allowed");
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) invalid_param(param, "invalid_type", "'", param, "' must be an object, got ", json_type_name(m));
    const Fields f(m, param + ".");
    const std::optional<std::string> role = f.string("role", kMaxRoleBytes);
    if (!role || role->empty()) invalid_param(param + ".role", "missing_required_parameter", "'", param, ".role' is required");
    json msg = m;  // other keys (name, tool_calls, ...) pass through to the template
    const json* content = f.get("content");
    const std::string cparam = param + ".content";
    if (!content) {
      if (*role != "assistant") invalid_param(cparam, "missing_required_parameter", "'", cparam, "' is required");
      msg["content"] = nullptr;
    } else if (content->is_string()) {
      std::string text = content->get<std::string>();
      check_text(text, cparam, kMaxPromptBytes);
      user_texts.push_back(text);
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
        if (!text.empty()) text += "\n";  // as vLLM joins text parts
        text += *t;
      }
      check_text(text, cparam, kMaxPromptBytes);
      user_texts.push_back(text);
      msg["content"] = text;
    } else {
      invalid_param(cparam, "invalid_type", "'", cparam, "' must be a string or an array of content parts, got ",
                    json_type_name(*content));
    }
    out.push_back(std::move(msg));
  }
  return out;
}

std::string render_chat(const ServedModel& model, const json& messages, bool add_generation_prompt,
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

std::vector<int32_t> tokenize_chat(const Tokenizer& tok, const std::string& rendered,
                                   const std::vector<std::string>& user_texts, bool add_special) {
  // Texts that would turn into control tokens if parsed with the template's special tokens.
  std::vector<const std::string*> risky;
  for (const std::string& t : user_texts) {
    const std::vector<int32_t> ids = tok.encode(t, false, /*parse_special=*/true);
    for (const int32_t id : ids)
      if (tok.is_control(id)) {
        risky.push_back(&t);
        break;
      }
  }
  if (risky.empty()) return tok.encode(rendered, add_special, /*parse_special=*/true);

  // Cut the rendered text around each risky text: template parts parse special tokens, the
  // client's text does not.
  std::vector<int32_t> out;
  size_t cursor = 0;
  bool first = true;
  auto append = [&](std::string_view piece, bool parse_special) {
    if (piece.empty()) return;
    const std::vector<int32_t> ids = tok.encode(piece, add_special && first, parse_special);
    out.insert(out.end(), ids.begin(), ids.end());
    first = false;
  };
  for (const std::string* t : risky) {
    std::string_view needle = *t;
    size_t at = rendered.find(needle, cursor);
    if (at == std::string::npos) {  // templates often trim content
      const size_t b = needle.find_first_not_of(" \t\r\n");
      const size_t e = needle.find_last_not_of(" \t\r\n");
      if (b != std::string_view::npos) needle = needle.substr(b, e - b + 1);
      at = rendered.find(needle, cursor);
    }
    if (at == std::string::npos)
      invalid_param("messages", "invalid_value",
                    "a message spells a special token and the chat template changed that text, so it cannot be "
                    "kept apart from the template's own special tokens");
    append(std::string_view(rendered).substr(cursor, at - cursor), true);
    append(needle, false);
    cursor = at + needle.size();
  }
  append(std::string_view(rendered).substr(cursor), true);
  return out;
}

GenerationPlan parse_chat_request(const json& body, const ServedModel& model) {
  check_model_name(body, model);
  const Fields f(body);
  const json* messages = f.get("messages");
  if (!messages) invalid_param("messages", "missing_required_parameter", "'messages' is required");
  std::vector<std::string> user_texts;
  const json normalized = normalize_messages(*messages, user_texts);

  const bool continue_final = f.boolean("continue_final_message").value_or(false);
  const bool add_generation_prompt = f.boolean("add_generation_prompt").value_or(!continue_final);
  if (continue_final && add_generation_prompt)
    invalid_param("continue_final_message", "invalid_value",
                  "'continue_final_message' and 'add_generation_prompt' cannot both be true");
  json extra = json::object();
  if (const json* kw = f.get("chat_template_kwargs")) {
    if (!kw->is_object())
      invalid_param("chat_template_kwargs", "invalid_type", "'chat_template_kwargs' must be an object, got ",
                    json_type_name(*kw));
    extra = *kw;
  }
  std::string rendered = render_chat(model, normalized, add_generation_prompt, extra);
  if (continue_final) {
    // End the prompt right after the last message's text, so the model continues it.
    const json& last = normalized.back()["content"];
    const std::string text = last.is_string() ? last.get<std::string>() : std::string();
    const size_t at = text.empty() ? std::string::npos : rendered.rfind(text);
    if (at == std::string::npos)
      invalid_param("continue_final_message", "invalid_value",
                    "the final message's text is not in the rendered prompt; it cannot be continued");
    rendered.resize(at + text.size());
  }

  GenerationPlan plan;
  plan.endpoint = Endpoint::Chat;
  PromptInput prompt;
  prompt.tokens = tokenize_chat(*model.tokenizer, rendered, user_texts, f.boolean("add_special_tokens").value_or(false));
  if (prompt.tokens.empty()) invalid_param("messages", "invalid_value", "the messages render to an empty prompt");
  prompt.text = std::move(rendered);
  plan.options = parse_generation_options(body, Endpoint::Chat, model);
  plan.sampling.push_back(
      sampling_for_prompt(plan.options, static_cast<int64_t>(prompt.tokens.size()), model, "messages"));
  plan.prompts.push_back(std::move(prompt));
  return plan;
}

}  // namespace tessera::api
