#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "core/error.h"
#include "sample/select.h"
#include "unit/sample/reference.h"

using namespace tessera;
using tessera::test::TestRng;

namespace {
constexpr float kInf = std::numeric_limits<float>::infinity();
}

TEST(SelectTopK, MatchesAFullSortIncludingTies) {
  TestRng rng(11);
  std::vector<ScoredToken> got;
  for (int trial = 0; trial < 150; ++trial) {
    const int64_t n = 1 + rng.below(trial < 140 ? 3000 : 70000);
    // Coarse grids give many ties; some rows are sorted ascending, the worst case for the
    // threshold scan (every token beats the current bar).
    std::vector<float> logits = rng.logits(n, 3.0, trial % 3 == 0 ? 0.5 : 0.0);
    if (trial % 7 == 0) std::sort(logits.begin(), logits.end());
    if (trial % 11 == 0)
      for (int64_t i = 0; i < n; i += 3) logits[i] = -kInf;
    const std::vector<int32_t> order = test::candidate_order(logits);
    const int64_t ks[] = {0, 1, 2, 40, n / 2, n - 1, n, n + 10};
    for (int64_t k : ks) {
      select_top_k(logits, k, got);
      const int64_t want_n = std::max<int64_t>(0, std::min(k, n));
      ASSERT_EQ(static_cast<int64_t>(got.size()), want_n) << "n=" << n << " k=" << k;
      for (int64_t r = 0; r < want_n; ++r) {
        ASSERT_EQ(got[r].id, order[r]) << "n=" << n << " k=" << k << " rank " << r;
        ASSERT_EQ(got[r].logit, logits[order[r]]);
      }
    }
  }
}

TEST(SelectTopK, AllEqualLogitsKeepTheLowestIds) {
  std::vector<float> logits(50000, 1.25f);
  std::vector<ScoredToken> got;
  select_top_k(logits, 1000, got);
  ASSERT_EQ(got.size(), 1000u);
  for (int32_t i = 0; i < 1000; ++i) EXPECT_EQ(got[i].id, i);
}

TEST(CheckedMaxLogit, RejectsNaNPlusInfAndAllMinusInf) {
  std::vector<float> row = {0.5f, 3.0f, -kInf, 2.0f};
  EXPECT_EQ(checked_max_logit(row), 3.0f);
  row[2] = std::numeric_limits<float>::quiet_NaN();
  try {
    checked_max_logit(row);
    ADD_FAILURE() << "NaN accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 2 is NaN"), std::string::npos) << e.what();
  }
  row[2] = kInf;
  EXPECT_THROW(checked_max_logit(row), Error);
  std::vector<float> dead(10, -kInf);
  EXPECT_THROW(checked_max_logit(dead), Error);
  EXPECT_THROW(checked_max_logit(std::vector<float>{}), Error);
}
