// Exact speculative verification against its definition: over random target and draft
// distributions, the emitted tokens must be distributed as the target's own sampling, and
// the same statistical test must reject rules that are subtly wrong.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "spec/verify.h"

using namespace tessera;

namespace {

// Upper 0.1% points of the chi-square distribution (significance 0.001), by degrees of
// freedom. The tests are seeded, so each outcome is fixed; the significance says how
// unlikely a pass of the correct rule would be to turn into a failure under another seed.
double chi_square_critical_0001(int df) {
  static constexpr std::array<double, 36> kTable = {
      0,      10.828, 13.816, 16.266, 18.467, 20.515, 22.458, 24.322, 26.124, 27.877, 29.588, 31.264,
      32.909, 34.528, 36.123, 37.697, 39.252, 40.790, 42.312, 43.820, 45.315, 46.797, 48.268, 49.728,
      51.179, 52.620, 54.052, 55.476, 56.892, 58.301, 59.703, 61.098, 62.487, 63.870, 65.247, 66.619};
  EXPECT_TRUE(df >= 1 && df < static_cast<int>(kTable.size()));
  return kTable[static_cast<size_t>(df)];
}

double uniform01(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// A random distribution over `vocab` tokens with some exact zeros (as top-k/top-p leave).
SparseDistribution random_distribution(std::mt19937_64& rng, int vocab, int n_zero) {
  std::vector<double> w(static_cast<size_t>(vocab));
  for (double& x : w) x = 0.05 + uniform01(rng);
  for (int i = 0; i < n_zero; ++i) w[rng() % static_cast<uint64_t>(vocab)] = 0;
  double total = 0;
  for (double x : w) total += x;
  if (total == 0) w[0] = total = 1;
  SparseDistribution d;
  for (int t = 0; t < vocab; ++t)
    if (w[static_cast<size_t>(t)] > 0) d.push_back({t, w[static_cast<size_t>(t)] / total});
  return d;
}

int32_t draw(std::span<const TokenProb> d, double u) {
  double cum = 0;
  for (const TokenProb& t : d)
    if ((cum += t.prob) > u) return t.token;
  return d.back().token;
}

// Pearson's statistic of observed counts against expected probabilities; a count where the
// probability is 0 makes it infinite. Degrees of freedom: cells of positive probability - 1.
struct ChiSquare {
  double stat = 0;
  int df = 0;
};
ChiSquare chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t n) {
  ChiSquare c;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0) {
      if (counts[i] > 0) c.stat = INFINITY;
      continue;
    }
    const double expected = probs[i] * static_cast<double>(n);
    c.stat += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++c.df;
  }
  --c.df;
  return c;
}

// A verification rule for one position: (p, x, q, rng) -> {accepted, token}.
using Rule =
    std::function<PositionVerdict(std::span<const TokenProb>, int32_t, std::span<const TokenProb>, std::mt19937_64&)>;

PositionVerdict exact_rule(std::span<const TokenProb> p, int32_t x, std::span<const TokenProb> q,
                           std::mt19937_64& rng) {
  return verify_position(p, x, q, [&] { return uniform01(rng); });
}

// "Accept when the draft is the target's top-1, else sample the target": what a greedy-only
// implementation generalizes to. Wrong for sampling.
PositionVerdict argmax_rule(std::span<const TokenProb> p, int32_t x, std::span<const TokenProb>, std::mt19937_64& rng) {
  const TokenProb* best = &p[0];
  for (const TokenProb& t : p)
    if (t.prob > best->prob) best = &t;
  if (x == best->token) return {true, x};
  return {false, draw(p, uniform01(rng))};
}

// The classic bug: the right acceptance test, but resampling from p instead of the residual.
PositionVerdict resample_from_p_rule(std::span<const TokenProb> p, int32_t x, std::span<const TokenProb> q,
                                     std::mt19937_64& rng) {
  const double q_x = q.empty() ? 1.0 : probability_of(q, x);
  if (uniform01(rng) * q_x < probability_of(p, x)) return {true, x};
  return {false, draw(p, uniform01(rng))};
}

constexpr int kVocab = 6;
constexpr int64_t kTrials = 1000000;

// The first emitted token over kTrials: draft x ~ q (or the fixed point-mass token), then
// one verification. Returns the chi-square of its distribution against p.
ChiSquare first_token_test(const Rule& rule, bool point_mass, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const SparseDistribution p = random_distribution(rng, kVocab, 1);
  const SparseDistribution q = random_distribution(rng, kVocab, 0);  // no zero: x can be any token
  const int32_t fixed = p.back().token;                              // a deterministic drafter's proposal
  std::vector<int64_t> counts(kVocab, 0);
  for (int64_t i = 0; i < kTrials; ++i) {
    const int32_t x = point_mass ? fixed : draw(q, uniform01(rng));
    const PositionVerdict v =
        rule(p, x, point_mass ? std::span<const TokenProb>{} : std::span<const TokenProb>(q), rng);
    ++counts[static_cast<size_t>(v.token)];
  }
  std::vector<double> probs(kVocab, 0);
  for (const TokenProb& t : p) probs[static_cast<size_t>(t.token)] = t.prob;
  return chi_square(counts, probs, kTrials);
}

}  // namespace

TEST(SpecVerify, EmittedTokenFollowsTheTargetForAnyDraftDistribution) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    const ChiSquare c = first_token_test(exact_rule, false, seed);
    EXPECT_LT(c.stat, chi_square_critical_0001(c.df)) << "seed " << seed << " df " << c.df;
  }
}

TEST(SpecVerify, EmittedTokenFollowsTheTargetForAPointMassDraft) {
  for (uint64_t seed : {4u, 5u}) {
    const ChiSquare c = first_token_test(exact_rule, true, seed);
    EXPECT_LT(c.stat, chi_square_critical_0001(c.df)) << "seed " << seed << " df " << c.df;
  }
}

TEST(SpecVerify, TheSameTestRejectsWrongRules) {
  // If these passed, the test above could not tell a broken verifier from a correct one.
  const ChiSquare argmax = first_token_test(argmax_rule, false, 1);
  EXPECT_GT(argmax.stat, chi_square_critical_0001(argmax.df));
  const ChiSquare resample = first_token_test(resample_from_p_rule, false, 1);
  EXPECT_GT(resample.stat, chi_square_critical_0001(resample.df));
  const ChiSquare resample_point = first_token_test(resample_from_p_rule, true, 4);
  EXPECT_GT(resample_point.stat, chi_square_critical_0001(resample_point.df));
}

// Two tokens from a context-dependent target p(. | prefix), proposed as a chain of two by a
// context-dependent drafter q(. | prefix), generated step by step as the engine does (a
// rejection ends the step; the next step drafts again from the emitted prefix). The joint
// distribution of the first two emitted tokens must be p(t0) p(t1 | t0): 36 cells.
TEST(SpecVerify, ChainsOfDraftsKeepTheJointDistribution) {
  std::mt19937_64 rng(11);
  std::vector<SparseDistribution> p(1 + kVocab), q(1 + kVocab);  // [0]: empty prefix, [1 + t]: after t
  for (auto& d : p) d = random_distribution(rng, kVocab, 1);
  for (auto& d : q) d = random_distribution(rng, kVocab, 0);
  const auto ctx = [](const std::vector<int32_t>& prefix) { return prefix.empty() ? 0 : 1 + prefix.back(); };
  std::vector<int64_t> counts(kVocab * kVocab, 0);
  for (int64_t i = 0; i < kTrials; ++i) {
    std::vector<int32_t> out;
    while (out.size() < 2) {
      // Draft two tokens from q along its own chain.
      std::vector<int32_t> draft;
      std::vector<SparseDistribution> qs;
      std::vector<int32_t> walk = out;
      for (int j = 0; j < 2; ++j) {
        qs.push_back(q[static_cast<size_t>(ctx(walk))]);
        draft.push_back(draw(qs.back(), uniform01(rng)));
        walk.push_back(draft.back());
      }
      std::vector<int32_t> accepted = out;
      const ChainVerdict v = verify_chain(
          draft, qs, [&](size_t) -> std::span<const TokenProb> { return p[static_cast<size_t>(ctx(accepted))]; },
          [&](size_t j) { accepted.push_back(draft[j]); }, [&] { return uniform01(rng); });
      out.insert(out.end(), v.tokens.begin(), v.tokens.end());
      if (v.n_accepted == draft.size()) out.push_back(draw(p[static_cast<size_t>(ctx(out))], uniform01(rng)));
    }
    ++counts[static_cast<size_t>(out[0] * kVocab + out[1])];
  }
  std::vector<double> probs(kVocab * kVocab, 0);
  for (int a = 0; a < kVocab; ++a)
    for (int b = 0; b < kVocab; ++b)
      probs[static_cast<size_t>(a * kVocab + b)] =
          probability_of(p[0], a) * probability_of(p[static_cast<size_t>(1 + a)], b);
  const ChiSquare c = chi_square(counts, probs, kTrials);
  EXPECT_LT(c.stat, chi_square_critical_0001(c.df)) << "df " << c.df;
}

TEST(SpecVerify, GreedyTargetKeepsExactlyTheArgmax) {
  const SparseDistribution greedy = {{7, 1.0}};
  const auto u = [] { return 0.999; };
  EXPECT_TRUE(verify_position(greedy, 7, {}, u).accepted);
  const PositionVerdict v = verify_position(greedy, 3, {}, u);
  EXPECT_FALSE(v.accepted);
  EXPECT_EQ(v.token, 7);
}

TEST(SpecVerify, ChainStopsAtTheFirstRejectionAndCallsTheTargetInOrder) {
  const std::vector<int32_t> draft = {1, 2, 3};
  const std::vector<SparseDistribution> p = {{{1, 1.0}}, {{4, 1.0}}, {{3, 1.0}}};
  std::vector<size_t> asked, kept;
  const ChainVerdict v = verify_chain(
      draft, {},
      [&](size_t j) -> std::span<const TokenProb> {
        asked.push_back(j);
        return p[j];
      },
      [&](size_t j) { kept.push_back(j); }, [] { return 0.5; });
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{1, 4}));
  EXPECT_EQ(v.n_accepted, 1u);
  EXPECT_EQ(asked, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(kept, (std::vector<size_t>{0}));
}
