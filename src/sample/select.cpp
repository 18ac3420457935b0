#include "sample/select.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace tessera {

void select_top_k(std::span<const float> logits, int64_t k, std::vector<ScoredToken>& out) {
  out.clear();
  const int64_t n = static_cast<int64_t>(logits.size());
  k = std::min(k, n);
  if (k <= 0) return;
  // Elements are buffered and the buffer is cut back to its k best whenever it fills. After
  // a cut, the k-th best so far is a threshold: a later token (higher id) beats it only with
  // a strictly greater logit, so everything else is skipped by one compare.
  constexpr int64_t kChunk = 16;
  const int64_t capacity = std::max<int64_t>(4 * k, 256);
  out.reserve(static_cast<size_t>(capacity + kChunk));
  auto cut = [&] {
    std::nth_element(out.begin(), out.begin() + (k - 1), out.end(), ranks_before);
    out.resize(static_cast<size_t>(k));
    return out.back().logit;
  };

  int64_t i = 0;
  for (; i < n && static_cast<int64_t>(out.size()) < capacity; ++i)
    out.push_back({logits[i], static_cast<int32_t>(i)});
  if (i < n) {
    float threshold = cut();
    for (; i < n; i += kChunk) {
      const int64_t end = std::min(i + kChunk, n);
      bool any = false;  // a vectorizable pre-check: most chunks hold nothing above the bar
      for (int64_t j = i; j < end; ++j) any |= logits[j] > threshold;
      if (!any) continue;
      for (int64_t j = i; j < end; ++j)
        if (logits[j] > threshold) out.push_back({logits[j], static_cast<int32_t>(j)});
      if (static_cast<int64_t>(out.size()) >= capacity) threshold = cut();
    }
  }
  if (static_cast<int64_t>(out.size()) > k) cut();
  std::sort(out.begin(), out.end(), ranks_before);
}

float checked_max_logit(std::span<const float> logits) {
  float max = -std::numeric_limits<float>::infinity();
  bool has_nan = false;
  for (float v : logits) {
    max = v > max ? v : max;
    has_nan |= v != v;
  }
  if (has_nan) {
    const auto it = std::find_if(logits.begin(), logits.end(), [](float v) { return v != v; });
    fail("sampling: logit of token ", it - logits.begin(), " is NaN");
  }
  if (max == std::numeric_limits<float>::infinity()) {
    const auto it = std::find(logits.begin(), logits.end(), max);
    fail("sampling: logit of token ", it - logits.begin(), " is +inf");
  }
  TESSERA_CHECK(max > -std::numeric_limits<float>::infinity(),
                "sampling: every logit is -inf (or the row is empty), no token can be sampled");
  return max;
}

double sum_f64(std::span<const float> values) {
  double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t n = values.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (size_t j = 0; j < 8; ++j) partial[j] += static_cast<double>(values[i + j]);
  for (size_t j = 0; i < n; ++i, ++j) partial[j] += static_cast<double>(values[i]);
  return ((partial[0] + partial[1]) + (partial[2] + partial[3])) +
         ((partial[4] + partial[5]) + (partial[6] + partial[7]));
}

}  // namespace tessera
