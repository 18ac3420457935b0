#include "engine/kv_calibration.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "engine/session.h"
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
  std::vector<int32_t> chunk(window);
  std::vector<uint8_t> host;
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
          }
        }
      }
    }
    seq.release_all(session.pool());
    r.tokens += window;
    ++r.windows;
  }
  return r;
}

KvScales kv_scales_from_stats(const KvStats& stats, const KvFormat& k_format, const KvFormat& v_format) {
  KvScales s;
  s.k = rows_for(stats.k, k_format);
  s.v = rows_for(stats.v, v_format);
  if (!k_format.centers_keys() || stats.tokens <= 0) return s;
  const double n = static_cast<double>(stats.tokens);
  const int hd = stats.head_dim;
  for (size_t l = 0; l < stats.k_sum.size(); ++l) {
    const auto& sum = stats.k_sum[l];
    std::vector<float> mean(sum.size()), equal(sum.size());
    for (size_t i = 0; i < sum.size(); ++i) mean[i] = static_cast<float>(sum[i] / n);
    // Equalization s_c = σ_c^(1/4), σ_c the channel's standard deviation around μ: the
    // minimiser of the score error (s_c² ∝ σ_c/ρ_c, ρ_c the query's RMS in the channel) for
    // queries with ρ_c ∝ sqrt(σ_c), between isotropic queries (sqrt(σ_c): better on Gemma 3,
    // worse than none on SmolLM2) and queries aligned with the keys (ρ ∝ σ: s = 1); chosen by
    // measurement, docs/design/kv-quant.md. Per head scaled to mean(s²) = 1; σ is floored at
    // 1e-3 of the head's mean σ so that a dead channel is not divided by ~0.
    for (size_t h = 0; h < sum.size() / hd; ++h) {
      std::vector<double> sd(hd);
      double mean_sd = 0;
      for (int c = 0; c < hd; ++c) {
        const size_t i = h * hd + c;
        const double m = sum[i] / n;
        sd[c] = std::sqrt(std::max(stats.k_sq[l][i] / n - m * m, 0.0));
        mean_sd += sd[c] / hd;
      }
      double ms = 0;
      for (int c = 0; c < hd; ++c) {
        sd[c] = mean_sd > 0 ? std::sqrt(std::sqrt(std::max(sd[c], 1e-3 * mean_sd))) : 1.0;
        ms += sd[c] * sd[c] / hd;
      }
      for (int c = 0; c < hd; ++c) equal[h * hd + c] = static_cast<float>(sd[c] / std::sqrt(ms));
    }
    s.k_mean.push_back(std::move(mean));
    s.k_equal.push_back(std::move(equal));
  }
  return s;
}

std::string kv_key_stats_table(const KvStats& stats) {
  std::string out =
      "layer  E|k|^2  |mu|^2/E|k|^2  top channel var/var  within-page var/var  equalization gain  first token\n";
  const double n = static_cast<double>(std::max<int64_t>(stats.tokens, 1));
  const int hd = stats.head_dim;
  for (size_t l = 0; l < stats.k_sum.size(); ++l) {
    double energy = 0, mean_energy = 0, var = 0, within = 0, top_var = 0, gain = 0, first = 0;
    const size_t n_heads = stats.k_sum[l].size() / hd;
    for (size_t h = 0; h < n_heads; ++h) {
      double v_h = 0, tv = 0, sum_sd = 0, f_h = 0;
      for (int c = 0; c < hd; ++c) {
        const size_t i = h * hd + c;
        const double m = stats.k_sum[l][i] / n, e = stats.k_sq[l][i] / n, v = std::max(e - m * m, 0.0);
        energy += e;
        mean_energy += m * m;
        v_h += v;
        within += stats.k_within[l][i] / n;
        tv = std::max(tv, v);
        sum_sd += std::sqrt(v);
        const double w = static_cast<double>(std::max(stats.windows, 1));  // E|k_0 − μ|² over windows
        f_h += stats.k_first_sq[l][i] / w - 2 * m * stats.k_first_sum[l][i] / w + m * m;
      }
      first += f_h / v_h;
      var += v_h;
      top_var += tv / v_h;
      gain += hd * v_h / (sum_sd * sum_sd);  // MSE ratio of equalizing by sqrt(sd), isotropic queries
    }
    char line[200];
    std::snprintf(line, sizeof line, "%5zu  %7.2f  %13.3f  %19.3f  %19.3f  %17.2f  %11.1f\n", l, energy / n_heads,
                  mean_energy / energy, top_var / n_heads, within / var, gain / n_heads, first / n_heads);
    out += line;
  }
  return out;
}

}  // namespace tessera
