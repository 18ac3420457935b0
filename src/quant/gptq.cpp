// GPTQ on the CPU, in double precision. Rows of W are independent given U (the factor of the
// inverse Hessian is shared), so threads take rows; within a row chunk the columns go in blocks
// of `block`: the columns of a block are quantized one at a time, each one's scaled error
// subtracted from the rest of the block at once, and the rest of the row gets the block's
// errors in one product afterwards (the paper's "lazy batch" updates).
#include "quant/gptq.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"

namespace tessera {

namespace {

// In place: a = L with L·Lᵀ = a (lower; the upper triangle is left as it was). False when a
// is not positive definite.
bool cholesky_lower(std::vector<double>& a, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (int64_t k = 0; k < j; ++k) d -= a[j * n + k] * a[j * n + k];
    if (!(d > 0)) return false;
    const double l = std::sqrt(d);
    a[j * n + j] = l;
    for (int64_t i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      const double* ai = &a[i * n];
      const double* aj = &a[j * n];
      for (int64_t k = 0; k < j; ++k) s -= ai[k] * aj[k];
      a[i * n + j] = s / l;
    }
  }
  return true;
}

}  // namespace

GptqHessian gptq_prepare(const double* h_in, int64_t cols, double damp, bool act_order) {
  TESSERA_CHECK(cols > 0, "gptq: no columns");
  TESSERA_CHECK(damp >= 0 && damp < 1e3, "gptq: damp ", damp, " is not a fraction of the mean diagonal");
  GptqHessian g;
  g.cols = cols;
  const int64_t n = cols;
  std::vector<double> h(h_in, h_in + n * n);
  g.dead.assign(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i)
    if (h[i * n + i] == 0) g.dead[i] = 1, h[i * n + i] = 1;  // never active: its weights are zeroed
  g.order.resize(static_cast<size_t>(n));
  std::iota(g.order.begin(), g.order.end(), 0);
  if (act_order)
    std::stable_sort(g.order.begin(), g.order.end(), [&](int32_t a, int32_t b) { return h[a * n + a] > h[b * n + b]; });
  // Permuted, damped H: hp[i][j] = H[order[i]][order[j]] + λ δij.
  double mean_diag = 0;
  for (int64_t i = 0; i < n; ++i) mean_diag += h[i * n + i];
  mean_diag /= static_cast<double>(n);
  std::vector<double> a(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) a[i * n + j] = h[g.order[i] * n + g.order[j]];
  for (int64_t i = 0; i < n; ++i) a[i * n + i] += damp * mean_diag;
  TESSERA_CHECK(cholesky_lower(a, n), "gptq: H + ", damp,
                "·mean(diag H)·I is not positive definite; raise --damp or give more calibration tokens");
  // M = L⁻¹ (lower), by forward substitution column by column of the identity.
  std::vector<double> m(static_cast<size_t>(n * n), 0.0);
  // Row i of M: (e_i - Σ_{k<i} L[i][k]·M[k]) / L[i][i], rows added whole (contiguous).
  for (int64_t i = 0; i < n; ++i) {
    double* mi = &m[i * n];
    for (int64_t k = 0; k < i; ++k) {
      const double lik = a[i * n + k];
      const double* mk = &m[k * n];
      for (int64_t j = 0; j <= k; ++j) mi[j] -= lik * mk[j];
    }
    mi[i] = 1.0;
    for (int64_t j = 0; j <= i; ++j) mi[j] /= a[i * n + i];
  }
  // Hinv = Mᵀ·M; U = chol_lower(Hinv)ᵀ (upper, Hinv = Uᵀ·U).
  std::vector<double> hinv(static_cast<size_t>(n * n), 0.0);
  for (int64_t k = 0; k < n; ++k)
    for (int64_t i = 0; i <= k; ++i) {
      const double mki = m[k * n + i];
      if (mki == 0) continue;
      double* row = &hinv[i * n];
      const double* mk = &m[k * n];
      for (int64_t j = 0; j <= i; ++j) row[j] += mki * mk[j];  // lower triangle: j <= i <= k
    }
  TESSERA_CHECK(cholesky_lower(hinv, n), "gptq: the inverse Hessian is not positive definite; raise --damp");
  g.u.assign(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j <= i; ++j) g.u[j * n + i] = hinv[i * n + j];
  return g;
}

GptqResult gptq_quantize(const float* w, int64_t rows, int64_t cols, const GptqHessian& h, const GptqOptions& o,
                         int threads) {
  TESSERA_CHECK(h.cols == cols, "gptq: a Hessian of ", h.cols, " columns for a matrix of ", cols);
  const int64_t gs = o.group_size <= 0 ? cols : o.group_size;
  const GroupQuantLayout probe = GroupQuantLayout::make(o.bits, rows, cols, gs, false, false);
  if (const char* why = probe.valid_reason()) fail("gptq: ", why);
  TESSERA_CHECK(o.block >= 1, "gptq: block ", o.block);
  const int64_t n_groups = probe.n_groups, n = cols;
  GptqResult res;
  res.codes.assign(static_cast<size_t>(rows * cols), 0);
  res.dequantized.assign(static_cast<size_t>(rows * cols), 0.0f);
  std::vector<uint16_t> scales(static_cast<size_t>(n_groups * rows));
  std::vector<uint8_t> zeros(o.asymmetric ? static_cast<size_t>(n_groups * rows) : 0);
  const double* u = h.u.data();

  auto run_rows = [&](int64_t r0, int64_t r1) {
    const int64_t nr = r1 - r0;
    // wp: [nr][cols] the rows in processing order, updated in place; err: [nr][block]
    std::vector<double> wp(static_cast<size_t>(nr * n)), err(static_cast<size_t>(nr * o.block));
    std::vector<GroupGrid> grid(static_cast<size_t>(nr));
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t i = 0; i < n; ++i)
        wp[r * n + i] = h.dead[h.order[i]] ? 0.0 : static_cast<double>(w[(r0 + r) * cols + h.order[i]]);
    for (int64_t b0 = 0; b0 < n; b0 += o.block) {
      const int64_t b1 = std::min(n, b0 + o.block);
      for (int64_t i = b0; i < b1; ++i) {
        if (i % gs == 0)  // entering a group: its grid from the columns as they are now
          for (int64_t r = 0; r < nr; ++r) {
            double lo = 0, hi = 0;
            for (int64_t k = i; k < std::min(n, i + gs); ++k)
              lo = std::min(lo, wp[r * n + k]), hi = std::max(hi, wp[r * n + k]);
            grid[r] = group_grid(static_cast<float>(lo), static_cast<float>(hi), o.bits, o.asymmetric);
            scales[(i / gs) * rows + r0 + r] = grid[r].scale_f16;
            if (o.asymmetric) zeros[(i / gs) * rows + r0 + r] = static_cast<uint8_t>(grid[r].zero);
          }
        const double d = u[i * n + i];
        const double* ui = u + i * n;
        for (int64_t r = 0; r < nr; ++r) {
          double* wr = &wp[r * n];
          const GroupGrid& g = grid[r];
          const int q = std::clamp(static_cast<int>(std::nearbyint(wr[i] / static_cast<double>(g.scale))) + g.zero, 0,
                                   g.max_code);
          const double deq = static_cast<double>(g.value(q));  // exact: a small integer times an f16
          res.codes[(r0 + r) * cols + h.order[i]] = static_cast<uint8_t>(q);
          res.dequantized[(r0 + r) * cols + h.order[i]] = static_cast<float>(deq);
          const double e = (wr[i] - deq) / d;
          for (int64_t j = i + 1; j < b1; ++j) wr[j] -= e * ui[j];
          err[r * o.block + (i - b0)] = e;
        }
      }
      // The rest of the row takes the block's errors: W[:, b1:] -= Err · U[b0:b1, b1:].
      for (int64_t r = 0; r < nr; ++r) {
        double* wr = &wp[r * n];
        for (int64_t k = b0; k < b1; ++k) {
          const double e = err[r * o.block + (k - b0)];
          const double* uk = u + k * n;
          for (int64_t j = b1; j < n; ++j) wr[j] -= e * uk[j];
        }
      }
    }
  };
  ThreadPool pool(threads > 0 ? threads : ThreadPool::default_threads());
  pool.parallel_for(rows, 16, [&](int64_t r0, int64_t r1) { run_rows(r0, r1); });

  res.g_idx.resize(static_cast<size_t>(cols));
  for (int64_t i = 0; i < n; ++i) res.g_idx[h.order[i]] = static_cast<int32_t>(i / gs);
  bool identity = true;
  for (int64_t i = 0; i < n; ++i) identity = identity && h.order[i] == i;
  GroupQuantSource src;
  src.bits = o.bits;
  src.rows = rows;
  src.cols = cols;
  src.group_size = gs;
  src.codes = res.codes;
  src.scales_f16 = scales;
  src.zeros = zeros;
  if (!identity) src.g_idx = res.g_idx;
  res.matrix = build_group_quant(src, "gptq");
  return res;
}

}  // namespace tessera
