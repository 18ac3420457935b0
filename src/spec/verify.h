#pragma once
// Exact speculative verification (Leviathan et al. 2023; Chen et al. 2023): the tokens it
// emits are distributed exactly as the target's own sampling would emit them, whatever the
// drafter proposed. Contract: docs/design/spec-decode.md.
//
// For each draft position j, in order, with p_j the target's processed distribution there
// (after the request's logit bias, penalties, temperature, top-k, top-p and min-p, the
// penalties seeing the draft prefix accepted so far) and q_j the drafter's distribution
// from which the proposed token x_j was drawn:
//   - keep x_j with probability min(1, p_j(x_j) / q_j(x_j));
//   - at the first rejection emit a token drawn from norm(max(0, p_j - q_j)) and stop;
//   - when all k are kept, the caller samples one bonus token from p_k.
// A deterministic drafter (n-gram lookup) proposes a point mass q_j = delta(x_j): the keep
// probability is p_j(x_j) and the residual is p_j without x_j, renormalized. Greedy
// requests have p_j = delta(argmax): a draft token is kept iff it is the argmax, and the
// replacement is the argmax, so greedy output is token for token the non-speculative one.
#include <cstdint>
#include <span>
#include <vector>

#include "core/function_ref.h"
#include "sample/sampler.h"  // TokenProb

namespace tessera {

// A sparse distribution: tokens of positive probability, sorted by token id, summing to 1
// (what Sampler::distribution returns).
using SparseDistribution = std::vector<TokenProb>;

// p(token) in a distribution sorted by token id; 0 when absent.
double probability_of(std::span<const TokenProb> dist, int32_t token);

// Where verification's random numbers come from: a Sampler's stream in the engine (seeded
// requests stay reproducible), anything in tests. Each call returns a uniform in [0, 1).
using UniformSource = FunctionRef<double()>;

struct PositionVerdict {
  bool accepted = false;
  int32_t token = -1;  // the draft token when kept, else the replacement drawn from the residual
};

// One draft position. p: the target's processed distribution; x: the proposed token; q: the
// drafter's distribution (empty = a point mass at x). Draws one uniform for the keep
// decision and, on a rejection, one more for the residual.
PositionVerdict verify_position(std::span<const TokenProb> p, int32_t x, std::span<const TokenProb> q,
                                UniformSource uniform);

// Verifies a chain of draft tokens. target(j) returns p_j; it is called for j = 0, 1, ...
// in order and only while every earlier token was kept, after on_accept(j - 1) recorded the
// kept token (so penalties at j see the prefix). q: one distribution per position, or empty
// for point masses. Returns the emitted tokens: the kept prefix, then the replacement for
// the first rejected position; when all are kept, just the draft (the caller then samples
// the bonus token from p_k itself, so an empty draft is plain sampling).
struct ChainVerdict {
  std::vector<int32_t> tokens;
  size_t n_accepted = 0;  // == draft size: all kept, no replacement in tokens
};
ChainVerdict verify_chain(std::span<const int32_t> draft, std::span<const SparseDistribution> q,
                          FunctionRef<std::span<const TokenProb>(size_t)> target, FunctionRef<void(size_t)> on_accept,
                          UniformSource uniform);

// Verifies a tree of point-mass draft tokens (a deterministic drafter's several candidates).
// tokens[j] and parents[j] as in Draft (parents[j] < j, -1 = the last verified token; siblings distinct).
// target(node) returns the processed distribution of the row after `node` (node -1 = the last verified
// token's row, i.e. the distribution of the first draft position); it is called only for the root and
// for nodes that were kept, each at most once, in path order, after on_accept(node) recorded each kept node.
// At each node the children are tried in index order: child c is kept with probability r(c), r the
// node's distribution with the children tried before removed and renormalized (for point masses this is
// exactly min(1, r(c)/q(c)) of the recursive rejection scheme, so the emitted token is distributed as p);
// when every child is rejected, the replacement is drawn from r with all children removed.
// Draws one uniform per child tried and one for the replacement. A chain (parents[j] == j - 1)
// is verified as verify_chain verifies it with point masses, uniform for uniform.
struct TreeVerdict {
  std::vector<int32_t> tokens;  // the kept path's tokens, then the replacement (absent when a leaf was reached)
  std::vector<int16_t> path;    // the kept nodes, in order (path.size() == n_accepted)
  size_t n_accepted = 0;
  bool reached_leaf = false;  // the last kept node (or the root, for an empty draft) has no children:
                              // the caller samples the bonus token from target(path.back()) itself
};
TreeVerdict verify_tree(std::span<const int32_t> tokens, std::span<const int16_t> parents,
                        FunctionRef<std::span<const TokenProb>(int)> target, FunctionRef<void(int)> on_accept,
                        UniformSource uniform);

}  // namespace tessera
