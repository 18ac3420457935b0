// Draws many tokens with a fixed seed and compares the counts with the exact float64
// distribution by a chi-square test at the 0.999 level. The seed is fixed, so each test is
// deterministic; a sampler that draws from a wrong distribution (an off-by-one in the
// cumulative walk, a wrong temperature, a filter keeping the wrong mass) fails it.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "sample/sampler.h"
#include "unit/sample/reference.h"

using namespace tessera;
using tessera::test::TestRng;

namespace {

void expect_draws_follow_reference(const SamplingParams& p, const std::vector<float>& logits, int64_t n_draws) {
  const test::RefDistribution ref = test::reference_distribution(logits, p);
  ASSERT_FALSE(ref.ambiguous);
  Sampler s(p, static_cast<int32_t>(logits.size()));
  std::map<int32_t, int64_t> counts;
  std::vector<float> row(logits.size());
  for (int64_t i = 0; i < n_draws; ++i) {
    row = logits;  // no bias or penalty: the row would come back unchanged, copy anyway
    ++counts[s.sample(row)];
  }
  for (const auto& [token, count] : counts)
    ASSERT_TRUE(ref.prob.count(token) && ref.prob.at(token) > 0)
        << "token " << token << " drawn " << count << " times but is filtered out";
  const auto [stat, df] = test::chi_square(counts, ref.prob, n_draws);
  ASSERT_GE(df, 3);
  EXPECT_LT(stat, test::chi_square_critical_999(df))
      << "chi-square " << stat << " with " << df << " degrees of freedom";
}

SamplingParams params(uint64_t seed, float temperature) {
  SamplingParams p;
  p.seed = seed;
  p.temperature = temperature;
  return p;
}

}  // namespace

TEST(SamplerDistribution, TemperatureOnly) {
  TestRng rng(1);
  const std::vector<float> logits = rng.logits(64, 2.0);
  expect_draws_follow_reference(params(101, 0.7f), logits, 200000);
  expect_draws_follow_reference(params(102, 1.0f), logits, 200000);
  expect_draws_follow_reference(params(103, 3.0f), logits, 200000);
}

TEST(SamplerDistribution, TopK) {
  TestRng rng(2);
  const std::vector<float> logits = rng.logits(64, 2.0, 0.25);  // with ties
  SamplingParams p = params(201, 0.7f);
  p.top_k = 12;
  expect_draws_follow_reference(p, logits, 200000);
}

TEST(SamplerDistribution, TopP) {
  TestRng rng(3);
  const std::vector<float> logits = rng.logits(64, 2.0);
  SamplingParams p = params(301, 0.7f);
  p.top_p = 0.8f;
  expect_draws_follow_reference(p, logits, 200000);
}

TEST(SamplerDistribution, MinP) {
  TestRng rng(4);
  const std::vector<float> logits = rng.logits(64, 2.0);
  SamplingParams p = params(401, 0.7f);
  p.min_p = 0.05f;
  expect_draws_follow_reference(p, logits, 200000);
}

TEST(SamplerDistribution, AllFiltersOnALargeVocabulary) {
  // Large enough that top-p runs through the bucketed selection and dense draws cross
  // several blocks. Every 30th token is lifted by 6, so about 200 tokens hold most of the
  // mass (bins with enough expected draws) and the long tail holds the rest.
  TestRng rng(5);
  std::vector<float> logits = rng.logits(6000, 1.0);
  for (size_t i = 0; i < logits.size(); i += 30) logits[i] += 6.0f;
  expect_draws_follow_reference(params(501, 1.0f), logits, 12000);
  for (float top_p : {0.5f, 0.95f}) {
    SamplingParams p = params(502, 1.0f);
    // The nearest value whose cut is not within rounding of a cumulative mass step.
    p.top_p = top_p;
    while (test::reference_distribution(logits, p).ambiguous) p.top_p -= 0.001f;
    expect_draws_follow_reference(p, logits, 12000);
  }
  SamplingParams all = params(503, 0.9f);
  all.top_k = 500;
  all.top_p = 0.9f;
  all.min_p = 0.02f;
  expect_draws_follow_reference(all, logits, 12000);
}
