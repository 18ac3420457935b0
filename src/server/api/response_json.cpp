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
  ojson r;
  r["id"] = id;
  r["object"] = object;
  r["created"] = created;
  r["model"] = model;
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
  auto piece = [&](int32_t id) { return skipped(tok, id, skip_special) ? std::string_view() : tok.token_piece(id); };
  ojson content = ojson::array();
  for (const Logprobs& lp : entries) {
    ojson e;
    e["token"] = token_string(tok, lp.chosen.token, skip_special);
    e["logprob"] = clamp_logprob(lp.chosen.logprob);
    e["bytes"] = bytes_json(piece(lp.chosen.token));
    ojson top = ojson::array();
    for (const TokenLogprob& t : lp.top) {
      ojson te;
      te["token"] = token_string(tok, t.token, skip_special);
      te["logprob"] = clamp_logprob(t.logprob);
      te["bytes"] = bytes_json(piece(t.token));
      top.push_back(std::move(te));
    }
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
  ojson j;
  j["tokens"] = tokens_;
  j["token_logprobs"] = token_logprobs_;
  j["top_logprobs"] = top_logprobs_;
  j["text_offset"] = text_offset_;
  return j;
}

void CompletionLogprobs::clear_entries() {
  tokens_ = ojson::array();
  token_logprobs_ = ojson::array();
  top_logprobs_ = ojson::array();
  text_offset_ = ojson::array();
}

ojson chat_chunk(const std::string& id, int64_t created, const std::string& model, int index, ojson delta,
                 ojson logprobs, std::optional<FinishReason> finish) {
  ojson r = response_head("chat.completion.chunk", id, created, model);
  ojson choice;
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_json(finish);
  r["choices"] = ojson::array({std::move(choice)});
  return r;
}

ojson completion_chunk(const std::string& id, int64_t created, const std::string& model, int index,
                       const std::string& text, ojson logprobs, std::optional<FinishReason> finish) {
  ojson r = response_head("text_completion", id, created, model);
  ojson choice;
  choice["index"] = index;
  choice["text"] = text;
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = finish_json(finish);
  r["choices"] = ojson::array({std::move(choice)});
  return r;
}

ojson usage_chunk(std::string_view object, const std::string& id, int64_t created, const std::string& model,
                  const Usage& usage) {
  ojson r = response_head(object, id, created, model);
  r["choices"] = ojson::array();
  r["usage"] = usage_json(usage);
  return r;
}

ojson chat_choice(int index, const std::string& content, ojson logprobs, FinishReason finish) {
  ojson c;
  c["index"] = index;
  c["message"] = ojson{{"role", "assistant"}, {"content", content}};
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = finish_json(finish);
  return c;
}

ojson completion_choice(int index, const std::string& text, ojson logprobs, FinishReason finish) {
  ojson c;
  c["index"] = index;
  c["text"] = text;
  c["logprobs"] = std::move(logprobs);
  c["finish_reason"] = finish_json(finish);
  return c;
}

ojson chat_response(const std::string& id, int64_t created, const std::string& model, ojson choices,
                    const Usage& usage) {
  ojson r = response_head("chat.completion", id, created, model);
  r["choices"] = std::move(choices);
  r["usage"] = usage_json(usage);
  return r;
}

ojson completion_response(const std::string& id, int64_t created, const std::string& model, ojson choices,
                          const Usage& usage) {
  ojson r = response_head("text_completion", id, created, model);
  r["choices"] = std::move(choices);
  r["usage"] = usage_json(usage);
  return r;
}

}  // namespace tessera::api
