// AWQ's two searches on the CPU. Every candidate is quantized with the same group grid as RTN
// and GPTQ (group_grid), so the methods differ only in the weights they round.
#include "quant/awq.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/group_quant.h"

namespace tessera {

namespace {

void check_options(const AwqOptions& o, int64_t cols) {
  TESSERA_CHECK(o.bits == 4 || o.bits == 8, "awq: bits ", o.bits, " (4 or 8)");
  TESSERA_CHECK(o.group_size == -1 || o.group_size == cols || (o.group_size >= 32 && o.group_size % 32 == 0),
                "awq: group size ", o.group_size, " (-1, or a multiple of 32)");
  TESSERA_CHECK(o.n_grid >= 1 && o.max_shrink >= 0 && o.max_shrink < 1, "awq: bad grid (", o.n_grid, ", ", o.max_shrink,
                ")");
}

int64_t group_of(const AwqOptions& o, int64_t cols) { return o.group_size <= 0 ? cols : o.group_size; }

}  // namespace

void awq_fake_quantize(const float* w, int64_t rows, int64_t cols, std::span<const float> s, const AwqOptions& o,
                       float* out) {
  const int64_t gs = group_of(o, cols);
  std::vector<float> ws(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) ws[k] = w[r * cols + k] * s[k];
    for (int64_t k0 = 0; k0 < cols; k0 += gs) {
      const int64_t k1 = std::min(cols, k0 + gs);
      float lo = 0, hi = 0;
      for (int64_t k = k0; k < k1; ++k) lo = std::min(lo, ws[k]), hi = std::max(hi, ws[k]);
      const GroupGrid g = group_grid(lo, hi, o.bits, o.asymmetric);
      for (int64_t k = k0; k < k1; ++k) out[r * cols + k] = g.value(g.code(ws[k])) / s[k];
    }
  }
}

AwqScales awq_search_scales(std::span<const AwqMatrix> mats, int64_t cols, const double* x_abs_mean,
                            const OutputError& err, const AwqOptions& o) {
  check_options(o, cols);
  AwqScales best;
  best.loss.assign(static_cast<size_t>(o.n_grid), 0.0);
  double best_loss = INFINITY;
  std::vector<float> s(static_cast<size_t>(cols)), q, d;
  for (int i = 0; i < o.n_grid; ++i) {
    const double alpha = static_cast<double>(i) / o.n_grid;
    // s = max(s_x^α, 1e-4), normalized so that max(s) · min(s) = 1 (llm-awq's auto_scale).
    std::vector<double> sd(static_cast<size_t>(cols));
    double lo = INFINITY, hi = 0;
    for (int64_t k = 0; k < cols; ++k) {
      sd[k] = std::max(std::pow(x_abs_mean[k], alpha), 1e-4);
      lo = std::min(lo, sd[k]), hi = std::max(hi, sd[k]);
    }
    const double norm = std::sqrt(hi * lo);
    for (int64_t k = 0; k < cols; ++k) s[k] = static_cast<float>(sd[k] / norm);
    double loss = 0;
    for (const AwqMatrix& m : mats) {
      q.resize(static_cast<size_t>(m.rows * cols));
      d.resize(q.size());
      awq_fake_quantize(m.w, m.rows, cols, s, o, q.data());
      for (size_t j = 0; j < q.size(); ++j) d[j] = q[j] - m.w[j];
      loss += err(d.data(), m.rows);
    }
    best.loss[i] = loss;
    if (loss < best_loss) best_loss = loss, best.alpha = alpha, best.s = s;
  }
  TESSERA_CHECK(std::isfinite(best_loss), "awq: the scale search found no finite loss (non-finite activations?)");
  return best;
}

std::vector<uint8_t> awq_clip(float* w, int64_t rows, int64_t cols, const double* h, const AwqOptions& o, int threads) {
  check_options(o, cols);
  const int64_t gs = group_of(o, cols), n_groups = (cols + gs - 1) / gs;
  const int n_shrink = static_cast<int>(o.max_shrink * o.n_grid);
  std::vector<uint8_t> chosen(static_cast<size_t>(rows * n_groups), 0);
  if (n_shrink <= 1) return chosen;
  ThreadPool pool(threads > 0 ? threads : ThreadPool::default_threads());
  pool.parallel_for(rows, 8, [&](int64_t r0, int64_t r1) {
    std::vector<double> delta(static_cast<size_t>(gs));
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t g = 0; g < n_groups; ++g) {
        const int64_t k0 = g * gs, k1 = std::min(cols, k0 + gs), len = k1 - k0;
        float* wg = w + r * cols + k0;
        float lo = 0, hi = 0, amax = 0;
        for (int64_t k = 0; k < len; ++k) {
          lo = std::min(lo, wg[k]), hi = std::max(hi, wg[k]);
          amax = std::max(amax, std::fabs(wg[k]));
        }
        double best = INFINITY;
        int best_i = 0;
        for (int i = 0; i < n_shrink; ++i) {
          const float mv = amax * static_cast<float>(1.0 - static_cast<double>(i) / o.n_grid);
          const GroupGrid grid = group_grid(std::max(lo, -mv), std::min(hi, mv), o.bits, o.asymmetric);
          for (int64_t k = 0; k < len; ++k) {
            const float c = std::clamp(wg[k], -mv, mv);
            delta[k] = static_cast<double>(grid.value(grid.code(c))) - wg[k];
          }
          double e = 0;  // δᵀ · H_gg · δ
          for (int64_t a = 0; a < len; ++a) {
            const double* ha = h + (k0 + a) * cols + k0;
            double t = 0;
            for (int64_t b = 0; b < len; ++b) t += ha[b] * delta[b];
            e += delta[a] * t;
          }
          if (e < best) best = e, best_i = i;
        }
        chosen[r * n_groups + g] = static_cast<uint8_t>(best_i);
        const float mv = amax * static_cast<float>(1.0 - static_cast<double>(best_i) / o.n_grid);
        for (int64_t k = 0; k < len; ++k) wg[k] = std::clamp(wg[k], -mv, mv);
      }
  });
  return chosen;
}

}  // namespace tessera
