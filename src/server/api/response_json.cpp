#include "server/api/response_json.h"

#include <cmath>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace tessera::api {

namespace {

// Tokens the text leaves out (IncrementalDetokenizer with skip_special).
bool skipped(const Tokenizer& tok, int32_t id, bool skip_special) {
  return skip_special && (tok.is_control(id) || (tok.token_attr(id) & kAttrUnknown) != 0);
}

double clamp_logprob(double lp) { return std::isfinite(lp) ? lp : kMinLogprob; }

ojson bytes_json(std::string_view piece) {
  ojson bytes = ojson::array();
  for (const char c : piece) bytes.push_back(static_cast<int>(static_cast<unsigned char>(c)));
  return bytes;
}

int64_t code_points(std::string_view s) {
  int64_t n = 0;
  for (const char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

ojson finish_json(std::optional<FinishReason> finish) {
  if (!finish || *finish == FinishReason::None) return nullptr;
  return finish_reason_string(*finish);
}

ojson response_head(std::string_view object, const std::string& id, int64_t created, const std::string& model) {
  return ojson{{"id", id}, {"object", std::string(object)}, {"created", created}, {"model", model}};
}

// One choice of any endpoint: {"index", <key>: content, "logprobs", "finish_reason",
// "stop_reason"}, where key is "text" (completions), "message" (chat) or "delta" (chat chunks).
ojson choice_json(int index, const char* key, ojson content, ojson logprobs, std::optional<FinishReason> finish,
                  ojson stop_reason) {
  ojson c;
  c["index"] = index;
  c[key] = std::move(content);
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = finish_json(finish);
  c["stop_reason"] = std::move(stop_reason);
  return c;
}

// A streamed chunk: the head and one choice.
ojson chunk_json(std::string_view object, const std::string& id, int64_t created, const std::string& model,
                 ojson choice) {
  ojson r = response_head(object, id, created, model);
  r["choices"] = ojson::array({std::move(choice)});
  return r;
}

// A complete response, or the final usage chunk (no choices): the head, choices and usage.
ojson body_json(std::string_view object, const std::string& id, int64_t created, const std::string& model,
                ojson choices, const Usage& usage) {
  ojson r = response_head(object, id, created, model);
  r["choices"] = std::move(choices);
  r["usage"] = usage_json(usage);
  return r;
}

}  // namespace

ojson usage_json(const Usage& usage) {
  ojson u;
  u["prompt_tokens"] = usage.prompt_tokens;
  u["completion_tokens"] = usage.completion_tokens;
  u["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  u["prompt_tokens_details"] = ojson{{"cached_tokens", usage.cached_tokens}};
  return u;
}

std::string finish_reason_string(FinishReason reason) { return std::string(finish_reason_name(reason)); }

std::string dump_json(const ojson& value) { return value.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string sse_event(const ojson& value) { return "data: " + dump_json(value) + "\n\n"; }

std::string token_string(const Tokenizer& tok, int32_t id, bool skip_special) {
  if (skipped(tok, id, skip_special)) return {};
  return sanitize_utf8(tok.token_piece(id));
}

ojson chat_logprobs_json(const Tokenizer& tok, std::span<const Logprobs> entries, bool skip_special) {
  // {"token", "logprob", "bytes"}: the chosen token's entry and each alternative's alike.
  auto token_json = [&](const TokenLogprob& t) {
    ojson e;
    e["token"] = token_string(tok, t.token, skip_special);
    e["logprob"] = clamp_logprob(t.logprob);
    e["bytes"] = bytes_json(skipped(tok, t.token, skip_special) ? std::string_view() : tok.token_piece(t.token));
    return e;
  };
  ojson content = ojson::array();
  for (const Logprobs& lp : entries) {
    ojson e = token_json(lp.chosen);
    ojson top = ojson::array();
    for (const TokenLogprob& t : lp.top) top.push_back(token_json(t));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return ojson{{"content", std::move(content)}};
}

void CompletionLogprobs::add(int32_t token, const Logprobs* lp) {
  const std::string text = token_string(tok_, token, skip_special_);
  tokens_.push_back(text);
  text_offset_.push_back(offset_);
  offset_ += code_points(text);
  if (!lp) {
    token_logprobs_.push_back(nullptr);
    top_logprobs_.push_back(nullptr);
    return;
  }
  token_logprobs_.push_back(clamp_logprob(lp->chosen.logprob));
  // Like vLLM: the alternatives plus the chosen token, keyed by their text.
  ojson top = ojson::object();
  for (const TokenLogprob& t : lp->top) top[token_string(tok_, t.token, skip_special_)] = clamp_logprob(t.logprob);
  if (!top.contains(text)) top[text] = clamp_logprob(lp->chosen.logprob);
  top_logprobs_.push_back(std::move(top));
}

ojson CompletionLogprobs::json() const {
  return ojson{{"tokens", tokens_},
               {"token_logprobs", token_logprobs_},
               {"top_logprobs", top_logprobs_},
               {"text_offset", text_offset_}};
}

void CompletionLogprobs::clear_entries() {
  tokens_ = ojson::array();
  token_logprobs_ = ojson::array();
  top_logprobs_ = ojson::array();
  text_offset_ = ojson::array();
}

ojson chat_chunk(const std::string& id, int64_t created, const std::string& model, int index, ojson delta,
                 ojson logprobs, std::optional<FinishReason> finish, ojson stop_reason) {
  return chunk_json("chat.completion.chunk", id, created, model,
                    choice_json(index, "delta", std::move(delta), std::move(logprobs), finish, std::move(stop_reason)));
}

ojson completion_chunk(const std::string& id, int64_t created, const std::string& model, int index,
                       const std::string& text, ojson logprobs, std::optional<FinishReason> finish, ojson stop_reason) {
  return chunk_json("text_completion", id, created, model,
                    choice_json(index, "text", text, std::move(logprobs), finish, std::move(stop_reason)));
}

ojson usage_chunk(std::string_view object, const std::string& id, int64_t created, const std::string& model,
                  const Usage& usage) {
  return body_json(object, id, created, model, ojson::array(), usage);
}

ojson chat_choice(int index, const std::string& content, ojson logprobs, FinishReason finish, ojson stop_reason) {
  return choice_json(index, "message", ojson{{"role", "assistant"}, {"content", content}}, std::move(logprobs), finish,
                     std::move(stop_reason));
}

ojson chat_message_choice(int index, ojson message, ojson logprobs, std::string_view finish_reason, ojson stop_reason) {
  ojson c =
      choice_json(index, "message", std::move(message), std::move(logprobs), std::nullopt, std::move(stop_reason));
  c["finish_reason"] = std::string(finish_reason);
  return c;
}

ojson tool_call_json(const ToolCall& call) {
  return ojson{
      {"id", call.id}, {"type", "function"}, {"function", ojson{{"name", call.name}, {"arguments", call.arguments}}}};
}

ojson tool_call_delta_json(const ToolCallDelta& delta) {
  if (delta.first)
    return ojson{{"index", delta.index},
                 {"id", delta.id},
                 {"type", "function"},
                 {"function", ojson{{"name", delta.name}, {"arguments", ""}}}};
  return ojson{{"index", delta.index}, {"function", ojson{{"arguments", delta.arguments}}}};
}

ojson completion_choice(int index, const std::string& text, ojson logprobs, FinishReason finish, ojson stop_reason) {
  return choice_json(index, "text", text, std::move(logprobs), finish, std::move(stop_reason));
}

ojson chat_response(const std::string& id, int64_t created, const std::string& model, ojson choices,
                    const Usage& usage) {
  return body_json("chat.completion", id, created, model, std::move(choices), usage);
}

ojson completion_response(const std::string& id, int64_t created, const std::string& model, ojson choices,
                          const Usage& usage) {
  return body_json("text_completion", id, created, model, std::move(choices), usage);
}

}  // namespace tessera::api
