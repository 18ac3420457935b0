#pragma once
// Turns one row of logits into one token, per sequence. A Sampler holds what must persist
// across the steps of one sequence: its parameters, its random generator, and the tokens
// seen so far (for the penalties). The engine calls, for every step:
//
//   int32_t token = sampler.sample(logits);   // or sample_with_logprobs(logits)
//   sampler.accept(token);                    // record it as generated output
//
// sample() does not record the token itself, so a caller that discards a sampled token
// (speculative decoding, a stop sequence cut) simply does not accept it.
//
// Processor order (docs/design/sampling.md): logit bias → repetition, presence and
// frequency penalties → [temperature 0: argmax] → temperature → top-k → top-p → min-p →
// softmax → draw. Candidate order, used for top-k and top-p and all ties: higher logit
// first, then lower token id.
//
// Reproducibility: with a seed, the tokens depend only on the seed, the parameters, the
// prompt, the sequence of logit rows (bit for bit) and the accepted tokens, on every
// platform: the generator is std::mt19937_64 (fully specified by the C++ standard), each
// non-greedy step consumes exactly one 64-bit output, and all arithmetic on the way is
// IEEE-754 in a fixed order (the scalar and AVX2 row kernels give the same bits).
//
// Not thread-safe: one Sampler per sequence.
#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <vector>

#include "sample/sampling_params.h"
#include "sample/select.h"

namespace tessera {

struct TokenLogprob {
  int32_t token = -1;
  double logprob = 0;  // natural log; -inf for a token whose logit is -inf
};

struct Logprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // the n most likely tokens, candidate order
};

// Log-probabilities under the RAW model distribution, log_softmax(logits) — what vLLM
// reports by default — for `token` and for the n_top most likely tokens. Max-subtracted
// with a float64 sum: accurate to about 1e-7 absolute.
Logprobs compute_logprobs(std::span<const float> logits, int32_t token, int32_t n_top);

struct SampleResult {
  int32_t token = -1;
  Logprobs logprobs;  // raw distribution; top holds params.n_logprobs entries
};

struct TokenProb {
  int32_t token = -1;
  double prob = 0;
};

class Sampler {
 public:
  // Validates params against vocab_size (throws tessera::Error). prompt_tokens are the
  // tokens the repetition penalty looks at before any output exists; they are copied.
  Sampler(SamplingParams params, int32_t vocab_size, std::span<const int32_t> prompt_tokens = {});

  const SamplingParams& params() const { return params_; }
  int32_t vocab_size() const { return vocab_size_; }
  // The seed in use: params.seed, or the one drawn at construction when it was unset.
  uint64_t seed() const { return seed_; }
  // Output tokens accepted so far.
  int64_t n_accepted() const { return n_accepted_; }

  // Draws the next token from logits [vocab_size]. The row is modified in place: logit bias
  // and penalties are applied to it (nothing else is written). Does not record the token.
  int32_t sample(std::span<float> logits);

  // sample() plus log-probabilities of the raw row as it was passed in (before bias and
  // penalties): the chosen token and the params.n_logprobs most likely tokens.
  SampleResult sample_with_logprobs(std::span<float> logits);

  // Records `token` as generated output (for repetition, presence and frequency penalties).
  void accept(int32_t token);

  // One output of the sequence's random stream as a double in [0, 1) (its top 53 bits), the
  // same mapping draw() uses: speculative verification (src/spec/verify.h) takes its
  // acceptance and resampling draws from here, so a seeded request stays reproducible.
  double uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

  // The exact distribution sample() would draw from for this row, over the tokens that
  // survive all processors, sorted by token id, probabilities summing to 1. Applies bias and
  // penalties to the row in place like sample(), and consumes no randomness. For greedy
  // decoding, the argmax with probability 1.
  std::vector<TokenProb> distribution(std::span<float> logits);

 private:
  // The surviving candidates with unnormalized weights exp((logit - max) / temperature).
  // Sparse: ids_[i] has weights_[i]. Dense: every token; only the mass of each block of
  // tokens is stored (block_mass_), weights are recomputed where needed.
  struct Candidates {
    bool dense = false;
    float max = 0;
    double total = 0;
  };

  struct HistoryEntry {
    int32_t token;
    int32_t output_count;  // 0 for a token seen only in the prompt
  };

  void check_row(std::span<const float> logits) const;
  void apply_bias_and_penalties(std::span<float> logits);
  void remember_original(std::span<const float> logits, int32_t token);
  int32_t argmax(std::span<const float> logits) const;
  Candidates select_candidates(std::span<const float> logits);
  void select_top_p_over_vocabulary(std::span<const float> logits, float max);
  void resolve_top_p_boundary(float max, double need);
  void keep_min_p(std::span<const float> logits, float max);
  int32_t draw(std::span<const float> logits, const Candidates& c);
  HistoryEntry& history_entry(int32_t token);

  SamplingParams params_;
  int32_t vocab_size_;
  uint64_t seed_;
  float inv_temperature_;  // 1 / temperature, capped at the largest float
  std::mt19937_64 rng_;
  bool penalties_on_;
  int64_t n_accepted_ = 0;

  // Tokens seen in prompt or output (only tracked when a penalty is on), with their slots.
  std::vector<HistoryEntry> history_;
  std::unordered_map<int32_t, int32_t> history_slot_;

  // Original logits of the entries bias and penalties changed, while logprobs need them.
  bool remember_originals_ = false;
  std::vector<ScoredToken> originals_;

  // Scratch reused across steps (no allocation per token once warm).
  std::vector<ScoredToken> ranked_;    // top-k result
  std::vector<ScoredToken> boundary_;  // top-p: the tokens of the bucket where p is reached
  std::vector<ScoredToken> boundary_next_;
  std::vector<int32_t> ids_;        // sparse candidates
  std::vector<float> weights_;      // their weights (dense: one block's, or the row's)
  std::vector<double> block_mass_;  // dense: weight sum of each block of kDrawBlock
};

}  // namespace tessera
