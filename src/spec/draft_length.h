#pragma once
// A sequence's running acceptance: an exponentially weighted per-token acceptance rate a
// (prior kPrior, weight kWeight per verified step). The adaptive draft lengths
// (spec/step_cost.h) weigh a draft token j as kept with probability a^j.
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tessera {

class DraftLength {
 public:
  static constexpr double kPrior = 0.8;
  static constexpr double kWeight = 0.3;
  static constexpr double kRecovery = 0.05;  // per idle step

  // After a verification of n_draft > 0 tokens of which the first n_accepted were kept. A
  // token is tried only when all before it were kept, so the step tried n_accepted + 1 tokens
  // (n_accepted when all were kept): its estimate of the per-token rate is kept / tried.
  void observe(int n_draft, int n_accepted) {
    if (n_draft <= 0) return;
    const int tried = n_accepted + (n_accepted < n_draft ? 1 : 0);
    rate_ = (1.0 - kWeight) * rate_ + kWeight * static_cast<double>(n_accepted) / tried;
  }
  // A step in which the sequence could have speculated but its plan gave it no draft: the
  // estimate drifts back toward the prior, so a sequence whose text turned predictable is
  // tried again (otherwise a rate near 0 would never be re-measured).
  void idle() { rate_ += kRecovery * (kPrior - rate_); }
  double rate() const { return rate_; }

 private:
  double rate_ = kPrior;
};

}  // namespace tessera
