#pragma once
// How many draft tokens a sequence verifies next (adaptive k). Verifying a token that is
// then rejected costs a query row (and, on a busy device, time); proposing too few wastes
// acceptances. Each sequence keeps an exponentially weighted per-token acceptance rate a
// (prior kPrior, weight kWeight per verified step) and proposes
//     k = clamp(ceil(a / (1 - a)), 1, k_max),
// the expected run of consecutive acceptances of a geometric model with rate a: a = 0.5
// gives 1, 0.8 gives 4, 0.9 gives 9. A heuristic, not a measured optimum: the cost side is
// the device's (docs/benchmarks/spec-decode.md).
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tessera {

class DraftLength {
 public:
  static constexpr double kPrior = 0.8;
  static constexpr double kWeight = 0.3;

  // The draft length to ask for, in [1, k_max] (k_max without adaptation).
  int next(int k_max, bool adaptive) const {
    if (!adaptive) return k_max;
    const double a = std::min(rate_, 0.999);
    const double run = std::ceil(a / (1.0 - a));
    return static_cast<int>(std::clamp(run, 1.0, static_cast<double>(k_max)));
  }
  // After a verification of n_draft > 0 tokens of which n_accepted were kept.
  void observe(int n_draft, int n_accepted) {
    if (n_draft <= 0) return;
    rate_ = (1.0 - kWeight) * rate_ + kWeight * static_cast<double>(n_accepted) / n_draft;
  }
  double rate() const { return rate_; }

 private:
  double rate_ = kPrior;
};

}  // namespace tessera
