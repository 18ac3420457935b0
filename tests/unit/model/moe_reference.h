// Test helper: a mixture-of-experts FFN in float64 (Backend::moe_ffn's contract) and weights
// decoded from any stored format, the reference of every backend's moe_ffn.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/tensor.h"
#include "quant/fp8_weight.h"
#include "quant/group_quant.h"
#include "quant/quant.h"

namespace tessera::testing_util {

// One row x: out = sum over the top-k experts of w_k * down_k(silu(gate_k x) * up_k x), in
// float64. Matrices row-major f32 ([n_exp, dim] router; gate, up [ff, dim]; down [dim, ff]).
// *margin (when given) = p_k - p_(k+1), how far the choice of experts is from a tie (1 when
// every expert is chosen): rows closer than a backend's router error may route differently.
inline std::vector<double> moe_reference(const std::vector<float>& x, int dim, int ff, int n_exp, int k, bool renorm,
                                         const std::vector<float>& router, const std::vector<std::vector<float>>& gate,
                                         const std::vector<std::vector<float>>& up,
                                         const std::vector<std::vector<float>>& down, double* margin = nullptr) {
  std::vector<double> logits(n_exp), out(dim, 0.0);
  for (int e = 0; e < n_exp; ++e)
    for (int c = 0; c < dim; ++c) logits[e] += double(router[e * dim + c]) * x[c];
  const double mx = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (double& l : logits) sum += l = std::exp(l - mx);
  for (double& l : logits) l /= sum;
  std::vector<int> order(n_exp);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  if (margin) *margin = k < n_exp ? logits[order[k - 1]] - logits[order[k]] : 1.0;
  double chosen = 0;
  for (int j = 0; j < k; ++j) chosen += logits[order[j]];
  for (int j = 0; j < k; ++j) {
    const int e = order[j];
    const double w = logits[e] / (renorm ? chosen : 1.0);
    std::vector<double> h(ff);
    for (int f = 0; f < ff; ++f) {
      double g = 0, u = 0;
      for (int c = 0; c < dim; ++c) g += double(gate[e][f * dim + c]) * x[c], u += double(up[e][f * dim + c]) * x[c];
      h[f] = g / (1 + std::exp(-g)) * u;
    }
    for (int c = 0; c < dim; ++c) {
      double y = 0;
      for (int f = 0; f < ff; ++f) y += double(down[e][c * ff + f]) * h[f];
      out[c] += w * y;
    }
  }
  return out;
}

// m's values as f32, [rows][cols] (m in host memory, any stored format).
inline std::vector<float> decoded(const WeightMatrix& m) {
  std::vector<float> out(static_cast<size_t>(m.rows * m.cols));
  const auto* buf = static_cast<const uint8_t*>(m.data);
  for (int64_t r = 0; r < m.rows; ++r) {
    float* row = out.data() + r * m.cols;
    if (is_fp8_weight(m.dtype))
      fp8_dequantize_row(m.fp8_layout(), buf, r, row);
    else if (is_group_quant(m.dtype))
      gq_dequantize_row(m.gq_layout(), buf, r, row);
    else
      dequantize_row(m.dtype, buf + r * m.row_bytes(), row, m.cols);
  }
  return out;
}

}  // namespace tessera::testing_util
