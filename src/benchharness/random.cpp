#include "benchharness/random.h"

#include <cmath>

#include "core/error.h"

namespace tessera::bench {

double Rng::uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

int64_t Rng::uniform_int(int64_t lo, int64_t hi) {
  TESSERA_CHECK(lo <= hi, "uniform_int: empty range [", lo, ", ", hi, "]");
  const uint64_t span = static_cast<uint64_t>(hi - lo) + 1;
  if (span == 0) return static_cast<int64_t>(engine_());
  // Rejection keeps every value equally likely.
  const uint64_t limit = UINT64_MAX - UINT64_MAX % span;
  uint64_t r;
  do r = engine_();
  while (r >= limit);
  return lo + static_cast<int64_t>(r % span);
}

double Rng::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1;
  do u1 = uniform();
  while (u1 <= 0.0);
  const double u2 = uniform();
  const double r = std::sqrt(-2.0 * std::log(u1));
  spare_ = r * std::sin(2.0 * M_PI * u2);
  has_spare_ = true;
  return r * std::cos(2.0 * M_PI * u2);
}

double Rng::exponential(double rate) {
  TESSERA_CHECK(rate > 0, "exponential rate ", rate, " must be positive");
  return -std::log1p(-uniform()) / rate;
}

double Rng::gamma(double shape, double scale) {
  TESSERA_CHECK(shape > 0 && scale > 0, "gamma shape ", shape, " and scale ", scale, " must be positive");
  if (shape < 1.0) {
    // Boost to shape + 1 and scale back: X * U^(1/shape) (Marsaglia-Tsang, section 8).
    double u;
    do u = uniform();
    while (u <= 0.0);
    return gamma(shape + 1.0, scale) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0, c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x, v;
    do {
      x = normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = uniform();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v * scale;
    if (u > 0.0 && std::log(u) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v * scale;
  }
}

}  // namespace tessera::bench
