// Statistics against numpy (tests/fixtures/bench/stats_numpy.json, from
// tools/fixtures/make_bench_stats_fixtures.py).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "benchharness/stats.h"
#include "core/error.h"

namespace tessera::bench {
namespace {

nlohmann::json load_fixture() {
  std::ifstream in(std::string(TESSERA_FIXTURES_DIR) + "/bench/stats_numpy.json");
  EXPECT_TRUE(in.good());
  return nlohmann::json::parse(in);
}

TEST(BenchStats, PercentilesMatchNumpyLinear) {
  const auto fx = load_fixture();
  const auto qs = fx["q"].get<std::vector<double>>();
  int checked = 0;
  for (const auto& [name, s] : fx["samples"].items()) {
    const auto values = s["values"].get<std::vector<double>>();
    const auto expected = s["percentiles"].get<std::vector<double>>();
    for (size_t i = 0; i < qs.size(); ++i) {
      const double got = percentile(values, qs[i]);
      EXPECT_NEAR(got, expected[i], 1e-12 * std::max(1.0, std::fabs(expected[i]))) << name << " q=" << qs[i];
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6 * 14);
}

TEST(BenchStats, SummaryMatchesNumpy) {
  const auto fx = load_fixture();
  const auto qs = fx["q"].get<std::vector<double>>();
  auto at_q = [&](const nlohmann::json& s, double q) {
    for (size_t i = 0; i < qs.size(); ++i)
      if (qs[i] == q) return s["percentiles"][i].get<double>();
    ADD_FAILURE() << "q " << q << " not in fixture";
    return 0.0;
  };
  for (const auto& [name, s] : fx["samples"].items()) {
    const auto values = s["values"].get<std::vector<double>>();
    const Summary sum = summarize(values);
    EXPECT_EQ(sum.count, values.size());
    const double tol = 1e-12 * std::max(1.0, std::fabs(s["max"].get<double>()));
    EXPECT_NEAR(sum.mean, s["mean"].get<double>(), tol) << name;
    EXPECT_NEAR(sum.std, s["std"].get<double>(), tol) << name;
    EXPECT_EQ(sum.min, s["min"].get<double>()) << name;
    EXPECT_EQ(sum.max, s["max"].get<double>()) << name;
    EXPECT_NEAR(sum.p50, at_q(s, 50), tol) << name;
    EXPECT_NEAR(sum.p90, at_q(s, 90), tol) << name;
    EXPECT_NEAR(sum.p95, at_q(s, 95), tol) << name;
    EXPECT_NEAR(sum.p99, at_q(s, 99), tol) << name;
  }
}

TEST(BenchStats, HandWorkedPercentile) {
  // [1, 2, 3, 4]: P90 at position 0.9 * 3 = 2.7 -> 3 + 0.7 * (4 - 3) = 3.7.
  const std::vector<double> v = {4, 1, 3, 2};
  EXPECT_DOUBLE_EQ(percentile(v, 90), 3.7);
  EXPECT_DOUBLE_EQ(percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 4);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.5);
}

TEST(BenchStats, EmptyAndBadInputs) {
  EXPECT_EQ(summarize(std::vector<double>{}).count, 0u);
  EXPECT_THROW(percentile(std::vector<double>{}, 50), Error);
  EXPECT_THROW(percentile(std::vector<double>{1.0}, 101), Error);
  EXPECT_THROW(percentile(std::vector<double>{1.0}, -1), Error);
}

TEST(BenchStats, EmpiricalCdfIsMonotoneAndEndsAtOne) {
  std::vector<double> v;
  for (int i = 0; i < 1000; ++i) v.push_back((i * 7919) % 1000);
  const auto cdf = empirical_cdf(v, 50);
  ASSERT_GE(cdf.size(), 2u);
  EXPECT_LE(cdf.size(), 51u);
  for (size_t i = 1; i < cdf.size(); ++i) {
    EXPECT_GE(cdf[i].value, cdf[i - 1].value);
    EXPECT_GT(cdf[i].fraction, cdf[i - 1].fraction);
  }
  EXPECT_DOUBLE_EQ(cdf.back().fraction, 1.0);
  EXPECT_DOUBLE_EQ(cdf.back().value, 999);
  EXPECT_DOUBLE_EQ(cdf.front().value, 0);
}

}  // namespace
}  // namespace tessera::bench
