#include "benchharness/stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera::bench {

double percentile_sorted(std::span<const double> a, double q) {
  TESSERA_CHECK(!a.empty(), "percentile of an empty sample");
  TESSERA_CHECK(q >= 0 && q <= 100, "percentile ", q, " is outside [0, 100]");
  const double pos = q / 100.0 * static_cast<double>(a.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, a.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  // numpy's _lerp: a + (b - a) * t, switched to b - (b - a) * (1 - t) for t >= 0.5, which
  // keeps the result exact at t = 1 and bit-identical to numpy.
  const double x = a[lo], y = a[hi], d = y - x;
  return frac >= 0.5 ? y - d * (1.0 - frac) : x + d * frac;
}

double percentile(std::span<const double> values, double q) {
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  return percentile_sorted(v, q);
}

Summary summarize(std::span<const double> values) {
  Summary s;
  if (values.empty()) return s;
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  s.count = v.size();
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / static_cast<double>(v.size());
  double ss = 0;
  for (double x : v) ss += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(ss / static_cast<double>(v.size()));
  s.min = v.front();
  s.max = v.back();
  s.p50 = percentile_sorted(v, 50);
  s.p90 = percentile_sorted(v, 90);
  s.p95 = percentile_sorted(v, 95);
  s.p99 = percentile_sorted(v, 99);
  return s;
}

std::vector<CdfPoint> empirical_cdf(std::span<const double> values, size_t max_points) {
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  std::vector<CdfPoint> out;
  if (v.empty() || max_points == 0) return out;
  const size_t n = v.size();
  const size_t step = std::max<size_t>(1, (n + max_points - 1) / max_points);
  for (size_t i = 0; i < n; i += step) out.push_back({v[i], static_cast<double>(i + 1) / n});
  if (out.back().fraction < 1.0) out.push_back({v.back(), 1.0});
  return out;
}

}  // namespace tessera::bench
