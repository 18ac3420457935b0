// POST /tokenize and POST /detokenize, in vLLM's shapes.
#include "server/api/api_error.h"
#include "server/api/api_server.h"
#include "server/api/prompt_input.h"
#include "server/api/response_json.h"
#include "server/api/tool_request.h"
#include "tokenizer/tokenizer.h"

namespace tessera::api {

http::Response ApiServer::tokenize(const http::Request& request) const {
  const json body = parse_json_body(request.body);
  check_model_name(body, model_);
  const Fields f(body);
  const Tokenizer& tok = *model_.tokenizer;
  std::vector<int32_t> tokens;
  if (const json* messages = f.get("messages")) {
    if (f.has("prompt")) invalid_request("invalid_value", "give either 'prompt' or 'messages', not both");
    const json normalized = normalize_messages(*messages);
    json extra = parse_template_kwargs(f.get("chat_template_kwargs"));
    // As the chat endpoint renders them, so counts agree with its usage (vLLM takes tools too).
    if (const ToolRequest tools = parse_tool_request(f); !tools.tools.is_null()) extra["tools"] = tools.tools;
    const RenderedChat rendered =
        render_chat(model_, normalized, f.boolean("add_generation_prompt").value_or(true), extra);
    tokens = tokenize_chat(tok, rendered, f.boolean("add_special_tokens").value_or(false));
  } else {
    const std::optional<std::string> prompt = f.string("prompt", kMaxPromptBytes);
    if (!prompt) invalid_param("prompt", "missing_required_parameter", "'prompt' (or 'messages') is required");
    // As /v1/completions tokenizes a prompt, so counts agree with its usage.
    tokens = tok.encode(*prompt, f.boolean("add_special_tokens").value_or(true), /*parse_special=*/false);
  }
  ojson out;
  out["count"] = tokens.size();
  out["max_model_len"] = model_.max_model_len;
  out["tokens"] = tokens;
  if (f.boolean("return_token_strs").value_or(false)) {
    ojson strs = ojson::array();
    for (const int32_t t : tokens) strs.push_back(token_string(tok, t));
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  http::Response r;
  r.body = dump_json(out);
  return r;
}

http::Response ApiServer::detokenize(const http::Request& request) const {
  const json body = parse_json_body(request.body);
  check_model_name(body, model_);
  const json* tokens = Fields(body).get("tokens");
  if (!tokens) invalid_param("tokens", "missing_required_parameter", "'tokens' is required");
  const std::vector<int32_t> ids = parse_token_ids(*tokens, "tokens", model_.vocab_size, 1u << 20);
  ojson out;
  out["prompt"] = model_.tokenizer->decode(ids, /*skip_special=*/false);
  http::Response r;
  r.body = dump_json(out);  // a partial character at the end becomes U+FFFD
  return r;
}

}  // namespace tessera::api
