// The measured cost of a step per row count, and the draft lengths it implies: checked against
// brute force over every assignment of draft lengths on small cases, and on the cost shapes
// of the two regimes (a flat, bandwidth-bound curve where speculation pays, a linear,
// compute-bound one where it never does).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "core/error.h"
#include "spec/step_cost.h"

namespace tessera {
namespace {

// Every row count up to 64, then every 5 % more (fewer observations than kMaxAge, so none is
// stale when the plan reads the curve).
StepCostModel curve(const std::function<double(int)>& f, int max_rows) {
  StepCostModel m;
  for (int r = 1; r <= max_rows; r = r < 64 ? r + 1 : static_cast<int>(r * 1.05)) m.observe(r, f(r));
  m.observe(max_rows, f(max_rows));
  return m;
}

TEST(StepCostModel, InterpolatesBetweenObservationsAndIsPessimisticPastThem) {
  StepCostModel m;
  EXPECT_TRUE(m.empty());
  EXPECT_EQ(m.seconds(5), 0.0);
  m.observe(2, 1.0);
  m.observe(10, 3.0);
  EXPECT_TRUE(m.observed(2));
  EXPECT_FALSE(m.observed(3));
  EXPECT_DOUBLE_EQ(m.seconds(1), 1.0);   // below: the smallest observation
  EXPECT_DOUBLE_EQ(m.seconds(6), 2.0);   // between: linear in rows
  EXPECT_DOUBLE_EQ(m.seconds(20), 6.0);  // past: proportional to rows
  // A bucket's time is the median of its latest observations: one outlier does not move it.
  m.observe(10, 7.0);
  EXPECT_DOUBLE_EQ(m.seconds(10), 5.0);  // two observations: their mean
  m.observe(10, 3.0);
  EXPECT_DOUBLE_EQ(m.seconds(10), 3.0);
  for (int i = 0; i < StepCostModel::kWindow; ++i) m.observe(10, 4.0);  // the old ones leave the window
  EXPECT_DOUBLE_EQ(m.seconds(10), 4.0);
  // Past 32 rows, buckets a quarter octave wide: 100 and 104 share one.
  m.observe(100, 5.0);
  EXPECT_TRUE(m.observed(104));
  EXPECT_FALSE(m.observed(200));
  EXPECT_THROW(m.observe(0, 1.0), Error);
  EXPECT_THROW(m.observe(3, -1.0), Error);
  EXPECT_THROW(m.observe(3, NAN), Error);
}

// More rows never cost less: a dear outlier at one row count (a first step that captured a
// graph) is pooled with the cheaper, better-measured buckets above it instead of making the
// plan avoid that row count for good.
TEST(StepCostModel, FitIsNonDecreasingAndPoolsOutliers) {
  StepCostModel m;
  m.observe(8, 7.3e-3);
  for (int i = 0; i < 4; ++i) m.observe(8, 7.3e-3);
  m.observe(12, 40e-3);  // one slow first step at 12 rows
  for (int i = 0; i < 4; ++i) m.observe(16, 8.7e-3);
  for (int i = 0; i < 4; ++i) m.observe(38, 8.7e-3);  // 38: a bucket's representative row count
  // 12 and 16 pooled ((40 + 4 · 8.7) / 5 = 14.96 ms), which is above 38 rows' 8.7 ms, so all
  // three are: (40 + 8 · 8.7) / 9 = 12.18 ms — no longer a 40 ms step at 12 rows.
  const double pooled = (40e-3 + 8 * 8.7e-3) / 9;
  EXPECT_NEAR(m.seconds(12), pooled, 1e-12);
  EXPECT_NEAR(m.seconds(38), pooled, 1e-12);
  EXPECT_LE(m.seconds(12), m.seconds(16));
  EXPECT_LE(m.seconds(16), m.seconds(38));
  for (int r = 1; r < 64; ++r) EXPECT_LE(m.seconds(r), m.seconds(r + 1)) << r;
  // More observations at 12 rows replace the outlier (median of the window).
  for (int i = 0; i < 3; ++i) m.observe(12, 8.6e-3);
  EXPECT_NEAR(m.seconds(12), 8.6e-3, 1e-12);
  EXPECT_NEAR(m.seconds(16), 8.7e-3, 1e-12);
}

// An old slow measurement at a row count the plan then avoids does not stay: after kMaxAge
// observations elsewhere the bucket is read off its neighbours again.
TEST(StepCostModel, StaleBucketsGiveWayToTheirNeighbours) {
  StepCostModel m;
  m.observe(8, 40e-3);                                // one slow step at 8 rows
  for (int i = 0; i < 5; ++i) m.observe(256, 20e-3);  // 256: a bucket's representative row count
  for (int64_t i = 0; i < StepCostModel::kMaxAge - 6; ++i) m.observe(4, 11e-3);
  EXPECT_NEAR(m.seconds(8), (40e-3 + 5 * 20e-3) / 6, 1e-12);  // still counted: pooled with 256 rows
  for (int i = 0; i < 10; ++i) m.observe(4, 11e-3);
  // 256's observations are stale too now: the curve is 4 rows' alone, proportional past it.
  EXPECT_NEAR(m.seconds(8), 22e-3, 1e-12);
  m.observe(256, 20e-3);  // a fresh observation above: interpolation between 4 and 256
  EXPECT_NEAR(m.seconds(8), 11e-3 + (20e-3 - 11e-3) * 4.0 / 252.0, 1e-12);
}

// Expected tokens per second of an assignment, as the plan defines it.
double rate_of(const StepCostModel& m, int base, double draft_s, const std::vector<DraftCandidate>& c,
               const std::vector<int>& k) {
  double tokens = base;
  int rows = base, max_k = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    for (int j = 1; j <= k[i]; ++j) tokens += std::pow(c[i].acceptance, j);
    rows += k[i];
    max_k = std::max(max_k, k[i]);
  }
  return tokens / (m.seconds(rows) + draft_s * max_k);
}

TEST(PlanDraftLengths, MatchesBruteForceOverEveryAssignment) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 200; ++trial) {
    // A cost with a flat part, a slope and a step (a kernel change at some row count).
    const double flat = 1 + 4 * u(rng), slope = 0.5 * u(rng), jump = u(rng) < 0.5 ? 0.0 : u(rng);
    const int at = 2 + static_cast<int>(8 * u(rng));
    const StepCostModel m = curve([&](int r) { return flat + slope * r + (r >= at ? jump : 0.0); }, 64);
    const int n = 1 + static_cast<int>(3 * u(rng));
    std::vector<DraftCandidate> c(n);
    for (auto& x : c) x = {u(rng), 1 + static_cast<int>(3 * u(rng))};
    const double draft_s = u(rng) < 0.5 ? 0.0 : 0.2 * u(rng);
    std::vector<int> k(n);
    plan_draft_lengths(m, n, n, draft_s, c, k);
    // Brute force over every assignment.
    double best = 0;
    std::vector<int> cur(n, 0);
    std::function<void(int)> walk = [&](int i) {
      if (i == n) {
        best = std::max(best, rate_of(m, n, draft_s, c, cur));
        return;
      }
      for (cur[i] = 0; cur[i] <= c[i].k_max; ++cur[i]) walk(i + 1);
    };
    walk(0);
    for (int i = 0; i < n; ++i) ASSERT_LE(k[i], c[i].k_max);
    // The plan takes each total's most likely tokens, which is optimal per total when the
    // drafter cost is per position (max k) only up to ties; allow a hair.
    EXPECT_GE(rate_of(m, n, draft_s, c, k), best * (1 - 1e-9) - (draft_s > 0 ? best * 0.05 : 0.0)) << "trial " << trial;
    if (draft_s == 0) {
      EXPECT_NEAR(rate_of(m, n, draft_s, c, k), best, best * 1e-9) << "trial " << trial;
    }
  }
}

TEST(PlanDraftLengths, SpeculatesWhereRowsAreCheapAndTurnsOffWhereTheyAreNot) {
  const int kmax = 8;
  // Bandwidth-bound: a row costs 0.5% of a step up to 256 rows, then compute-bound.
  const StepCostModel gpu = curve([](int r) { return r <= 256 ? 10.0 + 0.05 * r : 22.8 * r / 256.0; }, 4096);
  auto plan = [&](const StepCostModel& m, int batch, double a) {
    std::vector<DraftCandidate> c(batch, DraftCandidate{a, kmax});
    std::vector<int> k(batch);
    plan_draft_lengths(m, batch, batch, 0.0, c, k);
    int total = 0;
    for (int x : k) total += x;
    return total;
  };
  EXPECT_EQ(plan(gpu, 1, 0.9), kmax);  // batch 1, high acceptance: every draft token
  EXPECT_GT(plan(gpu, 1, 0.5), 0);
  EXPECT_EQ(plan(gpu, 1024, 0.9), 0);  // a large batch is compute-bound already: off
  // Compute-bound everywhere (cost proportional to rows): a draft never pays.
  const StepCostModel cpu = curve([](int r) { return 1.0 * r; }, 64);
  EXPECT_EQ(plan(cpu, 1, 0.95), 0);
  EXPECT_EQ(plan(cpu, 8, 0.95), 0);
  // Nothing measured yet: no drafts.
  EXPECT_EQ(plan(StepCostModel{}, 1, 0.9), 0);
  // Mixed acceptance: the more predictable sequence gets the longer draft.
  const StepCostModel mid = curve([](int r) { return 10.0 + 1.0 * r; }, 64);
  std::vector<DraftCandidate> c{{0.95, kmax}, {0.3, kmax}};
  std::vector<int> k(2);
  plan_draft_lengths(mid, 2, 2, 0.0, c, k);
  EXPECT_GT(k[0], k[1]);
  EXPECT_GT(k[0], 0);
  std::vector<int> wrong(1);
  EXPECT_THROW(plan_draft_lengths(mid, 2, 2, 0.0, c, wrong), Error);
}

}  // namespace
}  // namespace tessera
