#pragma once
// Summary statistics of latency samples. Percentiles are numpy's default
// (method="linear"): for sorted values a[0..n-1] and q in [0, 100], position
// p = q/100 * (n-1) and the result is a[floor(p)] + (a[ceil(p)] - a[floor(p)]) * (p - floor(p)).
#include <cstddef>
#include <span>
#include <vector>

namespace tessera::bench {

// numpy.percentile(values, q) for already sorted values; throws on an empty input or q
// outside [0, 100].
double percentile_sorted(std::span<const double> sorted, double q);
// Same on unsorted values (sorts a copy).
double percentile(std::span<const double> values, double q);

struct Summary {
  size_t count = 0;
  double mean = 0, std = 0;  // std: population (numpy's default ddof=0)
  double min = 0, p50 = 0, p90 = 0, p95 = 0, p99 = 0, max = 0;
};

// All zero with count 0 for an empty input.
Summary summarize(std::span<const double> values);

// Points of the empirical CDF, at most max_points of them (evenly spaced in rank), for plots:
// (value, fraction of samples <= value).
struct CdfPoint {
  double value, fraction;
};
std::vector<CdfPoint> empirical_cdf(std::span<const double> values, size_t max_points = 200);

}  // namespace tessera::bench
