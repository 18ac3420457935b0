#pragma once
// Token-length distributions and arrival processes of a workload, with their JSON form
// (docs/design/bench-harness.md).
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "benchharness/random.h"

namespace tessera::bench {

// A distribution of token counts; draws are rounded to the nearest integer and clamped to
// [min, max].
//   {"dist": "fixed", "value": 128}
//   {"dist": "uniform", "min": 32, "max": 512}                 (integers, inclusive)
//   {"dist": "normal", "mean": 256, "std": 64}
//   {"dist": "lognormal", "median": 128, "sigma": 1.0}         (exp of N(ln median, sigma))
//   {"dist": "empirical", "values": [64, 256], "weights": [3, 1]}
// Every kind takes optional "min" (default 1) and "max" (default 1<<20) clamps; a bare
// number is shorthand for fixed.
struct LengthDist {
  enum class Kind { Fixed, Uniform, Normal, LogNormal, Empirical };
  Kind kind = Kind::Fixed;
  double a = 128, b = 0;           // fixed: value; normal: mean, std; lognormal: median, sigma
  int64_t min = 1, max = 1 << 20;  // clamps (uniform: the range)
  std::vector<int64_t> values;     // empirical
  std::vector<double> weights;     // empirical, same length, positive sum

  int64_t sample(Rng& rng) const;
  double mean_estimate() const;  // analytic mean before clamping (for reports)
  static LengthDist fixed(int64_t v);
  static LengthDist from_json(const nlohmann::json& j, const std::string& what);
  // The command-line form: "128", "uniform:32:512", "normal:256:64", "lognormal:128:1.0",
  // "empirical:64=3,256=1"; an optional ":min:max" clamp follows normal and lognormal
  // ("lognormal:128:1.0:4:2048").
  static LengthDist parse(const std::string& text, const std::string& what);
  nlohmann::json to_json() const;
  std::string describe() const;  // "lognormal(median=128, sigma=1) in [4, 2048]"
};

// When requests arrive, relative to the start of the run, independently of completions.
//   poisson:  exponential gaps of mean 1/rate
//   gamma:    gamma gaps with shape = burstiness and scale = 1/(rate*burstiness), so the mean
//             rate is unchanged; burstiness < 1 is burstier than Poisson, > 1 more regular
//             (vLLM benchmark_serving's --burstiness); burstiness 1 is Poisson
//   constant: gaps of exactly 1/rate
//   trace:    the timestamps of a trace file (see Trace in workload.h)
// rate = infinity sends everything at t = 0.
struct ArrivalProcess {
  enum class Kind { Poisson, Gamma, Constant, Trace };
  Kind kind = Kind::Poisson;
  double rate = 1.0;        // requests per second
  double burstiness = 1.0;  // gamma shape

  // The first n arrival times (seconds, non-decreasing, the first gap drawn like the rest),
  // stopping early once a time would exceed max_time (when max_time > 0).
  std::vector<double> times(size_t n, Rng& rng, double max_time = 0) const;
  static Kind parse_kind(const std::string& name);
  std::string name() const;
};

}  // namespace tessera::bench
