#include "sample/sampling_params.h"

#include "core/error.h"

namespace tessera {

namespace {

// Every check is written as !(lo <= x && x <= hi) so that NaN, which fails every
// comparison, is rejected along with the out-of-range values.
void check_closed(const char* name, double x, double lo, double hi) {
  if (!(x >= lo && x <= hi)) fail("sampling parameter '", name, "' must be in [", lo, ", ", hi, "], got ", x);
}

void check_token_id(const char* name, int32_t id, int32_t vocab_size) {
  if (!(id >= 0 && id < vocab_size))
    fail("sampling parameter '", name, "' has token id ", id, " outside the vocabulary [0, ", vocab_size, ")");
}

}  // namespace

void SamplingParams::validate(int32_t vocab_size) const {
  TESSERA_CHECK(vocab_size > 0, "sampling: vocabulary size must be positive, got ", vocab_size);
  check_closed("temperature", temperature, 0.0, kMaxTemperature);
  if (!(top_k >= -1 && top_k <= vocab_size))
    fail("sampling parameter 'top_k' must be -1, 0 (off) or in [1, vocab size ", vocab_size, "], got ", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) fail("sampling parameter 'top_p' must be in (0, 1], got ", top_p);
  check_closed("min_p", min_p, 0.0, 1.0);
  if (!(repetition_penalty > 0.0f && repetition_penalty <= kMaxRepetitionPenalty))
    fail("sampling parameter 'repetition_penalty' must be in (0, ", kMaxRepetitionPenalty, "], got ",
         repetition_penalty);
  check_closed("presence_penalty", presence_penalty, -kMaxPresencePenalty, kMaxPresencePenalty);
  check_closed("frequency_penalty", frequency_penalty, -kMaxFrequencyPenalty, kMaxFrequencyPenalty);
  for (const auto& [id, bias] : logit_bias) {
    check_token_id("logit_bias", id, vocab_size);
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias))
      fail("sampling parameter 'logit_bias' for token ", id, " must be in [", -kMaxLogitBias, ", ", kMaxLogitBias,
           "], got ", bias);
  }
  if (!(max_tokens >= 1 && max_tokens <= kMaxMaxTokens))
    fail("sampling parameter 'max_tokens' must be in [1, ", kMaxMaxTokens, "], got ", max_tokens);
  if (!(stop_token_ids.size() <= static_cast<size_t>(kMaxStopTokenIds)))
    fail("sampling parameter 'stop_token_ids' has ", stop_token_ids.size(), " entries, at most ", kMaxStopTokenIds,
         " are allowed");
  for (int32_t id : stop_token_ids) check_token_id("stop_token_ids", id, vocab_size);
  if (!(n_logprobs >= 0 && n_logprobs <= kMaxLogprobs))
    fail("sampling parameter 'n_logprobs' must be in [0, ", kMaxLogprobs, "], got ", n_logprobs);
}

}  // namespace tessera
