#include "spec/verify.h"

#include <algorithm>
#include <cstdint>

#include "core/error.h"

namespace tessera {

double probability_of(std::span<const TokenProb> dist, int32_t token) {
  const auto it =
      std::lower_bound(dist.begin(), dist.end(), token, [](const TokenProb& a, int32_t t) { return a.token < t; });
  return it != dist.end() && it->token == token ? it->prob : 0.0;
}

namespace {

// Draws a token of p with probability weight(t) / sum(weight) using one uniform, walking p in
// token order; -1 when the weights leave no mass (all zero, or rounding ate them).
template <typename Weight>
int32_t draw_weighted(std::span<const TokenProb> p, const Weight& weight, double u) {
  double total = 0;
  for (const TokenProb& t : p) total += weight(t);
  if (!(total > 0)) return -1;
  const double target = u * total;
  double cum = 0;
  int32_t last = -1;
  for (const TokenProb& t : p) {
    const double w = weight(t);
    if (w <= 0) continue;
    last = t.token;
    if ((cum += w) > target) return t.token;
  }
  return last;  // rounding left the target past the last interval
}

// Draws from norm(max(0, p - q)) with one uniform. Walks p (sorted by id); q's mass on tokens
// outside p does not matter (max(0, 0 - q) = 0).
int32_t draw_residual(std::span<const TokenProb> p, int32_t x, std::span<const TokenProb> q, double u) {
  const auto residual = [&](const TokenProb& t) {
    const double q_t = q.empty() ? (t.token == x ? 1.0 : 0.0) : probability_of(q, t.token);
    return std::max(0.0, t.prob - q_t);
  };
  // A rejection needs p(x) < q(x), which leaves mass elsewhere: sum(max(0, p - q)) =
  // sum(max(0, q - p)) >= q(x) - p(x) > 0. Rounding can still leave nothing (p and q equal
  // to within an ulp); then p itself is the residual's limit.
  if (const int32_t token = draw_weighted(p, residual, u); token >= 0) return token;
  const int32_t token = draw_weighted(
      p, [](const TokenProb& t) { return t.prob; }, u);
  return token >= 0 ? token : p.back().token;
}

// The replacement after a tree node rejected all its children: a draw from p with the
// children's tokens removed, renormalized. `children` holds their tokens in the order tried.
int32_t draw_without_children(std::span<const TokenProb> p, std::span<const int32_t> children, double u) {
  std::vector<int32_t> removed(children.begin(), children.end());
  std::sort(removed.begin(), removed.end());  // one binary search per token of p, not a scan of the children
  const int32_t token = draw_weighted(
      p, [&](const TokenProb& t) { return std::binary_search(removed.begin(), removed.end(), t.token) ? 0.0 : t.prob; },
      u);
  if (token >= 0) return token;
  // Nothing outside the children: they hold all of p's mass, so the last of them with positive
  // p was kept with probability 1 - rounding rejected it. It is what the rule meant to emit.
  for (auto it = children.rbegin(); it != children.rend(); ++it)
    if (probability_of(p, *it) > 0) return *it;
  return children.back();  // p has no positive mass at all; any token is as good
}

}  // namespace

PositionVerdict verify_position(std::span<const TokenProb> p, int32_t x, std::span<const TokenProb> q,
                                UniformSource uniform) {
  TESSERA_CHECK(!p.empty(), "speculative verification: the target distribution is empty");
  const double p_x = probability_of(p, x);
  const double q_x = q.empty() ? 1.0 : probability_of(q, x);
  // Keep with probability min(1, p/q): u < p/q  <=>  u * q < p (no division; q_x = 0, a
  // token the drafter could not have drawn, is kept only if p_x > 0).
  const double u = uniform();
  if (u * q_x < p_x) return {true, x};
  return {false, draw_residual(p, x, q, uniform())};
}

ChainVerdict verify_chain(std::span<const int32_t> draft, std::span<const SparseDistribution> q,
                          FunctionRef<std::span<const TokenProb>(size_t)> target, FunctionRef<void(size_t)> on_accept,
                          UniformSource uniform) {
  TESSERA_CHECK(q.empty() || q.size() == draft.size(), "speculative verification: ", q.size(),
                " draft distributions for ", draft.size(), " draft tokens");
  ChainVerdict out;
  out.tokens.reserve(draft.size() + 1);
  for (size_t j = 0; j < draft.size(); ++j) {
    const std::span<const TokenProb> qj = q.empty() ? std::span<const TokenProb>{} : std::span<const TokenProb>(q[j]);
    const PositionVerdict v = verify_position(target(j), draft[j], qj, uniform);
    out.tokens.push_back(v.token);
    if (!v.accepted) break;
    ++out.n_accepted;
    on_accept(j);
  }
  return out;
}

TreeVerdict verify_tree(std::span<const int32_t> tokens, std::span<const int16_t> parents,
                        FunctionRef<std::span<const TokenProb>(int)> target, FunctionRef<void(int)> on_accept,
                        UniformSource uniform) {
  TESSERA_CHECK(parents.size() == tokens.size(), "speculative tree verification: ", parents.size(), " parents for ",
                tokens.size(), " draft tokens");
  TESSERA_CHECK(tokens.size() <= size_t{INT16_MAX} + 1, "speculative tree verification: ", tokens.size(),
                " draft tokens, more than int16 node ids can name");
  const int n = static_cast<int>(tokens.size());
  // The tree as child lists in index order (the order children are tried in): the first child
  // of node i is first_child[i + 1] (the root is node -1), the next is next_sibling[that];
  // -1 ends a list. Built in one pass, checking each node against its earlier siblings.
  std::vector<int16_t> first_child(static_cast<size_t>(n) + 1, -1), last_child(static_cast<size_t>(n) + 1, -1);
  std::vector<int16_t> next_sibling(static_cast<size_t>(n), -1);
  for (int j = 0; j < n; ++j) {
    const int parent = parents[static_cast<size_t>(j)];
    TESSERA_CHECK(parent >= -1 && parent < j, "speculative tree verification: node ", j, " has parent ", parent,
                  ", outside [-1, ", j, ")");
    const size_t list = static_cast<size_t>(parent + 1);
    for (int s = first_child[list]; s >= 0; s = next_sibling[static_cast<size_t>(s)])
      TESSERA_CHECK(tokens[static_cast<size_t>(s)] != tokens[static_cast<size_t>(j)],
                    "speculative tree verification: sibling nodes ", s, " and ", j, " both hold token ",
                    tokens[static_cast<size_t>(j)]);
    if (last_child[list] < 0)
      first_child[list] = static_cast<int16_t>(j);
    else
      next_sibling[static_cast<size_t>(last_child[list])] = static_cast<int16_t>(j);
    last_child[list] = static_cast<int16_t>(j);
  }

  TreeVerdict out;
  std::vector<int32_t> rejected;  // the current node's children tried so far, in order
  for (int node = -1;;) {
    const int first = first_child[static_cast<size_t>(node + 1)];
    if (first < 0) {
      out.reached_leaf = true;  // the caller samples the bonus from this node's row
      break;
    }
    const std::span<const TokenProb> p = target(node);
    TESSERA_CHECK(!p.empty(), "speculative verification: the target distribution is empty");
    // Child c is kept with probability r(c) = p(c) / mass, mass = 1 - p(children rejected so
    // far) (p sums to 1): then each child is emitted with probability exactly p(c), and so is
    // each other token through the replacement. u < r(c)  <=>  u * mass < p(c), no division;
    // a child of p(c) = 0 is never kept, and mass rounded to 0 keeps any child of p(c) > 0.
    double mass = 1.0;
    int kept = -1;
    rejected.clear();
    for (int c = first; c >= 0; c = next_sibling[static_cast<size_t>(c)]) {
      const int32_t token = tokens[static_cast<size_t>(c)];
      const double p_c = probability_of(p, token);
      if (uniform() * mass < p_c) {
        kept = c;
        break;
      }
      mass = std::max(0.0, mass - p_c);
      rejected.push_back(token);
    }
    if (kept < 0) {
      out.tokens.push_back(draw_without_children(p, rejected, uniform()));
      break;
    }
    out.tokens.push_back(tokens[static_cast<size_t>(kept)]);
    out.path.push_back(static_cast<int16_t>(kept));
    ++out.n_accepted;
    on_accept(kept);
    node = kept;
  }
  return out;
}

}  // namespace tessera
