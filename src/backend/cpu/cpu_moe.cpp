// Mixture-of-experts FFN on the CPU (Backend::moe_ffn): routing per row, then the rows grouped
// by expert so that each expert runs as one product over the rows that chose it (the grouped
// products of vLLM's fused MoE, here through the ordinary matmul), then a weighted sum back.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"

namespace tessera {

void CpuBackend::moe_ffn(const float* x, int n_rows, int dim, const MoeFfnWeights& moe, float* out) {
  check_moe_ffn(moe, dim);
  const int n_exp = moe.n_expert, k = moe.n_used, ff = moe.n_ff;
  if (n_rows == 0) return;
  MoeScratch& s = moe_;
  const size_t slots = static_cast<size_t>(n_rows) * k;
  s.probs.resize(static_cast<size_t>(n_rows) * n_exp);
  const MatmulTarget route[] = {{moe.router, s.probs.data(), n_exp}};
  matmul(x, n_rows, dim, route);  // probs: [n_rows, n_expert] router logits, then probabilities

  // Routing. choice[r * k + j] = the row's j-th expert; weights renormalized over the k.
  std::vector<int32_t>& choice = s.choice;
  std::vector<int32_t>& order = s.order;
  choice.resize(slots);
  order.resize(n_exp);
  s.weight_of.resize(slots);
  for (int r = 0; r < n_rows; ++r) {
    float* p = s.probs.data() + static_cast<size_t>(r) * n_exp;
    const float mx = *std::max_element(p, p + n_exp);
    double sum = 0;
    for (int e = 0; e < n_exp; ++e) sum += p[e] = std::exp(p[e] - mx);
    for (int e = 0; e < n_exp; ++e) p[e] = static_cast<float>(p[e] / sum);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    double chosen = 0;
    for (int j = 0; j < k; ++j) chosen += p[order[j]];
    if (!moe.renormalize) chosen = 1;
    for (int j = 0; j < k; ++j) {
      choice[static_cast<size_t>(r) * k + j] = order[j];
      s.weight_of[static_cast<size_t>(r) * k + j] = static_cast<float>(p[order[j]] / chosen);
    }
  }
  // Rows grouped by expert (stable: row order within an expert). rows[i] = the input row of
  // grouped slot i; slot_of[r * k + j] = where row r's j-th choice landed.
  // start[e]: first grouped slot of expert e (a counting sort; no allocation once warm).
  std::vector<int32_t>& start = s.start;
  start.assign(n_exp + 1, 0);
  for (const int32_t e : choice) ++start[e + 1];
  for (int e = 0; e < n_exp; ++e) start[e + 1] += start[e];
  s.rows.resize(slots);
  s.slot_of.resize(slots);
  std::vector<int32_t>& fill = s.fill;
  fill.assign(start.begin(), start.end() - 1);
  for (size_t i = 0; i < slots; ++i) {
    const int32_t at = fill[choice[i]]++;
    s.rows[at] = static_cast<int32_t>(i / k);
    s.slot_of[i] = at;
  }
  s.xg.resize(slots * dim);
  gather_rows(x, dim, s.rows.data(), static_cast<int>(slots), dim, s.xg.data());
  s.gate_up.resize(slots * 2 * ff);
  s.h.resize(slots * ff);
  s.y.resize(slots * dim);
  for (int e = 0; e < n_exp; ++e) {
    const int m = start[e + 1] - start[e];
    if (m == 0) continue;
    const size_t o = start[e];
    float* gu = s.gate_up.data() + o * 2 * ff;  // [m, ff | ff]
    const MatmulTarget gate_up[] = {{moe.gate[e], gu, 2 * ff}, {moe.up[e], gu + ff, 2 * ff}};
    matmul(s.xg.data() + o * dim, m, dim, gate_up);
    const MatmulTarget down[] = {{moe.down[e], s.y.data() + o * dim, dim}};
    swiglu_matmul(gu, gu + ff, 2 * ff, s.h.data() + o * ff, m, ff, down);
  }
  // out[r] = sum_j w[r, j] · y[slot_of[r, j]], the j in routing order.
  pool_.parallel_for(n_rows, 4, [&](int64_t b, int64_t end) {
    for (int64_t r = b; r < end; ++r) {
      float* o = out + r * dim;
      std::fill(o, o + dim, 0.0f);
      for (int j = 0; j < k; ++j) {
        const float w = s.weight_of[r * k + j];
        const float* y = s.y.data() + static_cast<size_t>(s.slot_of[r * k + j]) * dim;
        for (int c = 0; c < dim; ++c) o[c] += w * y[c];
      }
    }
  });
}

}  // namespace tessera
