#pragma once
// Float64 brute-force references for the sampler tests: a full sort of the vocabulary, exact
// softmax, and the filters applied by their textbook definitions. Slow on purpose and
// independent of src/sample (nothing from it is used here except SamplingParams).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "sample/sampling_params.h"

namespace tessera::test {

// Deterministic test data: mt19937_64 is fully specified, and the normal variates come from
// Box-Muller here (std::normal_distribution differs between standard libraries).
class TestRng {
 public:
  explicit TestRng(uint64_t seed) : gen_(seed) {}
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }
  double normal() {
    const double u1 = 1.0 - uniform();  // (0, 1]
    const double u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  int64_t below(int64_t n) { return static_cast<int64_t>(uniform() * static_cast<double>(n)); }

  // n logits ~ N(0, scale); with grid > 0 rounded to multiples of it, so ties are common.
  std::vector<float> logits(int64_t n, double scale, double grid = 0) {
    std::vector<float> out(static_cast<size_t>(n));
    for (float& v : out) {
      double x = normal() * scale;
      if (grid > 0) x = std::round(x / grid) * grid;
      v = static_cast<float>(x);
    }
    return out;
  }

 private:
  std::mt19937_64 gen_;
};

// Token ids in the sampler's candidate order: higher logit first, then lower id.
inline std::vector<int32_t> candidate_order(std::span<const float> logits) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  return order;
}

struct RefDistribution {
  std::map<int32_t, double> prob;  // surviving tokens → probability
  // A cumulative mass or a min-p ratio within `tolerance` of its threshold: float rounding
  // may legitimately decide such a case either way, so tests skip it.
  bool ambiguous = false;
};

// Temperature → top-k → top-p → min-p → softmax, on logits that already carry bias and
// penalties. temperature must be > 0. A cumulative top-p mass within top_p_tolerance of
// top_p is ambiguous: the sampler's float weights are accurate to about 1e-7 relative, times
// |t| for very unlikely tokens. Its min-p test is float64 like this one, hence the tight
// min_p_tolerance.
inline RefDistribution reference_distribution(std::span<const float> logits, const SamplingParams& p,
                                              double top_p_tolerance = 1e-6, double min_p_tolerance = 1e-9) {
  RefDistribution ref;
  const std::vector<int32_t> order = candidate_order(logits);
  const int64_t n = static_cast<int64_t>(order.size());
  const double max = logits[order[0]];
  const double temperature = p.temperature;
  std::vector<double> z(order.size());  // scaled logit by rank
  for (int64_t r = 0; r < n; ++r) z[r] = (static_cast<double>(logits[order[r]]) - max) / temperature;

  int64_t keep = n;
  if (p.top_k > 0 && p.top_k < n) keep = p.top_k;
  if (p.top_p < 1.0f) {
    double mass = 0;
    for (int64_t r = 0; r < keep; ++r) mass += std::exp(z[r]);
    double cum = 0;
    for (int64_t r = 0; r < keep; ++r) {
      cum += std::exp(z[r]) / mass;
      if (std::abs(cum - p.top_p) < top_p_tolerance) ref.ambiguous = true;
      if (cum >= p.top_p) {
        keep = r + 1;
        break;
      }
    }
  }
  if (p.min_p > 0.0f) {
    // Keep p_i / p_max >= min_p, with p_i / p_max = exp(z_i) (the max always survives).
    int64_t pass = 0;
    for (int64_t r = 0; r < keep; ++r) {
      const double ratio = std::exp(z[r]);
      // Ratio 1 (z = 0, the max and its ties) is exact on both sides, never ambiguous.
      if (z[r] != 0 && std::abs(ratio - p.min_p) < min_p_tolerance * p.min_p) ref.ambiguous = true;
      if (ratio >= p.min_p) pass = r + 1;
    }
    keep = pass;
  }
  double mass = 0;
  for (int64_t r = 0; r < keep; ++r) mass += std::exp(z[r]);
  for (int64_t r = 0; r < keep; ++r) ref.prob[order[r]] = std::exp(z[r]) / mass;
  return ref;
}

// log_softmax in float64 with std::exp / std::log.
inline std::vector<double> reference_log_softmax(std::span<const float> logits) {
  double max = -std::numeric_limits<double>::infinity();
  for (float v : logits) max = std::max(max, static_cast<double>(v));
  double z = 0;
  for (float v : logits) z += std::exp(static_cast<double>(v) - max);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - max - std::log(z);
  return out;
}

// Pearson chi-square statistic of observed counts against expected probabilities, bins with
// an expected count below 5 merged into one; returns {statistic, degrees of freedom}.
inline std::pair<double, int> chi_square(const std::map<int32_t, int64_t>& observed,
                                         const std::map<int32_t, double>& expected_prob, int64_t n_draws) {
  double stat = 0;
  int bins = 0;
  double small_expected = 0;
  double small_observed = 0;
  for (const auto& [token, prob] : expected_prob) {
    const double e = prob * static_cast<double>(n_draws);
    const auto it = observed.find(token);
    const double o = it == observed.end() ? 0.0 : static_cast<double>(it->second);
    if (e < 5) {
      small_expected += e;
      small_observed += o;
      continue;
    }
    stat += (o - e) * (o - e) / e;
    ++bins;
  }
  if (small_expected > 0) {
    stat += (small_observed - small_expected) * (small_observed - small_expected) / std::max(small_expected, 1e-300);
    ++bins;
  }
  return {stat, bins - 1};
}

// Upper 0.999 quantile of chi-square with df degrees of freedom (Wilson-Hilferty; close
// enough for df >= 3, and conservative for the tests' purpose).
inline double chi_square_critical_999(int df) {
  const double z = 3.090232;
  const double a = 2.0 / (9.0 * df);
  const double c = 1.0 - a + z * std::sqrt(a);
  return df * c * c * c;
}

}  // namespace tessera::test
