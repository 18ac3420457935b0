#include "sample/select.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"
#include "sample/row_kernels.h"

namespace tessera {

void select_top_k(std::span<const float> logits, int64_t k, std::vector<ScoredToken>& out) {
  out.clear();
  const int64_t n = static_cast<int64_t>(logits.size());
  k = std::min(k, n);
  if (k <= 0) return;
  // Tokens are buffered and the buffer is cut back to its k best whenever it fills. After
  // a cut, the k-th best so far is a threshold: a later token (higher id) beats it only with
  // a strictly greater logit, so the scan skips ahead to the next such token.
  const int64_t capacity = std::max<int64_t>(4 * k, 256);
  out.reserve(static_cast<size_t>(capacity));
  auto cut = [&] {
    std::nth_element(out.begin(), out.begin() + (k - 1), out.end(), ranks_before);
    out.resize(static_cast<size_t>(k));
    return out.back().logit;
  };
  const RowKernels& kernels = row_kernels();
  const float* x = logits.data();
  int64_t i = 0;
  for (; i < n && static_cast<int64_t>(out.size()) < capacity; ++i) out.push_back({x[i], static_cast<int32_t>(i)});
  if (i < n) {
    float threshold = cut();
    while (true) {
      i += kernels.find_greater(x + i, n - i, threshold);
      if (i >= n) break;
      out.push_back({x[i], static_cast<int32_t>(i)});
      ++i;
      if (static_cast<int64_t>(out.size()) == capacity) threshold = cut();
    }
  }
  if (static_cast<int64_t>(out.size()) > k) cut();
  std::sort(out.begin(), out.end(), ranks_before);
}

float checked_max_logit(std::span<const float> logits) {
  bool has_nan = false;
  const float max = row_kernels().max(logits.data(), static_cast<int64_t>(logits.size()), &has_nan);
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

int64_t first_index_of_max(std::span<const float> logits, float max) {
  // Nothing exceeds max, so the first logit above the next float below max equals max.
  const float below = std::nextafter(max, -std::numeric_limits<float>::infinity());
  return row_kernels().find_greater(logits.data(), static_cast<int64_t>(logits.size()), below);
}

}  // namespace tessera
