#pragma once
// Building blocks of the sampler that work on a whole logit row: a reproducible exp, the
// candidate order, and linear-time top-k selection. They are separate from sampler.cpp so
// that tests can check each one against a float64 reference.
#include <bit>
#include <cstdint>
#include <span>
#include <vector>

namespace tessera {

// exp(x) for x <= 0 (x = -inf allowed), in float. Cephes' expf: x = n ln2 + r with
// |r| <= ln2/2, a degree-6 polynomial for e^r, and 2^n assembled from bits. It uses only
// +, -, *, and integer conversion of exact values, so it returns the same bits on every
// IEEE-754 machine (unlike std::exp, whose last bit depends on the C library) and the
// compiler vectorizes it. Relative error below 2.5e-7; returns 0 for x < -87 (e^-87 ≈ 1.6e-38,
// a probability far below anything that can be drawn).
inline float exp_nonpositive(float x) {
  // Contraction (a*b+c → fma) would change the bits on machines with FMA. GCC does not
  // contract in ISO mode (-std=c++20); clang must be told.
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
  const float xc = x < -87.0f ? -87.0f : x;
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer (ties to even).
  const float kRound = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  // ln2 split into a part with few significant bits (so n * ln2_hi is exact) and the rest.
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = (p * r) * r + r + 1.0f;
  // n is in [-126, 0], so 2^n is a normal float built directly from its exponent field.
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : er * two_n;
}

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
// Linear in the vocabulary (a filtered scan with occasional nth_element on a buffer of a
// few k), plus k log k for the final sort; never sorts the vocabulary.
void select_top_k(std::span<const float> logits, int64_t k, std::vector<ScoredToken>& out);

// The largest logit. Throws tessera::Error if a logit is NaN or +inf (a broken forward pass)
// or every logit is -inf (nothing can be sampled); -inf alone marks a banned token.
float checked_max_logit(std::span<const float> logits);

// Sum of the values in float64, in a fixed association (8 interleaved partial sums), so
// the result is the same on every platform and the loop still runs at memory speed.
double sum_f64(std::span<const float> values);

}  // namespace tessera
