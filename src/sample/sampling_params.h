#pragma once
// What one request asks of the sampler. The OpenAI server fills this from the request body
// and the engine hands it to a Sampler (src/sample/sampler.h); validate() is the single place
// that decides what is acceptable, so every front end rejects the same inputs the same way.
// Contract and processor order: docs/design/sampling.md.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace tessera {

class CompiledGrammar;  // grammar/grammar.h

struct SamplingParams {
  // Bounds enforced by validate(). Counts are bounded so that one request cannot make the
  // engine allocate or loop without limit.
  static constexpr float kMaxTemperature = 100.0f;
  static constexpr float kMaxRepetitionPenalty = 10.0f;
  static constexpr float kMaxPresencePenalty = 2.0f;   // OpenAI: [-2, 2]
  static constexpr float kMaxFrequencyPenalty = 2.0f;  // OpenAI: [-2, 2]
  static constexpr float kMaxLogitBias = 100.0f;       // OpenAI: [-100, 100]
  static constexpr int32_t kMaxMaxTokens = 1 << 20;
  static constexpr int32_t kMaxStopTokenIds = 1024;
  static constexpr int32_t kMaxLogprobs = 20;  // OpenAI top_logprobs: [0, 20]

  // Divides the logits before the softmax. 0 selects greedy decoding (argmax, lowest id on
  // ties); any positive value, however small, samples.
  float temperature = 1.0f;
  // Keep only the k most likely tokens; 0 or -1 turns it off (so does k >= vocab size).
  int32_t top_k = 0;
  // Keep the smallest set of most likely tokens whose probability reaches top_p; 1 = off.
  float top_p = 1.0f;
  // Drop tokens whose probability is below min_p times the most likely token's; 0 = off.
  float min_p = 0.0f;
  // llama.cpp / Hugging Face repetition penalty over every token seen in the prompt or the
  // output so far: positive logits are divided by it, negative ones multiplied. 1 = off.
  float repetition_penalty = 1.0f;
  // OpenAI penalties over generated tokens only: logit -= presence * [count > 0]
  //                                                       + frequency * count.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Added to the logit of the token id before anything else (OpenAI logit_bias).
  std::map<int32_t, float> logit_bias;
  // Same seed + same logits, step by step → same tokens, on every platform. Unset: the
  // sampler draws a seed once from std::random_device (Sampler::seed() reports it).
  std::optional<uint64_t> seed;
  // Generation limits, enforced by the engine, not by the sampler.
  int32_t max_tokens = 256;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // How many most likely alternatives to report with each token (log-probabilities of the
  // raw model distribution); the chosen token's own log-probability is always available.
  int32_t n_logprobs = 0;
  // Structured output: every sampled token keeps the output inside this grammar (the engine's
  // executor masks the row before the processors above). Shared by the request's choices.
  std::shared_ptr<const CompiledGrammar> grammar;

  // Throws tessera::Error naming the first parameter out of range (NaN and infinities are
  // out of every range). vocab_size bounds top_k and every token id.
  void validate(int32_t vocab_size) const;

  bool greedy() const { return temperature == 0.0f; }
};

}  // namespace tessera
