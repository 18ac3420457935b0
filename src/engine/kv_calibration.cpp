#include "engine/kv_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "backend/query_observer.h"
#include "core/error.h"
#include "core/fp16.h"
#include "engine/session.h"
#include "model/arch/arch.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

namespace {

// Max |x| over a page's first n tokens (plain f16 / f32 rows of head_dim); with sum / sq /
// within (keys), also adds each channel's values, squares and squared deviations from the
// page's own channel mean; with first (a window's first page), token 0's values and squares.
float page_stats(const uint8_t* page, DType dtype, int n, int head_dim, double* sum, double* sq, double* within,
                 double* first_sum, double* first_sq) {
  float m = 0;
  std::vector<double> ps(sum ? head_dim : 0, 0.0), pq(ps);
  for (int64_t i = 0; i < static_cast<int64_t>(n) * head_dim; ++i) {
    float x;
    if (dtype == DType::F32) {
      std::memcpy(&x, page + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, page + 2 * i, 2);
      x = fp16_to_f32(h);
    }
    if (!std::isfinite(x)) continue;
    m = std::max(m, std::fabs(x));
    if (sum) {
      ps[i % head_dim] += x;
      pq[i % head_dim] += static_cast<double>(x) * x;
    }
    if (first_sum && i < head_dim) {
      first_sum[i] += x;
      first_sq[i] += static_cast<double>(x) * x;
    }
  }
  for (size_t c = 0; c < ps.size(); ++c) {
    sum[c] += ps[c];
    sq[c] += pq[c];
    within[c] += pq[c] - ps[c] * ps[c] / n;
  }
  return m;
}

std::vector<std::vector<float>> rows_for(const std::vector<std::vector<float>>& amax, const KvFormat& f) {
  std::vector<std::vector<float>> rows;
  if (!f.static_scale()) return rows;
  TESSERA_CHECK(f.is_fp8(), "KV calibration: static scales are for fp8 formats, not ", kv_format_name(f));
  for (const auto& heads : amax) {
    std::vector<float> r;
    const auto scale = [&](float a) { return a > 0 ? a / fp8_max(f.codec) : 1.0f; };
    if (f.scale == KvScale::Tensor)
      r.push_back(scale(*std::max_element(heads.begin(), heads.end())));
    else
      for (float a : heads) r.push_back(scale(a));
    rows.push_back(std::move(r));
  }
  return rows;
}

// E (k_c − m_c)² of channel i of layer l (a channel RoPE leaves alone).
double E2(const KvStats& st, size_t l, size_t i, double m) {
  const double n = static_cast<double>(st.tokens);
  return st.k_sq[l][i] / n - 2 * m * st.k_sum[l][i] / n + m * m;
}

// One stored key (row [hd], at the position whose cos/sin are cs) into the position-aware
// sums of layer l, head h (KvStats); head 0 also counts the position's angles.
void rope_key_stats(KvStats& r, int l, int h, const float* cs, const float* row) {
  const int hd = r.head_dim, half = r.rope_dim / 2;
  const size_t c0 = static_cast<size_t>(h) * hd;
  double* pre = r.k_pre_sum[l].data() + c0;
  double* kc = r.k_cos[l].data() + c0;
  double* ks = r.k_sin[l].data() + c0;
  for (int i = 0; i < half; ++i) {
    const int a = r.rope_neox ? i : 2 * i, b = r.rope_neox ? i + half : 2 * i + 1;
    const double c = cs[i], s = cs[half + i];
    pre[a] += c * row[a] + s * row[b];  // R(p)ᵀ k
    pre[b] += -s * row[a] + c * row[b];
    kc[a] += row[a] * c;
    kc[b] += row[b] * c;
    ks[a] += row[a] * s;
    ks[b] += row[b] * s;
    if (h == 0) {
      r.pos_cc[l][i] += c * c;
      r.pos_ss[l][i] += s * s;
      r.pos_sc[l][i] += s * c;
    }
  }
  for (int d = r.rope_dim; d < hd; ++d) pre[d] += row[d];
}

}  // namespace

KvStats measure_kv_stats(Session& session, std::span<const int32_t> tokens, int window, int max_chunks) {
  KvCache& kv = session.kv();
  const KvCacheSpec& spec = kv.spec();
  const DType dtype = spec.k_format == spec.v_format ? spec.k_format.plain_dtype() : DType::Unknown;
  TESSERA_CHECK(dtype != DType::Unknown, "KV calibration needs an f16 or f32 cache, not ", spec.format_name());
  TESSERA_CHECK(window >= 2 && window <= session.ctx(), "KV calibration window ", window, " is outside [2, ",
                session.ctx(), "]");
  int n_chunks = static_cast<int>(tokens.size() / window);
  TESSERA_CHECK(n_chunks >= 1, "KV calibration needs at least ", window, " tokens, the text has ", tokens.size());
  if (max_chunks > 0) n_chunks = std::min(n_chunks, max_chunks);
  session.provision_kv(window);
  const bool add_bos = session.has_tokenizer() && session.tokenizer().add_bos();
  const int bs = spec.block_size;

  KvStats r;
  r.k.assign(spec.n_layers, std::vector<float>(spec.n_kv_heads, 0.0f));
  r.v = r.k;
  r.head_dim = spec.head_dim;
  r.k_sum.assign(spec.n_layers, std::vector<double>(static_cast<size_t>(spec.n_kv_heads) * spec.head_dim, 0.0));
  r.k_sq = r.k_sum;
  r.k_within = r.k_sum;
  r.k_first_sum = r.k_sum;
  r.k_first_sq = r.k_sum;
  // The queries each layer's attention reads ([n_rows, n_heads * hd]), summed per KV head
  // over its group: ρ_c² = E q_c². Layers are told apart by their key storage.
  r.q_sq = r.k_sum;
  r.q_rows.assign(spec.n_layers, 0);
  std::vector<const void*> layer_keys(spec.n_layers);
  for (int l = 0; l < spec.n_layers; ++l) layer_keys[l] = kv.layer(l).k;
  const int hd = spec.head_dim;
  const bool observed = observe_queries(
      session.backend(), [&](const float* q, int64_t ldq, int n_rows, int n_heads, const KvLayerView& view) {
        const auto it = std::find(layer_keys.begin(), layer_keys.end(), view.k);
        if (it == layer_keys.end()) return;
        const size_t l = static_cast<size_t>(it - layer_keys.begin());
        const int group = n_heads / view.n_kv_heads;
        for (int i = 0; i < n_rows; ++i)
          for (int h = 0; h < n_heads; ++h)
            for (int c = 0; c < hd; ++c) {
              const double x = q[i * ldq + static_cast<int64_t>(h) * hd + c];
              r.q_sq[l][static_cast<size_t>(h / group) * hd + c] += x * x;
            }
        r.q_rows[l] += static_cast<int64_t>(n_rows) * group;
      });
  struct StopObserving {
    Backend& be;
    bool on;
    ~StopObserving() {
      if (on) observe_queries(be, nullptr);
    }
  } stop{session.backend(), observed};
  // Position-aware centering: each layer's RoPE, and cos/sin of its pairs at every window
  // position ([window][rope_dim]: cos then sin), to take the stored keys back before RoPE.
  std::vector<std::vector<float>> angles;
  if (session.config().rope_dim > 0) {
    r.rope_dim = session.config().rope_dim;
    r.rope_neox = session.config().rope_neox;
    const int half = r.rope_dim / 2;
    for (int l = 0; l < spec.n_layers; ++l) {
      const RopeConfig cfg = layer_rope_config(session.weights(), l);
      TESSERA_CHECK(cfg.rot_dim == r.rope_dim && cfg.neox == r.rope_neox, "KV calibration: layer ", l,
                    " rotates its keys differently from the model's RoPE dimension");
      std::vector<float> f(half);
      for (int i = 0; i < half; ++i) f[i] = static_cast<float>(rope_inv_freq(cfg, i, cfg.freq_factors));
      std::vector<float> t(static_cast<size_t>(window) * r.rope_dim);
      for (int p = 0; p < window; ++p)
        for (int i = 0; i < half; ++i) {
          const double a = static_cast<double>(p) * f[i];  // as the store computes it (kv_rope_angles)
          t[static_cast<size_t>(p) * r.rope_dim + i] = static_cast<float>(std::cos(a));
          t[static_cast<size_t>(p) * r.rope_dim + half + i] = static_cast<float>(std::sin(a));
        }
      r.rope_inv_freq.push_back(std::move(f));
      angles.push_back(std::move(t));
    }
    r.k_pre_sum = r.k_cos = r.k_sin = r.k_sum;
    r.pos_cc.assign(spec.n_layers, std::vector<double>(half, 0.0));
    r.pos_ss = r.pos_sc = r.pos_cc;
  }
  std::vector<int32_t> chunk(window);
  std::vector<uint8_t> host;
  std::vector<float> row(hd);
  std::vector<float> no_logits;  // feed() wants a buffer; Logits::None fills nothing
  for (int c = 0; c < n_chunks; ++c) {
    std::copy_n(tokens.begin() + static_cast<int64_t>(c) * window, window, chunk.begin());
    if (add_bos) chunk[0] = session.tokenizer().bos_id();
    SequenceBlocks seq;
    no_logits.clear();
    session.feed(seq, chunk, ForwardBatch::Logits::None, no_logits);
    session.backend().synchronize();
    // Read every layer's pages of this sequence back (a device cache through the backend).
    for (int l = 0; l < spec.n_layers; ++l) {
      const KvLayerView view = kv.layer(l);
      for (int part = 0; part < 2; ++part) {
        const int64_t page_bytes = part == 0 ? view.k_page_bytes : view.v_page_bytes;
        const auto* base = static_cast<const uint8_t*>(part == 0 ? view.k : view.v);
        auto& out = part == 0 ? r.k[l] : r.v[l];
        host.resize(static_cast<size_t>(page_bytes) * spec.n_kv_heads);
        for (size_t b = 0; b < seq.blocks.size(); ++b) {
          const int n = std::min<int>(bs, window - static_cast<int>(b) * bs);
          session.backend().copy_to_host(host.data(), base + seq.blocks[b] * page_bytes * spec.n_kv_heads, host.size());
          for (int h = 0; h < spec.n_kv_heads; ++h) {
            const int64_t c0 = static_cast<int64_t>(h) * spec.head_dim;
            double* sum = part == 0 ? r.k_sum[l].data() + c0 : nullptr;
            double* sq = part == 0 ? r.k_sq[l].data() + c0 : nullptr;
            double* within = part == 0 ? r.k_within[l].data() + c0 : nullptr;
            const bool first = part == 0 && b == 0;
            double* first_sum = first ? r.k_first_sum[l].data() + c0 : nullptr;
            double* first_sq = first ? r.k_first_sq[l].data() + c0 : nullptr;
            out[h] = std::max(out[h], page_stats(host.data() + h * page_bytes, dtype, n, spec.head_dim, sum, sq, within,
                                                 first_sum, first_sq));
            if (part == 0 && r.rope_dim > 0)
              for (int j = 0; j < n; ++j) {
                const uint8_t* src =
                    host.data() + h * page_bytes + static_cast<int64_t>(j) * hd * (dtype == DType::F32 ? 4 : 2);
                for (int c = 0; c < hd; ++c) {
                  if (dtype == DType::F32) {
                    std::memcpy(&row[c], src + 4 * c, 4);
                  } else {
                    uint16_t x;
                    std::memcpy(&x, src + 2 * c, 2);
                    row[c] = fp16_to_f32(x);
                  }
                }
                rope_key_stats(r, l, static_cast<int>(h), angles[l].data() + (b * bs + j) * r.rope_dim, row.data());
              }
          }
        }
      }
    }
    seq.release_all(session.pool());
    r.tokens += window;
    ++r.windows;
  }
  if (!observed) {
    r.q_sq.clear();
    r.q_rows.clear();
  }
  return r;
}

KvScales kv_scales_from_stats(const KvStats& stats, const KvFormat& k_format, const KvFormat& v_format) {
  KvScales s;
  s.k = rows_for(stats.k, k_format);
  s.v = rows_for(stats.v, v_format);
  if (!k_format.centers_keys() || stats.tokens <= 0) return s;
  TESSERA_CHECK(stats.q_sq.size() == stats.k_sum.size(), "KV calibration for ", kv_format_name(k_format),
                ": the key equalization needs the queries, which this backend does not show (calibrate on the "
                "CPU: --device cpu)");
  const double n = static_cast<double>(stats.tokens);
  const int hd = stats.head_dim;
  // Equalization s_c = sqrt(σ_c / ρ_c) from each channel's variance around the centering: the
  // score error of a key code, for TurboQuant's near-isotropic error, is ∝ (Σ σ_c²/s_c²)(Σ
  // ρ_c² s_c²), smallest (Cauchy–Schwarz) when σ_c/s_c ∝ ρ_c s_c (docs/design/kv-quant.md,
  // "Key equalization"). Per head scaled to mean(s²) = 1; σ and ρ are floored at 1e-3 of
  // their head's mean so that a dead channel (of keys or of queries) gets no extreme scale.
  const auto equalization = [&](size_t l, const std::vector<double>& var) {
    std::vector<float> equal(var.size());
    const double rows = static_cast<double>(std::max<int64_t>(stats.q_rows[l], 1));
    for (size_t h = 0; h < var.size() / hd; ++h) {
      std::vector<double> sd(hd), rho(hd);
      double mean_sd = 0, mean_rho = 0;
      for (int c = 0; c < hd; ++c) {
        const size_t i = h * hd + c;
        sd[c] = std::sqrt(std::max(var[i], 0.0));
        rho[c] = std::sqrt(stats.q_sq[l][i] / rows);
        mean_sd += sd[c] / hd;
        mean_rho += rho[c] / hd;
      }
      double ms = 0;
      for (int c = 0; c < hd; ++c) {
        sd[c] = mean_sd > 0 && mean_rho > 0
                    ? std::sqrt(std::max(sd[c], 1e-3 * mean_sd) / std::max(rho[c], 1e-3 * mean_rho))
                    : 1.0;
        ms += sd[c] * sd[c] / hd;
      }
      for (int c = 0; c < hd; ++c) equal[h * hd + c] = static_cast<float>(sd[c] / std::sqrt(ms));
    }
    return equal;
  };
  const int half = stats.rope_dim / 2;
  for (size_t l = 0; l < stats.k_sum.size(); ++l) {
    const auto& sum = stats.k_sum[l];
    std::vector<float> mean(sum.size());
    std::vector<double> var(sum.size());
    for (size_t i = 0; i < sum.size(); ++i) {
      mean[i] = static_cast<float>(sum[i] / n);
      var[i] = stats.k_sq[l][i] / n - (sum[i] / n) * (sum[i] / n);
    }
    s.k_mean.push_back(std::move(mean));
    s.k_equal.push_back(equalization(l, var));
    if (stats.windows > 0) {  // the first key of a window: the mean of those keys
      std::vector<float> first(sum.size());
      for (size_t i = 0; i < sum.size(); ++i) first[i] = static_cast<float>(stats.k_first_sum[l][i] / stats.windows);
      s.k_first.push_back(std::move(first));
    }
    if (stats.rope_dim == 0) continue;
    // Position-aware: m = E R(p)ᵀk, and E (k_c − (R(p)m)_c)² from the sums (pair channels a,
    // b: (R m)_a = cos φ m_a − sin φ m_b, (R m)_b = sin φ m_a + cos φ m_b).
    std::vector<float> pre(sum.size());
    for (size_t i = 0; i < sum.size(); ++i) pre[i] = static_cast<float>(stats.k_pre_sum[l][i] / n);
    for (size_t h = 0; h < sum.size() / hd; ++h) {
      const size_t c0 = h * hd;
      for (int i = 0; i < half; ++i) {
        const size_t a = c0 + (stats.rope_neox ? i : 2 * i), b = c0 + (stats.rope_neox ? i + half : 2 * i + 1);
        // The angle sums count each position once per window (head 0 only): per-token means.
        const double cc = stats.pos_cc[l][i] / n, ss = stats.pos_ss[l][i] / n, sc = stats.pos_sc[l][i] / n;
        const double ma = pre[a], mb = pre[b];
        const auto E = [&](const std::vector<double>& v, size_t c) { return v[c] / n; };
        var[a] = E(stats.k_sq[l], a) - 2 * (ma * E(stats.k_cos[l], a) - mb * E(stats.k_sin[l], a)) + ma * ma * cc +
                 mb * mb * ss - 2 * ma * mb * sc;
        var[b] = E(stats.k_sq[l], b) - 2 * (ma * E(stats.k_sin[l], b) + mb * E(stats.k_cos[l], b)) + ma * ma * ss +
                 mb * mb * cc + 2 * ma * mb * sc;
      }
      for (int c = stats.rope_dim; c < hd; ++c) var[c0 + c] = E2(stats, l, c0 + c, pre[c0 + c]);
    }
    s.rope_mean.push_back(std::move(pre));
    s.rope_equal.push_back(equalization(l, var));
    s.rope_inv_freq.push_back(stats.rope_inv_freq[l]);
  }
  if (stats.rope_dim > 0) {
    s.rope_dim = stats.rope_dim;
    s.rope_neox = stats.rope_neox;
  }
  return s;
}

std::string kv_key_stats_table(const KvStats& stats) {
  std::string out =
      "layer  E|k|^2  |mu|^2/E|k|^2  top channel var/var  within-page var/var  equalization gain  first token  "
      "first/own mean\n";
  const double n = static_cast<double>(std::max<int64_t>(stats.tokens, 1));
  const int hd = stats.head_dim;
  for (size_t l = 0; l < stats.k_sum.size(); ++l) {
    double energy = 0, mean_energy = 0, var = 0, within = 0, top_var = 0, gain = 0, first = 0, first_own = 0;
    const size_t n_heads = stats.k_sum[l].size() / hd;
    for (size_t h = 0; h < n_heads; ++h) {
      // with the queries' RMS ρ (1 when the backend did not show them): the equalization's
      // score-error ratio (Σσ²)(Σρ²)/(Σσρ)² (isotropic queries: hd·Σσ²/(Σσ)²)
      double v_h = 0, tv = 0, sum_sr = 0, q_h = 0, f_h = 0, o_h = 0;
      for (int c = 0; c < hd; ++c) {
        const size_t i = h * hd + c;
        const double m = stats.k_sum[l][i] / n, e = stats.k_sq[l][i] / n, v = std::max(e - m * m, 0.0);
        energy += e;
        mean_energy += m * m;
        v_h += v;
        within += stats.k_within[l][i] / n;
        tv = std::max(tv, v);
        const double rho2 = stats.q_sq.empty() ? 1.0 : stats.q_sq[l][i] / std::max<double>(stats.q_rows[l], 1);
        sum_sr += std::sqrt(v * rho2);
        q_h += rho2;
        const double w = static_cast<double>(std::max(stats.windows, 1));  // E|k_0 − μ|² over windows
        f_h += stats.k_first_sq[l][i] / w - 2 * m * stats.k_first_sum[l][i] / w + m * m;
        const double m0 = stats.k_first_sum[l][i] / w;  // E|k_0 − μ_0|²: around the first keys' own mean
        o_h += std::max(stats.k_first_sq[l][i] / w - m0 * m0, 0.0);
      }
      first += f_h / v_h;
      first_own += o_h / v_h;
      var += v_h;
      top_var += tv / v_h;
      gain += q_h * v_h / (sum_sr * sum_sr);
    }
    char line[220];
    std::snprintf(line, sizeof line, "%5zu  %7.2f  %13.3f  %19.3f  %19.3f  %17.2f  %11.1f  %14.2f\n", l,
                  energy / n_heads, mean_energy / energy, top_var / n_heads, within / var, gain / n_heads,
                  first / n_heads, first_own / n_heads);
    out += line;
  }
  return out;
}

}  // namespace tessera
