// Exact speculative verification against its definition: over random target and draft
// distributions, the emitted tokens must be distributed as the target's own sampling, and
// the same statistical test must reject rules that are subtly wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
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

// The joint distribution of two positions, p[0](a) · p[1 + a](b), flattened [a * kVocab + b].
std::vector<double> joint_of_two(const std::vector<SparseDistribution>& p) {
  std::vector<double> probs(kVocab * kVocab, 0);
  for (int a = 0; a < kVocab; ++a)
    for (int b = 0; b < kVocab; ++b)
      probs[static_cast<size_t>(a * kVocab + b)] =
          probability_of(p[0], a) * probability_of(p[static_cast<size_t>(1 + a)], b);
  return probs;
}
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
  const std::vector<double> probs = joint_of_two(p);
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

// ---- Trees of point-mass drafts (a deterministic drafter's several candidates) ----

namespace {

// A tree verification rule with verify_tree's signature, so the statistical tests below can
// run a deliberately wrong one through the same harness.
using TreeRule =
    std::function<TreeVerdict(std::span<const int32_t>, std::span<const int16_t>,
                              FunctionRef<std::span<const TokenProb>(int)>, FunctionRef<void(int)>, UniformSource)>;

TreeVerdict exact_tree_rule(std::span<const int32_t> tokens, std::span<const int16_t> parents,
                            FunctionRef<std::span<const TokenProb>(int)> target, FunctionRef<void(int)> on_accept,
                            UniformSource uniform) {
  return verify_tree(tokens, parents, target, on_accept, uniform);
}

// The tempting bug: try each child with its raw p(c), as if it were the only candidate, instead
// of renormalizing p after each rejection; the replacement is still drawn from p without the
// children. Every child but the first is emitted too rarely (p(c) times the chance of reaching it).
TreeVerdict raw_p_tree_rule(std::span<const int32_t> tokens, std::span<const int16_t> parents,
                            FunctionRef<std::span<const TokenProb>(int)> target, FunctionRef<void(int)> on_accept,
                            UniformSource uniform) {
  const auto is_child = [&](int node, int32_t token) {
    for (size_t j = 0; j < parents.size(); ++j)
      if (parents[j] == node && tokens[j] == token) return true;
    return false;
  };
  TreeVerdict out;
  for (int node = -1;;) {
    if (std::find(parents.begin(), parents.end(), node) == parents.end()) {
      out.reached_leaf = true;
      return out;
    }
    const std::span<const TokenProb> p = target(node);
    int kept = -1;
    for (size_t c = 0; c < parents.size() && kept < 0; ++c)
      if (parents[c] == node && uniform() < probability_of(p, tokens[c])) kept = static_cast<int>(c);
    if (kept < 0) {
      double rest = 0;
      for (const TokenProb& t : p) rest += is_child(node, t.token) ? 0 : t.prob;
      const double target_mass = uniform() * rest;
      double cum = 0;
      int32_t token = -1;
      for (const TokenProb& t : p) {
        if (is_child(node, t.token)) continue;
        token = t.token;
        if ((cum += t.prob) > target_mass) break;
      }
      out.tokens.push_back(token);
      return out;
    }
    out.tokens.push_back(tokens[static_cast<size_t>(kept)]);
    out.path.push_back(static_cast<int16_t>(kept));
    ++out.n_accepted;
    on_accept(kept);
    node = kept;
  }
}

// A random p over kVocab tokens with at least one exact zero (redrawn until it has one).
SparseDistribution random_distribution_with_zero(std::mt19937_64& rng) {
  for (;;) {
    SparseDistribution p = random_distribution(rng, kVocab, 2);
    if (p.size() < static_cast<size_t>(kVocab) && p.size() >= 3) return p;
  }
}

// p's tokens ordered by decreasing probability (ties by id), then the tokens of p = 0.
std::vector<int32_t> tokens_by_probability(std::span<const TokenProb> p) {
  std::vector<int32_t> order(kVocab);
  for (int t = 0; t < kVocab; ++t) order[static_cast<size_t>(t)] = t;
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return probability_of(p, a) > probability_of(p, b); });
  return order;
}

// What a root whose children are `roles` emits first, over kTrials. Each role picks a child
// token from p: 0 = the argmax, 1 and 2 = the second and third most likely, -1 = a token of
// p = 0. Returns the chi-square of the first emitted token's distribution against p.
ChiSquare tree_first_token_test(const TreeRule& rule, const std::vector<int>& roles, uint64_t seed,
                                int64_t trials = kTrials) {
  std::mt19937_64 rng(seed);
  const SparseDistribution p = random_distribution_with_zero(rng);
  const std::vector<int32_t> order = tokens_by_probability(p);
  std::vector<int32_t> children;
  for (int role : roles) children.push_back(role >= 0 ? order[static_cast<size_t>(role)] : order.back());
  const std::vector<int16_t> parents(children.size(), -1);
  std::vector<int64_t> counts(kVocab, 0);
  for (int64_t i = 0; i < trials; ++i) {
    const TreeVerdict v = rule(
        children, parents,
        [&](int node) -> std::span<const TokenProb> {
          EXPECT_EQ(node, -1);  // every child is a leaf: only the root's row is asked for
          return p;
        },
        [](int) {}, [&] { return uniform01(rng); });
    ++counts[static_cast<size_t>(v.tokens.at(0))];
  }
  std::vector<double> probs(kVocab, 0);
  for (const TokenProb& t : p) probs[static_cast<size_t>(t.token)] = t.prob;
  return chi_square(counts, probs, trials);
}

// Two tokens from a context-dependent target p(. | prefix), generated step by step as the
// engine does, with a deterministic drafter proposing the two-level tree
//   root -> {node 0: 2nd most likely, node 1: argmax},  node 0 -> {node 2: argmax, node 3: p = 0}
// of the target's own rows (the most demanding drafter: it puts the likeliest tokens in the
// children, where a wrong keep rule moves the most mass). When the path reaches a leaf, the
// test samples the bonus from target(leaf) itself, as the engine does. The joint distribution
// of the first two emitted tokens must be p(t0) p(t1 | t0): 36 cells.
ChiSquare tree_joint_test(const TreeRule& rule, uint64_t seed, int64_t trials = kTrials) {
  std::mt19937_64 rng(seed);
  std::vector<SparseDistribution> p(1 + kVocab);  // [0]: empty prefix, [1 + t]: after t
  for (auto& d : p) d = random_distribution_with_zero(rng);
  const auto ctx = [](const std::vector<int32_t>& prefix) { return prefix.empty() ? 0 : 1 + prefix.back(); };
  const auto row = [&](const std::vector<int32_t>& prefix) -> const SparseDistribution& {
    return p[static_cast<size_t>(ctx(prefix))];
  };
  // The drafter's tree for each context (it depends on the context only), made once.
  std::vector<std::vector<int32_t>> trees(1 + kVocab);
  for (size_t c = 0; c < trees.size(); ++c) {
    const std::vector<int32_t> root = tokens_by_probability(p[c]);
    const std::vector<int32_t> next = tokens_by_probability(p[static_cast<size_t>(1 + root[1])]);
    trees[c] = {root[1], root[0], next[0], next.back()};
  }
  const std::vector<int16_t> parents = {-1, -1, 0, 0};
  std::vector<int64_t> counts(kVocab * kVocab, 0);
  std::vector<int32_t> out, accepted;
  for (int64_t i = 0; i < trials; ++i) {
    out.clear();
    while (out.size() < 2) {
      const std::vector<int32_t>& tokens = trees[static_cast<size_t>(ctx(out))];
      accepted = out;  // the prefix the target's rows see
      const auto target = [&](int node) -> std::span<const TokenProb> {
        // The row after `node` is the row of the prefix ending in it.
        EXPECT_TRUE(node == -1 ? accepted == out : accepted.back() == tokens[static_cast<size_t>(node)]);
        return row(accepted);
      };
      const TreeVerdict v = rule(
          tokens, parents, target, [&](int node) { accepted.push_back(tokens[static_cast<size_t>(node)]); },
          [&] { return uniform01(rng); });
      out.insert(out.end(), v.tokens.begin(), v.tokens.end());
      if (v.reached_leaf) out.push_back(draw(target(v.path.empty() ? -1 : v.path.back()), uniform01(rng)));
    }
    ++counts[static_cast<size_t>(out[0] * kVocab + out[1])];
  }
  const std::vector<double> probs = joint_of_two(p);
  return chi_square(counts, probs, trials);
}

}  // namespace

TEST(SpecVerifyTree, FirstEmittedTokenFollowsTheTarget) {
  // Two and three point-mass children, with the argmax first, last or absent, and a child of
  // p = 0 among them.
  const std::vector<std::vector<int>> shapes = {{0, -1}, {-1, 0}, {1, -1, 0}, {-1, 2, 1}};
  uint64_t seed = 21;
  for (const std::vector<int>& roles : shapes) {
    const ChiSquare c = tree_first_token_test(exact_tree_rule, roles, seed);
    EXPECT_LT(c.stat, chi_square_critical_0001(c.df)) << "seed " << seed << " df " << c.df;
    ++seed;
  }
}

TEST(SpecVerifyTree, TwoLevelTreeKeepsTheJointDistribution) {
  const ChiSquare c = tree_joint_test(exact_tree_rule, 31);
  EXPECT_LT(c.stat, chi_square_critical_0001(c.df)) << "df " << c.df;
}

TEST(SpecVerifyTree, TheSameTestsRejectTryingChildrenWithoutRenormalizing) {
  // If these passed, the tests above could not tell a broken tree verifier from a correct one.
  // The wrong rule moves whole percents of mass: a tenth of the trials shows it many times over.
  const ChiSquare first = tree_first_token_test(raw_p_tree_rule, {1, -1, 0}, 23, kTrials / 10);
  EXPECT_GT(first.stat, chi_square_critical_0001(first.df));
  const ChiSquare joint = tree_joint_test(raw_p_tree_rule, 31, kTrials / 10);
  EXPECT_GT(joint.stat, chi_square_critical_0001(joint.df));
}

TEST(SpecVerifyTree, RejectsMalformedTrees) {
  // The message verify_tree throws for a tree, "" when it accepts it.
  const auto error = [](std::vector<int32_t> tokens, std::vector<int16_t> parents) -> std::string {
    const SparseDistribution p = {{0, 1.0}};
    try {
      verify_tree(
          tokens, parents, [&](int) -> std::span<const TokenProb> { return p; }, [](int) {}, [] { return 0.5; });
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const auto names = [](const std::string& message, const char* what) {
    return message.find(what) != std::string::npos;
  };
  EXPECT_PRED2(names, error({1, 2}, {-1, 1}), "node 1 has parent 1");        // a parent at the node's own index
  EXPECT_PRED2(names, error({1, 2, 3}, {-1, 2, 0}), "node 1 has parent 2");  // a parent after the node
  EXPECT_PRED2(names, error({1, 2}, {-1, -2}), "node 1 has parent -2");      // below -1
  EXPECT_PRED2(names, error({1, 2, 1}, {-1, -1, -1}), "sibling nodes 0 and 2 both hold token 1");
  EXPECT_PRED2(names, error({1, 2, 3, 2}, {-1, 0, 0, 0}), "sibling nodes 1 and 3 both hold token 2");
  EXPECT_PRED2(names, error({1, 2}, {-1}), "1 parents for 2 draft tokens");
  EXPECT_EQ(error({1, 1, 1}, {-1, 0, 1}), "");  // the same token under different parents is fine
}

TEST(SpecVerifyTree, CallsTheTargetOnlyAlongTheKeptPath) {
  // root -> {0: 5, 1: 6}; 1 -> {2: 7, 3: 8}; 3 -> {4: 9}. Greedy rows keep 6, then 8, then 9 (a leaf).
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9};
  const std::vector<int16_t> parents = {-1, -1, 1, 1, 3};
  const std::vector<SparseDistribution> rows = {{{6, 1.0}}, {}, {{8, 1.0}}, {}, {{9, 1.0}}};  // by node + 1
  std::vector<int> events;  // target(node) as node, on_accept(node) as 100 + node
  int n_uniform = 0;
  const TreeVerdict v = verify_tree(
      tokens, parents,
      [&](int node) -> std::span<const TokenProb> {
        events.push_back(node);
        return rows.at(static_cast<size_t>(node + 1));
      },
      [&](int node) { events.push_back(100 + node); },
      [&] {
        ++n_uniform;
        return 0.5;
      });
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{6, 8, 9}));
  EXPECT_EQ(v.path, (std::vector<int16_t>{1, 3, 4}));
  EXPECT_EQ(v.n_accepted, 3u);
  EXPECT_TRUE(v.reached_leaf);
  EXPECT_EQ(events, (std::vector<int>{-1, 101, 1, 103, 3, 104}));  // never target(4): the caller samples the bonus
  EXPECT_EQ(n_uniform, 5);                                         // children tried: 5, 6; 7, 8; 9

  // All children of the kept node rejected: the replacement is the row's argmax, no leaf.
  const std::vector<SparseDistribution> rejecting = {{{6, 1.0}}, {}, {{4, 1.0}}};
  const TreeVerdict r = verify_tree(
      tokens, parents,
      [&](int node) -> std::span<const TokenProb> { return rejecting.at(static_cast<size_t>(node + 1)); }, [](int) {},
      [] { return 0.5; });
  EXPECT_EQ(r.tokens, (std::vector<int32_t>{6, 4}));
  EXPECT_EQ(r.path, (std::vector<int16_t>{1}));
  EXPECT_FALSE(r.reached_leaf);

  // An empty draft is a leaf at the root: nothing asked, nothing drawn.
  const TreeVerdict e = verify_tree(
      {}, {},
      [&](int) -> std::span<const TokenProb> {
        ADD_FAILURE() << "target called for an empty draft";
        return {};
      },
      [](int) {}, [] { return 0.5; });
  EXPECT_TRUE(e.tokens.empty());
  EXPECT_TRUE(e.reached_leaf);
  EXPECT_EQ(e.n_accepted, 0u);
}

TEST(SpecVerifyTree, ResidualWithNoMassLeftFallsBackToTheLastChildWithMass) {
  // The children hold all of p's mass, so the rule keeps the last of them with positive p with
  // probability 1 and the replacement is never drawn; rounding can still reject it. Exaggerate
  // that with a p summing to a little under 1: u = 0.9999999 rejects 2 (u * 1 >= 0.5), then 3
  // (u * 0.5 >= 0.4999999), then 7 (p = 0), leaving no mass outside the children.
  const SparseDistribution p = {{2, 0.5}, {3, 0.4999999}};
  const std::vector<int32_t> tokens = {2, 3, 7};
  const std::vector<int16_t> parents = {-1, -1, -1};
  const TreeVerdict v = verify_tree(
      tokens, parents, [&](int) -> std::span<const TokenProb> { return p; }, [](int) {}, [] { return 0.9999999; });
  EXPECT_EQ(v.tokens, (std::vector<int32_t>{3}));  // the last child with mass, not 7 (p = 0)
  EXPECT_EQ(v.n_accepted, 0u);
  EXPECT_FALSE(v.reached_leaf);
}

TEST(SpecVerifyTree, AChainAsATreeMatchesVerifyChainUniformForUniform) {
  std::mt19937_64 gen(41);
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t k = 1 + gen() % 6;
    std::vector<int32_t> draft(k);
    std::vector<int16_t> parents(k);
    std::vector<SparseDistribution> rows(k);  // greedy: a point mass at each position's argmax
    for (size_t j = 0; j < k; ++j) {
      draft[j] = static_cast<int32_t>(gen() % 3);
      parents[j] = static_cast<int16_t>(static_cast<int>(j) - 1);
      rows[j] = {{static_cast<int32_t>(gen() % 3), 1.0}};
    }
    const uint64_t seed = gen();
    std::mt19937_64 rng_chain(seed), rng_tree(seed);
    std::vector<size_t> kept_chain;
    std::vector<int> kept_tree;
    const ChainVerdict c = verify_chain(
        draft, {}, [&](size_t j) -> std::span<const TokenProb> { return rows[j]; },
        [&](size_t j) { kept_chain.push_back(j); }, [&] { return uniform01(rng_chain); });
    const TreeVerdict t = verify_tree(
        draft, parents, [&](int node) -> std::span<const TokenProb> { return rows[static_cast<size_t>(node + 1)]; },
        [&](int node) { kept_tree.push_back(node); }, [&] { return uniform01(rng_tree); });
    ASSERT_EQ(t.tokens, c.tokens) << "trial " << trial;
    ASSERT_EQ(t.n_accepted, c.n_accepted);
    ASSERT_EQ(t.reached_leaf, c.n_accepted == k);
    ASSERT_EQ(t.path.size(), kept_chain.size());
    for (size_t i = 0; i < kept_chain.size(); ++i) {
      ASSERT_EQ(static_cast<size_t>(t.path[i]), kept_chain[i]);
      ASSERT_EQ(static_cast<size_t>(kept_tree[i]), kept_chain[i]);
    }
    ASSERT_EQ(rng_chain(), rng_tree()) << "the two drew a different number of uniforms";
  }
}
