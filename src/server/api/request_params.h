#pragma once
// The parameters /v1/completions and /v1/chat/completions share: sampling, n, stop strings,
// streaming and logprobs options, read from the request body with every type and range
// checked, each refusal a 400 naming the parameter. Endpoint-specific fields (prompt,
// messages, echo) are read in completion_request / chat_request.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sample/sampling_params.h"
#include "server/api/json_fields.h"
#include "server/api/served_model.h"

namespace tessera::api {

enum class Endpoint { Completions, Chat };

// Bounds that keep one request from making the server allocate or loop without limit.
inline constexpr int kMaxStopStrings = 64;
inline constexpr size_t kMaxStopStringBytes = 1024;
inline constexpr int kMaxLogitBiasEntries = 1024;
inline constexpr int kMaxPrompts = 64;                      // /v1/completions prompt lists
inline constexpr size_t kMaxPromptBytes = 4 * 1024 * 1024;  // one prompt or message text
inline constexpr size_t kMaxUserBytes = 256;
inline constexpr float kMaxApiTemperature = 2.0f;  // OpenAI's bound

struct GenerationOptions {
  SamplingParams sampling;                      // max_tokens is set per prompt (sampling_for_prompt)
  std::optional<int32_t> max_tokens;            // as asked; unset: whatever the context leaves
  std::string max_tokens_param = "max_tokens";  // or max_completion_tokens, for errors
  int n = 1;
  int32_t priority = 0;           // lower runs first (--scheduling-policy priority only)
  std::vector<std::string> stop;  // stop strings, matched on the output text
  bool include_stop_str_in_output = false;
  bool skip_special_tokens = true;
  // tessera extension: false opts this request out of speculative decoding (when the server
  // runs with --speculative-config); outputs are the same either way, only the speed differs.
  bool speculative = true;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool logprobs = false;       // report the chosen token's logprob
  int32_t top_logprobs = 0;    // and this many alternatives
  std::string user;
};

GenerationOptions parse_generation_options(const json& body, Endpoint endpoint, const ServedModel& model);

// The sampling parameters for one prompt of n_prompt tokens: max_tokens defaults to what the
// context leaves (as vLLM does); a prompt that fills the context, or prompt + max_tokens over
// it, is a 400 (code "context_length_exceeded") that states both counts. Every range of
// SamplingParams::validate is checked here, mapped to the request's parameter names.
SamplingParams sampling_for_prompt(const GenerationOptions& options, int64_t n_prompt, const ServedModel& model,
                                   const std::string& prompt_param);

// A list of token ids (prompt_token_ids, detokenize): integers in [0, vocab_size).
std::vector<int32_t> parse_token_ids(const json& value, const std::string& param, int32_t vocab_size, size_t max_count);

}  // namespace tessera::api
