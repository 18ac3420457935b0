// Arrival processes and length distributions: Kolmogorov-Smirnov tests of the inter-arrival
// times against the exponential and gamma CDFs (boost::math as the reference), moments, and
// the length distributions' draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <boost/math/special_functions/gamma.hpp>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "benchharness/distributions.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

std::vector<double> gaps_of(const std::vector<double>& times) {
  std::vector<double> g;
  double prev = 0;
  for (double t : times) g.push_back(t - prev), prev = t;
  return g;
}

// Two-sided one-sample KS statistic D = sup |F_n(x) - F(x)|.
template <typename Cdf>
double ks_statistic(std::vector<double> x, Cdf cdf) {
  std::sort(x.begin(), x.end());
  const double n = static_cast<double>(x.size());
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double f = cdf(x[i]);
    d = std::max({d, f - i / n, (i + 1) / n - f});
  }
  return d;
}

// Critical value at significance 0.01 for large n (Smirnov's asymptotic 1.628 / sqrt(n)).
double ks_critical_1pct(size_t n) { return 1.628 / std::sqrt(static_cast<double>(n)); }

struct Moments {
  double mean = 0, var = 0;
};
Moments moments(const std::vector<double>& v) {
  Moments m;
  for (double x : v) m.mean += x;
  m.mean /= v.size();
  for (double x : v) m.var += (x - m.mean) * (x - m.mean);
  m.var /= (v.size() - 1);
  return m;
}

TEST(BenchArrivals, PoissonGapsPassKsAgainstExponential) {
  const double rate = 4.0;
  ArrivalProcess p;
  p.kind = ArrivalProcess::Kind::Poisson;
  p.rate = rate;
  Rng rng(12345);
  const auto gaps = gaps_of(p.times(5000, rng));
  ASSERT_EQ(gaps.size(), 5000u);
  const double d = ks_statistic(gaps, [&](double x) { return 1.0 - std::exp(-rate * x); });
  EXPECT_LT(d, ks_critical_1pct(gaps.size())) << "D = " << d;
  // The test has power: the same gaps are far from an exponential of twice the rate.
  const double d_wrong = ks_statistic(gaps, [&](double x) { return 1.0 - std::exp(-2 * rate * x); });
  EXPECT_GT(d_wrong, 5 * ks_critical_1pct(gaps.size()));
  const Moments m = moments(gaps);
  // Exponential: mean 1/rate, variance 1/rate^2; 5000 draws -> standard errors ~1.4% and ~3%.
  EXPECT_NEAR(m.mean, 1 / rate, 0.05 / rate);
  EXPECT_NEAR(m.var, 1 / (rate * rate), 0.12 / (rate * rate));
}

TEST(BenchArrivals, GammaGapsPassKsAndKeepTheRate) {
  for (const double burstiness : {0.25, 1.0, 4.0}) {
    const double rate = 10.0;
    ArrivalProcess p;
    p.kind = ArrivalProcess::Kind::Gamma;
    p.rate = rate;
    p.burstiness = burstiness;
    Rng rng(777);
    const auto gaps = gaps_of(p.times(5000, rng));
    const double shape = burstiness, scale = 1.0 / (rate * burstiness);
    const double d = ks_statistic(gaps, [&](double x) { return boost::math::gamma_p(shape, x / scale); });
    EXPECT_LT(d, ks_critical_1pct(gaps.size())) << "burstiness " << burstiness << " D = " << d;
    const Moments m = moments(gaps);
    // Gamma(k, theta): mean k*theta = 1/rate, variance k*theta^2 = 1/(rate^2 * burstiness).
    EXPECT_NEAR(m.mean, 1 / rate, 0.08 / rate) << burstiness;
    const double var = 1.0 / (rate * rate * burstiness);
    EXPECT_NEAR(m.var, var, 0.25 * var) << burstiness;
  }
}

TEST(BenchArrivals, ConstantInfiniteAndDurationLimit) {
  Rng rng(1);
  ArrivalProcess c;
  c.kind = ArrivalProcess::Kind::Constant;
  c.rate = 2.0;
  const auto t = c.times(4, rng);
  ASSERT_EQ(t.size(), 4u);
  EXPECT_DOUBLE_EQ(t[0], 0.5);
  EXPECT_DOUBLE_EQ(t[3], 2.0);
  // A duration limit stops the schedule: arrivals at 0.5 .. 3.0 -> 6 of them.
  EXPECT_EQ(c.times(100, rng, 3.0).size(), 6u);
  ArrivalProcess inf;
  inf.rate = std::numeric_limits<double>::infinity();
  for (double x : inf.times(10, rng)) EXPECT_EQ(x, 0.0);
  ArrivalProcess bad;
  bad.rate = 0;
  EXPECT_THROW(bad.times(3, rng), Error);
  EXPECT_THROW(ArrivalProcess::parse_kind("uniform"), Error);
}

TEST(BenchArrivals, SameSeedSameSchedule) {
  ArrivalProcess p;
  p.rate = 3;
  Rng a(99), b(99), c(100);
  const auto ta = p.times(50, a), tb = p.times(50, b), tc = p.times(50, c);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(BenchLengths, DistributionsDrawWhatTheySay) {
  Rng rng(2026);
  const int n = 20000;
  auto draw_all = [&](const LengthDist& d) {
    std::vector<double> v;
    for (int i = 0; i < n; ++i) v.push_back(static_cast<double>(d.sample(rng)));
    return v;
  };
  {
    const auto d = LengthDist::from_json(nlohmann::json{{"dist", "uniform"}, {"min", 10}, {"max", 20}}, "t");
    const auto v = draw_all(d);
    EXPECT_EQ(*std::min_element(v.begin(), v.end()), 10);
    EXPECT_EQ(*std::max_element(v.begin(), v.end()), 20);
    EXPECT_NEAR(moments(v).mean, 15, 0.1);
  }
  {
    const auto d = LengthDist::from_json(nlohmann::json{{"dist", "normal"}, {"mean", 300}, {"std", 40}}, "t");
    const Moments m = moments(draw_all(d));
    EXPECT_NEAR(m.mean, 300, 1.5);
    EXPECT_NEAR(std::sqrt(m.var), 40, 1.5);
  }
  {
    // Lognormal(median 100, sigma 0.5): mean 100 * e^0.125 = 113.3; the median of draws ~100.
    const auto d = LengthDist::from_json(nlohmann::json{{"dist", "lognormal"}, {"median", 100}, {"sigma", 0.5}}, "t");
    auto v = draw_all(d);
    EXPECT_NEAR(moments(v).mean, 100 * std::exp(0.125), 1.5);
    EXPECT_NEAR(d.mean_estimate(), 100 * std::exp(0.125), 1e-9);
    std::nth_element(v.begin(), v.begin() + n / 2, v.end());
    EXPECT_NEAR(v[n / 2], 100, 2);
  }
  {
    const auto d = LengthDist::from_json(
        nlohmann::json{{"dist", "empirical"}, {"values", {16, 64, 256}}, {"weights", {1, 2, 1}}}, "t");
    std::map<int64_t, int> counts;
    for (int i = 0; i < n; ++i) ++counts[d.sample(rng)];
    ASSERT_EQ(counts.size(), 3u);
    EXPECT_NEAR(counts[64] / double(n), 0.5, 0.02);
    EXPECT_NEAR(counts[16] / double(n), 0.25, 0.02);
  }
  {
    // Clamps apply: a normal far below min always gives min.
    const auto d =
        LengthDist::from_json(nlohmann::json{{"dist", "normal"}, {"mean", -50}, {"std", 1}, {"min", 3}}, "t");
    for (int i = 0; i < 100; ++i) EXPECT_EQ(d.sample(rng), 3);
  }
  EXPECT_EQ(LengthDist::from_json(nlohmann::json(77), "t").sample(rng), 77);
}

TEST(BenchLengths, BadSpecsAreRejectedWithTheField) {
  auto msg = [](const nlohmann::json& j) {
    try {
      LengthDist::from_json(j, "workload.input");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg({{"dist", "poisson"}}).find("unknown dist 'poisson'"), std::string::npos);
  EXPECT_NE(msg({{"dist", "normal"}, {"mean", 3}}).find("missing \"std\""), std::string::npos);
  EXPECT_NE(msg({{"dist", "uniform"}, {"min", 5}}).find("uniform needs"), std::string::npos);
  EXPECT_NE(msg({{"dist", "empirical"}, {"values", {1, 2}}, {"weights", {1}}}).find("weights"), std::string::npos);
  EXPECT_NE(msg({{"dist", "fixed"}, {"value", 3}, {"min", 9}, {"max", 2}}).find("min <= max"), std::string::npos);
  EXPECT_NE(msg(nlohmann::json(0)).find("at least 1"), std::string::npos);
}

}  // namespace
}  // namespace tessera::bench

namespace tessera::bench {
namespace {

TEST(BenchLengths, CommandLineForm) {
  EXPECT_EQ(LengthDist::parse("128", "--input-len").kind, LengthDist::Kind::Fixed);
  EXPECT_EQ(LengthDist::parse("128", "--input-len").a, 128);
  const auto u = LengthDist::parse("uniform:32:512", "--input-len");
  EXPECT_EQ(u.kind, LengthDist::Kind::Uniform);
  EXPECT_EQ(u.min, 32);
  EXPECT_EQ(u.max, 512);
  const auto l = LengthDist::parse("lognormal:128:1.0:4:2048", "--input-len");
  EXPECT_EQ(l.kind, LengthDist::Kind::LogNormal);
  EXPECT_EQ(l.a, 128);
  EXPECT_EQ(l.b, 1.0);
  EXPECT_EQ(l.min, 4);
  EXPECT_EQ(l.max, 2048);
  const auto e = LengthDist::parse("empirical:64=3,256=1,1024", "--output-len");
  EXPECT_EQ(e.values, (std::vector<int64_t>{64, 256, 1024}));
  EXPECT_EQ(e.weights, (std::vector<double>{3, 1, 1}));
  EXPECT_THROW(LengthDist::parse("normal:5", "--input-len"), Error);
  EXPECT_THROW(LengthDist::parse("abc", "--input-len"), Error);
  EXPECT_THROW(LengthDist::parse("empirical:x=1", "--input-len"), Error);
}

}  // namespace
}  // namespace tessera::bench
