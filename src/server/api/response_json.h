#pragma once
// The JSON of OpenAI responses, chunks and logprobs, built in one place so that streamed and
// complete responses agree. Keys keep OpenAI's order (ordered_json). Formats:
// docs/design/openai-api.md.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "engine/request.h"  // FinishReason
#include "sample/sampler.h"
#include "server/api/tool_parser.h"

namespace tessera {
class Tokenizer;
}

namespace tessera::api {

using ojson = nlohmann::ordered_json;

inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
// JSON has no -infinity: a token the model rules out is reported at this value, as vLLM does.
inline constexpr double kMinLogprob = -9999.0;

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
};
ojson usage_json(const Usage& usage);

// "stop", "length", "abort", "error".
std::string finish_reason_string(FinishReason reason);

// One server-sent event: "data: <json>\n\n" (invalid UTF-8 is replaced, never thrown on).
std::string sse_event(const ojson& value);
std::string dump_json(const ojson& value);

// A token as text for logprobs: its bytes, with any partial UTF-8 shown as U+FFFD; "" for a
// control or unknown token when special tokens are skipped (as the text skips them, so the
// token strings of a choice join up to its text).
std::string token_string(const Tokenizer& tok, int32_t id, bool skip_special = false);

// Chat logprobs, {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]}.
ojson chat_logprobs_json(const Tokenizer& tok, std::span<const Logprobs> entries, bool skip_special = false);

// Legacy completions logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
// Append prompt tokens (echo) and output tokens in order; a prompt's first token has no
// logprob (null), as in OpenAI and vLLM.
class CompletionLogprobs {
 public:
  explicit CompletionLogprobs(const Tokenizer& tok, bool skip_special = false)
      : tok_(tok), skip_special_(skip_special) {}
  // lp: the token's logprobs, or nullptr for a token without any (the prompt's first).
  void add(int32_t token, const Logprobs* lp);
  bool empty() const { return tokens_.empty(); }
  size_t size() const { return tokens_.size(); }
  ojson json() const;
  // Starts a new chunk (streaming): the next json() holds only tokens added after this call;
  // text offsets keep counting from the start of the choice.
  void clear_entries();

 private:
  const Tokenizer& tok_;
  bool skip_special_;
  ojson tokens_ = ojson::array();
  ojson token_logprobs_ = ojson::array();
  ojson top_logprobs_ = ojson::array();
  ojson text_offset_ = ojson::array();
  int64_t offset_ = 0;  // characters (code points) so far
};

// Every choice carries "stop_reason" as vLLM writes it: the stop string that matched, the
// stop_token_ids entry that ended it, or null (EOS, length, abort, or not finished yet).
// Streaming chunks.
ojson chat_chunk(const std::string& id, int64_t created, const std::string& model, int index, ojson delta,
                 ojson logprobs, std::optional<FinishReason> finish, ojson stop_reason = nullptr);
ojson completion_chunk(const std::string& id, int64_t created, const std::string& model, int index,
                       const std::string& text, ojson logprobs, std::optional<FinishReason> finish,
                       ojson stop_reason = nullptr);
// The last chunk with include_usage: empty choices and the usage.
ojson usage_chunk(std::string_view object, const std::string& id, int64_t created, const std::string& model,
                  const Usage& usage);

// Complete responses: choices are built with the *_choice helpers.
ojson chat_choice(int index, const std::string& content, ojson logprobs, FinishReason finish,
                  ojson stop_reason = nullptr);
ojson completion_choice(int index, const std::string& text, ojson logprobs, FinishReason finish,
                        ojson stop_reason = nullptr);
// A chat choice whose message is built by the caller (tool calls); finish_reason as given.
ojson chat_message_choice(int index, ojson message, ojson logprobs, std::string_view finish_reason,
                          ojson stop_reason = nullptr);
// The "tool_calls" finish reason: the choice stopped after making calls (its stop or EOS).
inline constexpr std::string_view kToolCallsFinish = "tool_calls";
// {"id", "type": "function", "function": {"name", "arguments"}} of a complete call, and the
// streamed delta of one: the first with index, id, type, name and arguments "", later ones
// index and an arguments fragment.
ojson tool_call_json(const ToolCall& call);
ojson tool_call_delta_json(const ToolCallDelta& delta);

ojson chat_response(const std::string& id, int64_t created, const std::string& model, ojson choices,
                    const Usage& usage);
ojson completion_response(const std::string& id, int64_t created, const std::string& model, ojson choices,
                          const Usage& usage);

}  // namespace tessera::api
