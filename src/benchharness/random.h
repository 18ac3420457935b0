#pragma once
// Random draws for workloads and arrivals, written out here (not <random>'s distributions)
// so the same seed gives the same workload with any standard library.
#include <cstdint>
#include <random>

namespace tessera::bench {

class Rng {
 public:
  explicit Rng(uint64_t seed) : engine_(seed) {}
  double uniform();  // [0, 1), 53 random bits
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  int64_t uniform_int(int64_t lo, int64_t hi);  // inclusive
  double normal();                              // standard normal (Box-Muller)
  double exponential(double rate);              // mean 1/rate, by inversion
  double gamma(double shape, double scale);     // Marsaglia-Tsang
  uint64_t next() { return engine_(); }

 private:
  std::mt19937_64 engine_;
  bool has_spare_ = false;
  double spare_ = 0;
};

}  // namespace tessera::bench
