#include "server/api/request_params.h"

#include <algorithm>
#include <charconv>
#include <limits>

#include "engine/engine_core.h"
#include "server/api/api_error.h"
#include "server/api/structured_output.h"

namespace tessera::api {

void set_engine_limits(ServedModel& model, const EngineConfig& config) {
  model.vocab_size = config.vocab_size;
  model.max_n = config.max_n;
  // The engine refuses a choice whose total - 1 tokens need more blocks than the pool has.
  const int64_t kv_tokens = static_cast<int64_t>(config.n_blocks) * config.block_size + 1;
  model.max_model_len = static_cast<int32_t>(std::min<int64_t>(config.scheduler.max_model_len, kv_tokens));
}

namespace {

float read_float(const Fields& f, std::string_view key, float fallback) {
  const auto v = f.number(key);
  if (!v) return fallback;
  // Out of float range becomes infinity, which validate() refuses by name.
  return static_cast<float>(*v);
}

std::vector<std::string> parse_stop(const Fields& f) {
  std::vector<std::string> stops;
  const json* v = f.get("stop");
  if (!v) return stops;
  auto add = [&](const json& s, const std::string& param) {
    if (!s.is_string()) invalid_param(param, "invalid_type", "'", param, "' must be a string, got ", json_type_name(s));
    std::string text = s.get<std::string>();
    if (text.empty()) invalid_param(param, "invalid_value", "'", param, "' must not be an empty string");
    check_text(text, param, kMaxStopStringBytes);
    stops.push_back(std::move(text));
  };
  if (v->is_string()) {
    add(*v, "stop");
  } else if (v->is_array()) {
    if (v->size() > static_cast<size_t>(kMaxStopStrings))
      invalid_param("stop", "invalid_value", "'stop' has ", v->size(), " strings, at most ", kMaxStopStrings,
                    " are allowed");
    for (const json& s : *v) add(s, "stop");
  } else {
    invalid_param("stop", "invalid_type", "'stop' must be a string or an array of strings, got ", json_type_name(*v));
  }
  return stops;
}

std::map<int32_t, float> parse_logit_bias(const Fields& f, int32_t vocab_size) {
  std::map<int32_t, float> bias;
  const json* v = f.get("logit_bias");
  if (!v) return bias;
  if (!v->is_object())
    invalid_param("logit_bias", "invalid_type", "'logit_bias' must be an object mapping token ids to numbers, got ",
                  json_type_name(*v));
  if (v->size() > static_cast<size_t>(kMaxLogitBiasEntries))
    invalid_param("logit_bias", "invalid_value", "'logit_bias' has ", v->size(), " entries, at most ",
                  kMaxLogitBiasEntries, " are allowed");
  for (const auto& [key, value] : v->items()) {
    int64_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || key.empty())
      invalid_param("logit_bias", "invalid_value", "'logit_bias' key '", key, "' is not a token id");
    if (!(id >= 0 && id < vocab_size))
      invalid_param("logit_bias", "invalid_value", "'logit_bias' token id ", id, " is outside the vocabulary [0, ",
                    vocab_size, ")");
    if (!value.is_number())
      invalid_param("logit_bias", "invalid_type", "'logit_bias' value for token ", id, " must be a number, got ",
                    json_type_name(value));
    const double b = value.get<double>();
    if (!(b >= -SamplingParams::kMaxLogitBias && b <= SamplingParams::kMaxLogitBias))
      invalid_param("logit_bias", "invalid_value", "'logit_bias' value for token ", id, " must be in [",
                    -SamplingParams::kMaxLogitBias, ", ", SamplingParams::kMaxLogitBias, "], got ", b);
    bias[static_cast<int32_t>(id)] = static_cast<float>(b);
  }
  return bias;
}

std::optional<uint64_t> parse_seed(const Fields& f) {
  const json* v = f.get("seed");
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<uint64_t>();
  if (v->is_number_integer()) return static_cast<uint64_t>(v->get<int64_t>());  // two's complement, as vLLM
  invalid_param("seed", "invalid_type", "'seed' must be an integer, got ", json_type_name(*v));
}

void parse_logprobs(const Fields& f, Endpoint endpoint, GenerationOptions& o) {
  const int64_t max_lp = SamplingParams::kMaxLogprobs;
  if (endpoint == Endpoint::Completions) {
    // Legacy completions: logprobs is the number of alternatives (0 = the chosen token only).
    if (const auto k = f.integer("logprobs", 0, max_lp)) {
      o.logprobs = true;
      o.top_logprobs = static_cast<int32_t>(*k);
    }
    return;
  }
  o.logprobs = f.boolean("logprobs").value_or(false);
  if (const auto k = f.integer("top_logprobs", 0, max_lp)) {
    if (!o.logprobs && *k > 0)
      invalid_param("top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs' set to true");
    o.top_logprobs = static_cast<int32_t>(*k);
  }
}

}  // namespace

GenerationOptions parse_generation_options(const json& body, Endpoint endpoint, const ServedModel& model) {
  const Fields f(body);
  GenerationOptions o;
  SamplingParams& sp = o.sampling;

  o.n = static_cast<int>(f.integer("n", 1, model.max_n).value_or(1));
  // vLLM's extension; the engine refuses a non-zero one unless it schedules by priority.
  o.priority = static_cast<int32_t>(
      f.integer("priority", std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max()).value_or(0));
  // max_completion_tokens is the newer name (chat); it wins when both are given, as in vLLM.
  // Over the context is refused per prompt (sampling_for_prompt), with both counts.
  const int64_t max_tokens_hi = SamplingParams::kMaxMaxTokens;
  if (const auto m = f.integer("max_completion_tokens", 1, max_tokens_hi)) {
    o.max_tokens = static_cast<int32_t>(*m);
    o.max_tokens_param = "max_completion_tokens";
  } else if (const auto m2 = f.integer("max_tokens", 1, max_tokens_hi)) {
    o.max_tokens = static_cast<int32_t>(*m2);
  }

  sp.temperature = read_float(f, "temperature", 1.0f);
  // OpenAI's range, narrower than the sampler's: clients rely on 400 above 2.
  if (!(sp.temperature >= 0.0f && sp.temperature <= kMaxApiTemperature))
    invalid_param("temperature", "invalid_value", "'temperature' must be in [0, ", kMaxApiTemperature, "], got ",
                  sp.temperature);
  sp.top_p = read_float(f, "top_p", 1.0f);
  sp.top_k = static_cast<int32_t>(f.integer("top_k", -1, model.vocab_size).value_or(0));
  sp.min_p = read_float(f, "min_p", 0.0f);
  sp.presence_penalty = read_float(f, "presence_penalty", 0.0f);
  sp.frequency_penalty = read_float(f, "frequency_penalty", 0.0f);
  sp.repetition_penalty = read_float(f, "repetition_penalty", 1.0f);
  sp.logit_bias = parse_logit_bias(f, model.vocab_size);
  sp.seed = parse_seed(f);
  sp.ignore_eos = f.boolean("ignore_eos").value_or(false);
  if (const json* ids = f.get("stop_token_ids"))
    sp.stop_token_ids = parse_token_ids(*ids, "stop_token_ids", model.vocab_size, SamplingParams::kMaxStopTokenIds);

  o.stop = parse_stop(f);
  o.include_stop_str_in_output = f.boolean("include_stop_str_in_output").value_or(false);
  o.skip_special_tokens = f.boolean("skip_special_tokens").value_or(true);
  o.speculative = f.boolean("speculative").value_or(true);
  o.user = f.string("user", kMaxUserBytes).value_or("");
  parse_logprobs(f, endpoint, o);
  sp.n_logprobs = o.top_logprobs;

  o.stream = f.boolean("stream").value_or(false);
  if (const json* so = f.get("stream_options")) {
    if (!so->is_object())
      invalid_param("stream_options", "invalid_type", "'stream_options' must be an object, got ", json_type_name(*so));
    if (!o.stream)
      invalid_param("stream_options", "invalid_value", "'stream_options' can only be set when 'stream' is true");
    o.include_usage = Fields(*so, "stream_options.").boolean("include_usage").value_or(false);
  }
  // Compiled here, on a prompt worker, so the engine thread only ever matches.
  sp.grammar = structured_output_grammar(f, model.grammar);

  // Every range at once, through the engine's own rules (the same ones it enforces); max_tokens
  // and the token ids were range-checked above, so a placeholder keeps validate() quiet about them.
  SamplingParams check = sp;
  check.max_tokens = 1;
  try {
    check.validate(model.vocab_size);
  } catch (const Error& e) {
    throw from_sampling_error(e.what(), {{"n_logprobs", endpoint == Endpoint::Chat ? "top_logprobs" : "logprobs"}});
  }
  return o;
}

SamplingParams sampling_for_prompt(const GenerationOptions& options, int64_t n_prompt, const ServedModel& model,
                                   const std::string& prompt_param) {
  const int64_t ctx = model.max_model_len;
  if (n_prompt >= ctx)
    throw ApiError(400,
                   detail::concat("this model's maximum context length is ", ctx, " tokens, but the prompt has ",
                                  n_prompt, " tokens (at least one must be left for the completion)"),
                   "invalid_request_error", prompt_param, "context_length_exceeded");
  SamplingParams sp = options.sampling;
  if (options.max_tokens) {
    if (n_prompt + *options.max_tokens > ctx)
      throw ApiError(400,
                     detail::concat("this model's maximum context length is ", ctx, " tokens, but ",
                                    n_prompt + *options.max_tokens, " were requested (", n_prompt, " in the prompt + ",
                                    *options.max_tokens, " in '", options.max_tokens_param, "')"),
                     "invalid_request_error", options.max_tokens_param, "context_length_exceeded");
    sp.max_tokens = *options.max_tokens;
  } else {
    sp.max_tokens = static_cast<int32_t>(std::min<int64_t>(ctx - n_prompt, SamplingParams::kMaxMaxTokens));
  }
  return sp;
}

std::vector<int32_t> parse_token_ids(const json& value, const std::string& param, int32_t vocab_size,
                                     size_t max_count) {
  if (!value.is_array())
    invalid_param(param, "invalid_type", "'", param, "' must be an array of token ids, got ", json_type_name(value));
  if (value.size() > max_count)
    invalid_param(param, "invalid_value", "'", param, "' has ", value.size(), " token ids, at most ", max_count,
                  " are allowed");
  std::vector<int32_t> ids;
  ids.reserve(value.size());
  for (size_t i = 0; i < value.size(); ++i) {
    const json& t = value[i];
    if (!t.is_number_integer())
      invalid_param(param, "invalid_type", "'", param, "' entry ", i, " must be an integer token id, got ",
                    json_type_name(t));
    // Unsigned values above int64 read as huge; both signs are compared before narrowing.
    const bool in_range = t.is_number_unsigned() ? t.get<uint64_t>() < static_cast<uint64_t>(vocab_size)
                                                 : (t.get<int64_t>() >= 0 && t.get<int64_t>() < vocab_size);
    if (!in_range)
      invalid_param(param, "invalid_value", "'", param, "' entry ", i, " is ", t.dump(),
                    ", outside the vocabulary [0, ", vocab_size, ")");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

}  // namespace tessera::api
