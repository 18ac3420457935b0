#include "spec/verify.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

double probability_of(std::span<const TokenProb> dist, int32_t token) {
  const auto it =
      std::lower_bound(dist.begin(), dist.end(), token, [](const TokenProb& a, int32_t t) { return a.token < t; });
  return it != dist.end() && it->token == token ? it->prob : 0.0;
}

namespace {

// Draws from norm(max(0, p - q)) with one uniform. Walks p (sorted by id); q's mass on tokens
// outside p does not matter (max(0, 0 - q) = 0).
int32_t draw_residual(std::span<const TokenProb> p, int32_t x, std::span<const TokenProb> q, double u) {
  const auto residual = [&](const TokenProb& t) {
    const double q_t = q.empty() ? (t.token == x ? 1.0 : 0.0) : probability_of(q, t.token);
    return std::max(0.0, t.prob - q_t);
  };
  double total = 0;
  for (const TokenProb& t : p) total += residual(t);
  // A rejection needs p(x) < q(x), which leaves mass elsewhere: sum(max(0, p - q)) =
  // sum(max(0, q - p)) >= q(x) - p(x) > 0. Rounding can still leave nothing (p and q equal
  // to within an ulp); then p itself is the residual's limit.
  if (!(total > 0)) {
    double cum = 0;
    const double target = u;
    for (const TokenProb& t : p)
      if ((cum += t.prob) > target) return t.token;
    return p.back().token;
  }
  const double target = u * total;
  double cum = 0;
  int32_t last = -1;
  for (const TokenProb& t : p) {
    const double r = residual(t);
    if (r <= 0) continue;
    last = t.token;
    if ((cum += r) > target) return t.token;
  }
  return last;  // rounding left the target past the last interval
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

}  // namespace tessera
