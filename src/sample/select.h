#pragma once
// Candidate order and linear-time top-k selection over a logit row. Separate from
// sampler.cpp so that tests can check them against a float64 brute force.
#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// One token of a candidate list.
struct ScoredToken {
  float logit;
  int32_t id;
};

// The candidate order used everywhere in sampling: higher logit first, and among equal
// logits the lower token id first. It is a strict total order, so "the k best" and "the
// shortest prefix reaching mass p" are well defined even with ties.
inline bool ranks_before(const ScoredToken& a, const ScoredToken& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Replaces `out` with the min(k, n) first tokens of `logits` in candidate order, sorted.
// Linear in the vocabulary (a vectorized threshold scan with occasional nth_element on a
// buffer of a few k), plus k log k for the final sort; never sorts the vocabulary.
void select_top_k(std::span<const float> logits, int64_t k, std::vector<ScoredToken>& out);

// The largest logit. Throws tessera::Error if a logit is NaN or +inf (a broken forward pass)
// or every logit is -inf (nothing can be sampled); -inf alone marks a banned token.
float checked_max_logit(std::span<const float> logits);

// Index of the first logit equal to max (max as returned by checked_max_logit).
int64_t first_index_of_max(std::span<const float> logits, float max);

}  // namespace tessera
