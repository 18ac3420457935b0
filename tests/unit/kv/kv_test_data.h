#pragma once
// Test data shared by the KV quantization tests (kv_quant_test.cpp, kv_quant_attention_test.cpp).
#include <cmath>
#include <random>
#include <vector>

namespace tessera::test {

inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Rows with a few large channels (as keys have) and an occasional huge token.
inline std::vector<float> outlier_rows(int n, int hd, std::mt19937& rng, bool spikes = true) {
  std::vector<float> v = randn(size_t(n) * hd, rng);
  for (int j = 0; j < n; ++j) {
    for (int c = 0; c < hd; c += 17) v[size_t(j) * hd + c] *= 12.0f;
    if (spikes && j % 11 == 3) v[size_t(j) * hd + (j % hd)] = 80.0f;
  }
  return v;
}

inline double rel_rms(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += double(got[i] - ref[i]) * (got[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace tessera::test
