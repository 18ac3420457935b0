// The CPU backend's fused attention over quantized KV pages against float64 references:
// every format at awkward lengths, partial blocks and GQA, chunked prefill and decode, after
// block copies; TurboQuant keys centered (static μ or position-aware R(p)·m) and equalized.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/kv_codec.h"
#include "core/error.h"
#include "kv/kv_cache.h"
#include "kv/kv_host_ops.h"
#include "model/model.h"

#include "kv_test_data.h"

using namespace tessera;

using tessera::test::outlier_rows;
using tessera::test::randn;
using tessera::test::rel_rms;

namespace {

struct QuantAttnCase {
  std::string k_format, v_format;
  int block_size, n_heads, n_kv_heads, head_dim;
  std::vector<std::pair<int, int>> seqs;  // tokens already stored, tokens of this step
  double max_err_vs_exact;                // relative RMS against attention over the unquantized K/V
  float key_offset = 0;                   // keys get a fixed per-channel offset of this scale ...
  bool center = false;                    // ... which the cache's calibrated key means remove
  bool equalize = false;                  // with center: keys equalized by s_c = sqrt(σ_c) (outlier_rows' σ)
  bool key_spikes = true;                 // outlier_rows' occasional token with one channel at 80
  // Keys get a RoPE-rotated mean R(p)·m (m per KV head of this scale, RoPE base 10000 over all
  // channels, pairs (2i, 2i + 1)), centered either statically (center: μ = the mean of R(p)·m
  // over the positions, what a calibration sees) or by position (rope_center: k − R(p)·m).
  float rope_offset = 0;
  bool rope_center = false;
  int rope_dim = 0;        // channels the RoPE turns (0: all); the rest keep m as it is
  bool rope_neox = false;  // pairs (i, i + rope_dim / 2) instead of (2i, 2i + 1)
  // The key at position 0 of every sequence gets one more offset of this scale (an attention
  // sink: far from the other keys' mean), and with first_center the cache's first-key center
  // (KvCacheSpec::k_first) is that key's mean: its own centering plus the sink.
  float sink = 0;
  bool first_center = false;
};

// R(p)·m for the pairs of the first `rot` channels ((2i, 2i + 1), or (i, i + rot/2) with neox)
// at frequencies freq (float, as the constants hold them); channels from rot on are copied.
std::vector<double> rope_rotate_f64(const std::vector<float>& m, const std::vector<float>& freq, int p, int rot,
                                    bool neox) {
  std::vector<double> out(m.begin(), m.end());
  for (int i = 0; i < rot / 2; ++i) {
    const int a = neox ? i : 2 * i, b = neox ? i + rot / 2 : 2 * i + 1;
    const double ang = double(p) * freq[i], c = std::cos(ang), s = std::sin(ang);
    out[a] = c * m[a] - s * m[b];
    out[b] = s * m[a] + c * m[b];
  }
  return out;
}

// Double-precision inverse rotation x = D·Hᵀ·y / sqrt(n) (D = ±1), with the Walsh–Hadamard
// matrix written out (H_ij = (−1)^popcount(i & j)), independent of the codec's fwht.
std::vector<double> unrotate_f64(const float* y, const std::vector<double>& d, int n) {
  std::vector<double> x(n, 0.0);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) x[i] += (std::popcount(unsigned(i & j)) % 2 ? -1.0 : 1.0) * y[j];
    x[i] *= d[i] / std::sqrt(double(n));
  }
  return x;
}

// Stores K/V through the backend in two batches (the past, then this step), runs attention,
// and compares against (a) float64 attention over the K/V decoded from the cache's own pages
// (checks the fused kernel: tight) and (b) float64 attention over the original K/V (the
// format's quality: loose). Turbo keys without QJL also against (c) float64 attention with
// the original queries over the keys decoded back to the model's basis, k̂ = s∘(Dᵀ Hᵀ ŷ) + μ:
// centering and equalization are exact up to the codes. Optionally copies every block to a
// fresh one first (CoW). Returns (b)'s error.
double check_quant_attention(const QuantAttnCase& tc, uint32_t seed, bool copy_blocks,
                             const cpu::OpsTable& ops = cpu::ops_table()) {
  SCOPED_TRACE(std::string("ops ") + ops.isa);
  std::mt19937 rng(seed);
  CpuBackend be(2, ops);
  const int hd = tc.head_dim, kvd = tc.n_kv_heads * hd, qd = tc.n_heads * hd, bs = tc.block_size;
  int total_blocks = 0;
  for (auto [past, add] : tc.seqs) total_blocks += (past + add + bs - 1) / bs;
  std::vector<int32_t> ids(2 * total_blocks + 3);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  KvCacheSpec spec = KvCacheSpec::plain(1, tc.n_kv_heads, hd, bs, int(ids.size()), DType::F16);
  spec.k_format = parse_kv_format(tc.k_format, true);
  spec.v_format = parse_kv_format(tc.v_format, false);
  // Keys as models have them: a mean per KV head and channel, larger than the spread.
  std::vector<float> offset =
      tc.key_offset > 0 ? randn(size_t(kvd), rng, tc.key_offset) : std::vector<float>(size_t(kvd), 0.0f);
  // RoPE-rotated means: m per KV head; the static μ averages R(p)·m over every stored position.
  const std::vector<float> rope_m = tc.rope_offset > 0 ? randn(size_t(kvd), rng, tc.rope_offset) : std::vector<float>();
  const int rot = tc.rope_dim > 0 ? tc.rope_dim : hd;
  std::vector<float> freq(rot / 2);
  for (int i = 0; i < rot / 2; ++i) freq[i] = float(std::pow(10000.0, -2.0 * i / rot));
  auto rope_mean_at = [&](int kh, int p) {  // R(p)·m of head kh, [hd]
    return rope_rotate_f64(std::vector<float>(rope_m.begin() + kh * hd, rope_m.begin() + (kh + 1) * hd), freq, p, rot,
                           tc.rope_neox);
  };
  if (!rope_m.empty() && tc.center) {
    int n_pos = 0, count = 0;
    for (auto [past, add] : tc.seqs) n_pos = std::max(n_pos, past + add);
    std::vector<double> acc(kvd, 0.0);
    for (auto [past, add] : tc.seqs)
      for (int p = 0; p < past + add; ++p, ++count)
        for (int kh = 0; kh < tc.n_kv_heads; ++kh) {
          const std::vector<double> r = rope_mean_at(kh, p);
          for (int i = 0; i < hd; ++i) acc[kh * hd + i] += r[i];
        }
    for (int i = 0; i < kvd; ++i) offset[i] += float(acc[i] / count);
  }
  const std::vector<float> sink =
      tc.sink > 0 ? randn(size_t(kvd), rng, tc.sink) : std::vector<float>(size_t(kvd), 0.0f);
  if (tc.center) spec.k_mean = {offset};
  if (tc.rope_center) {
    spec.k_mean = {rope_m};
    spec.k_rope_dim = rot;
    spec.k_rope_neox = tc.rope_neox;
    spec.k_rope_freq = {freq};
  }
  std::vector<float> equal(size_t(kvd), 1.0f);  // outlier_rows' channels c % 17 == 0 have σ 12
  for (int i = 0; i < kvd; ++i)
    if (tc.equalize && (i % hd) % 17 == 0) equal[i] = std::sqrt(12.0f);
  if (tc.equalize) spec.k_equal = {equal};
  // The center each key was stored relative to (position j of KV head kh), and the part of it
  // the softmax drops (static centering: the same μ for every key, never added back).
  auto center_at = [&](int kh, int j) {
    std::vector<double> c(hd, 0.0);
    if (tc.rope_center) c = rope_mean_at(kh, j);
    if (tc.center && !tc.rope_center)
      for (int i = 0; i < hd; ++i) c[i] = offset[kh * hd + i];
    if (tc.first_center && j == 0)
      for (int i = 0; i < hd; ++i) c[i] = (tc.rope_center ? rope_m[kh * hd + i] : c[i]) + sink[kh * hd + i];
    return c;
  };
  auto dropped_at = [&](int kh) {
    std::vector<double> c(hd, 0.0);
    if (tc.center && !tc.rope_center)
      for (int i = 0; i < hd; ++i) c[i] = offset[kh * hd + i];
    return c;
  };
  if (tc.first_center) {
    std::vector<float> first_row(static_cast<size_t>(kvd));
    for (int kh = 0; kh < tc.n_kv_heads; ++kh) {
      const std::vector<double> c = center_at(kh, 0);
      for (int i = 0; i < hd; ++i) first_row[kh * hd + i] = float(c[i]);
    }
    spec.k_first = {first_row};
  }
  KvCache kv(be, spec);
  const KvLayerView layer = kv.layer(0);
  std::vector<std::vector<float>> K(tc.seqs.size()), V(tc.seqs.size());
  std::vector<SequenceBlocks> seqs(tc.seqs.size());
  size_t next_id = 0;
  for (size_t s = 0; s < tc.seqs.size(); ++s) {
    const int n = tc.seqs[s].first + tc.seqs[s].second;
    K[s] = outlier_rows(n * tc.n_kv_heads, hd, rng, tc.key_spikes);
    for (size_t i = 0; i < K[s].size(); ++i) K[s][i] += offset[i % kvd] * (rope_m.empty() ? 1.0f : 0.0f);
    if (!rope_m.empty())
      for (int p = 0; p < n; ++p)
        for (int kh = 0; kh < tc.n_kv_heads; ++kh) {
          const std::vector<double> r = rope_mean_at(kh, p);
          for (int i = 0; i < hd; ++i) K[s][size_t(p) * kvd + kh * hd + i] += float(r[i]);
        }
    for (int i = 0; i < kvd; ++i) K[s][i] += sink[i];  // position 0
    V[s] = randn(size_t(n) * kvd, rng);
    for (int b = 0; b < (n + bs - 1) / bs; ++b) seqs[s].blocks.push_back(ids[next_id++]);
  }
  auto store = [&](bool past) {
    ForwardBatch fb;
    std::vector<float> k, v;
    for (size_t s = 0; s < tc.seqs.size(); ++s) {
      const int b = past ? 0 : tc.seqs[s].first, e = past ? tc.seqs[s].first : tc.seqs[s].first + tc.seqs[s].second;
      std::vector<int32_t> toks(e - b, 0);
      SequenceBlocks view = seqs[s];
      view.n_tokens = b;
      fb.add_sequence(view, bs, toks.data(), e - b, ForwardBatch::Logits::None);
      k.insert(k.end(), K[s].begin() + size_t(b) * kvd, K[s].begin() + size_t(e) * kvd);
      v.insert(v.end(), V[s].begin() + size_t(b) * kvd, V[s].begin() + size_t(e) * kvd);
    }
    if (fb.n_tokens() > 0) be.kv_store(layer, k.data(), kvd, v.data(), kvd, fb.attention_view());
    return fb;
  };
  store(true);
  if (copy_blocks) {  // every block to a fresh one; the sequences then read the copies
    std::vector<BlockCopy> copies;
    for (auto& sq : seqs)
      for (auto& b : sq.blocks) {
        copies.push_back({b, ids[next_id]});
        b = ids[next_id++];
      }
    copy_kv_blocks_host(kv, copies);
  }
  ForwardBatch fb = store(false);
  const int n = fb.n_tokens();
  const int ldq = qd + 3, ldo = qd + 5;
  auto q = randn(size_t(n) * ldq, rng);
  std::vector<float> out(size_t(n) * ldo, NAN);
  const float scale = 1.0f / std::sqrt(float(hd));
  be.attention(q.data(), ldq, layer, fb.attention_view(), tc.n_heads, scale, out.data(), ldo);

  // The cache's own view of each sequence's K/V, decoded page by page in float (what the
  // kernel must have used), and for turbo keys the QJL parts.
  const KvPageLayout kl = kv_page_layout(spec.k_format, bs, hd), vl = kv_page_layout(spec.v_format, bs, hd);
  const int group = tc.n_heads / tc.n_kv_heads;
  std::vector<float> got, ref_exact;
  std::vector<double> ref_pages, ref_model;
  const bool model_basis = spec.k_format.codec == KvCodec::Turbo && !spec.k_format.qjl;
  for (size_t s = 0; s < tc.seqs.size(); ++s) {
    const int n_tok = tc.seqs[s].first + tc.seqs[s].second;
    for (int kh = 0; kh < tc.n_kv_heads; ++kh) {
      const KvHeadConstants kc = kv_head_constants(spec.k_format, layer.k_consts, tc.n_kv_heads, hd, kh);
      const KvHeadConstants vc = kv_head_constants(spec.v_format, layer.v_consts, tc.n_kv_heads, hd, kh);
      std::vector<float> kd(size_t(n_tok) * hd), vd(size_t(n_tok) * hd), sg(size_t(n_tok) * hd), cf(n_tok, 0);
      for (int b = 0; b * bs < n_tok; ++b) {
        const int nk = std::min(bs, n_tok - b * bs);
        const int64_t page = int64_t(seqs[s].blocks[b]) * tc.n_kv_heads + kh;
        const auto* kp = static_cast<const uint8_t*>(layer.k) + page * layer.k_page_bytes;
        const auto* vp = static_cast<const uint8_t*>(layer.v) + page * layer.v_page_bytes;
        kv_decode_rows(spec.k_format, kl, hd, kc, kp, nk, kd.data() + size_t(b) * bs * hd);
        kv_decode_rows(spec.v_format, vl, hd, vc, vp, nk, vd.data() + size_t(b) * bs * hd);
        if (spec.k_format.qjl) kv_decode_qjl(kl, hd, kp, nk, sg.data() + size_t(b) * bs * hd, cf.data() + b * bs);
      }
      std::vector<double> khat(model_basis ? size_t(n_tok) * hd : 0);  // [n_tok, hd] keys in the model's basis
      if (model_basis) {
        std::vector<double> d(hd);  // D: the query-side signs are D∘s with s > 0
        for (int i = 0; i < hd; ++i) d[i] = kc.signs[i] > 0 ? 1.0 : -1.0;
        for (int j = 0; j < n_tok; ++j) {
          const std::vector<double> x = unrotate_f64(kd.data() + size_t(j) * hd, d, hd);
          const std::vector<double> c = center_at(kh, j);
          for (int i = 0; i < hd; ++i) khat[size_t(j) * hd + i] = x[i] * equal[kh * hd + i] + c[i];
        }
      }
      for (int t = fb.q_start[s]; t < fb.q_start[s + 1]; ++t) {
        const int pos = fb.positions[t];
        for (int g = 0; g < group; ++g) {
          const int h = kh * group + g;
          // Query in K's basis (turbo: rotated), and S·q' for the QJL term.
          std::vector<double> qv(hd), sq(hd, 0);
          std::vector<float> qf(hd), qrot(hd);
          for (int i = 0; i < hd; ++i) qf[i] = q[t * ldq + h * hd + i];
          if (spec.k_format.codec == KvCodec::Turbo) {
            turbo_rotate(qf.data(), kc.signs, hd, qrot.data());
            qf = qrot;
          }
          for (int i = 0; i < hd; ++i) qv[i] = qf[i];
          if (spec.k_format.qjl)
            for (int i = 0; i < hd; ++i)
              for (int j = 0; j < hd; ++j) sq[i] += double(kc.qjl[i * hd + j]) * qv[j];
          std::vector<double> sc(pos + 1), se(pos + 1), sm(pos + 1, 0.0);
          double mx = -1e300, mxe = -1e300, mxm = -1e300;
          for (int j = 0; j <= pos; ++j) {
            double d = 0, c = 0, e = 0, m = 0;
            // the pages hold k − center(j); the kernel adds q·center(j) back but for the part
            // every key shares (position-aware: q·R(j)·m; first key: q·first, less the static μ)
            std::vector<double> rc = center_at(kh, j);
            const std::vector<double> dropped = dropped_at(kh);
            for (int i = 0; i < hd; ++i) rc[i] -= dropped[i];
            for (int i = 0; i < hd; ++i) {
              const double qi = q[t * ldq + h * hd + i];
              d += qv[i] * kd[size_t(j) * hd + i] + qi * rc[i];
              c += sq[i] * sg[size_t(j) * hd + i];
              e += qi * K[s][size_t(j) * kvd + kh * hd + i];
              if (model_basis) m += qi * khat[size_t(j) * hd + i];
            }
            sc[j] = (d + cf[j] * c) * scale;
            se[j] = e * scale;
            sm[j] = m * scale;
            mx = std::max(mx, sc[j]);
            mxe = std::max(mxe, se[j]);
            mxm = std::max(mxm, sm[j]);
          }
          double sum = 0, sume = 0, summ = 0;
          for (int j = 0; j <= pos; ++j) {
            sum += (sc[j] = std::exp(sc[j] - mx));
            sume += (se[j] = std::exp(se[j] - mxe));
            summ += (sm[j] = std::exp(sm[j] - mxm));
          }
          std::vector<double> o(hd, 0), oe(hd, 0), om(hd, 0);
          for (int j = 0; j <= pos; ++j)
            for (int i = 0; i < hd; ++i) {
              o[i] += sc[j] * vd[size_t(j) * hd + i];
              oe[i] += se[j] * V[s][size_t(j) * kvd + kh * hd + i];
              om[i] += sm[j] * vd[size_t(j) * hd + i];
            }
          if (model_basis && spec.v_format.codec == KvCodec::Turbo) {
            std::vector<float> of(om.begin(), om.end());
            turbo_unrotate(of.data(), vc.signs, hd);
            om.assign(of.begin(), of.end());
          }
          if (model_basis)
            for (int i = 0; i < hd; ++i) ref_model.push_back(om[i] / summ);
          if (spec.v_format.codec == KvCodec::Turbo) {  // back from V's rotated basis
            std::vector<float> of(o.begin(), o.end());
            turbo_unrotate(of.data(), vc.signs, hd);
            o.assign(of.begin(), of.end());
          }
          for (int i = 0; i < hd; ++i) {
            ref_pages.push_back(o[i] / sum);
            ref_exact.push_back(float(oe[i] / sume));
            got.push_back(out[t * ldo + h * hd + i]);
          }
        }
      }
    }
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - ref_pages[i]) * (got[i] - ref_pages[i]);
    den += ref_pages[i] * ref_pages[i];
  }
  EXPECT_LT(std::sqrt(num / den), 2e-5) << tc.k_format << "/" << tc.v_format << ": fused kernel vs its own pages";
  if (model_basis) {
    num = den = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      num += (got[i] - ref_model[i]) * (got[i] - ref_model[i]);
      den += ref_model[i] * ref_model[i];
    }
    EXPECT_LT(std::sqrt(num / den), 2e-5)
        << tc.k_format << "/" << tc.v_format << ": fused kernel vs keys decoded to the model's basis";
  }
  const double err = rel_rms(got, ref_exact);
  EXPECT_LT(err, tc.max_err_vs_exact) << tc.k_format << "/" << tc.v_format << ": vs exact K/V";
  return err;
}

}  // namespace

TEST(CpuQuantAttention, EveryFormatPrefillAndDecodeMatchesFloat64) {
  // Bounds against the exact K/V: about 1.4x what these outlier-heavy keys give (measured:
  // fp8_e4m3 0.036-0.048, int8 0.025-0.030, int4 (KIVI) 0.08-0.11, turbo3.5 0.40-0.48 with
  // QJL and 0.24-0.26 without: the sketch's variance costs more than its bias removal here).
  const std::vector<std::pair<std::string, double>> formats = {
      {"f16", 1e-3},       {"fp8_e4m3", 0.07},     {"fp8_e5m2:token", 0.09}, {"fp8_e4m3:head", 0.06},
      {"int8", 0.045},     {"int8:g16", 0.03},     {"int4", 0.17},           {"int4:g16", 0.25},
      {"turbo4:qjl", 0.5}, {"turbo3.5:qjl", 0.65}, {"turbo3:qjl", 0.85},     {"turbo2.5:qjl", 0.95},
      {"turbo4", 0.27},    {"turbo3.5", 0.37},     {"turbo3", 0.47},         {"turbo2.5", 0.62}};
  // Every ISA path of the row kernels (the AVX2 one decodes pages with its own SIMD code).
  std::vector<const cpu::OpsTable*> paths{&cpu::ops_table_scalar()};
  if (const cpu::OpsTable* avx2 = cpu::ops_table_avx2()) paths.push_back(avx2);
  for (const cpu::OpsTable* ops : paths) {
    uint32_t seed = 100;
    for (const auto& [name, err] : formats) {
      // Prefill with a partial last block and GQA, chunked prefill continuing a stored past,
      // and decodes at block boundaries.
      check_quant_attention({name, name, 16, 6, 2, 64, {{0, 37}}, err}, seed++, false, *ops);
      check_quant_attention({name, name, 8, 4, 1, 32, {{19, 6}, {0, 1}, {15, 1}, {16, 1}, {40, 1}}, err}, seed++, false,
                            *ops);
    }
  }
}

TEST(CpuQuantAttention, CenteredTurboKeysLeaveTheSoftmaxUnchanged) {
  // Keys with a large per-channel mean (scale 4, against a spread of 1 with a few channels of
  // 12), stored centered (k − μ, μ the cache's key means): every score of a query shifts by
  // the same q·μ, so attention against the float64 reference over the *original* keys is as
  // close as for keys without a mean (and the fused kernel matches its own centered pages).
  for (const char* name : {"turbo3.5", "turbo2.5", "turbo4:qjl"}) {
    SCOPED_TRACE(name);
    const QuantAttnCase plain{name, "f16", 16, 4, 2, 64, {{0, 37}, {19, 6}}, 1.0};
    QuantAttnCase centered = plain;
    centered.key_offset = 4.0f;
    centered.center = true;
    const double e_plain = check_quant_attention(plain, 330, false);
    const double e_centered = check_quant_attention(centered, 300, false);
    EXPECT_LT(e_centered, 1.3 * e_plain) << e_plain;
  }
}

TEST(CpuQuantAttention, PositionAwareCenteringRemovesARopeRotatedMeanThatStaticCenteringMisses) {
  // Keys carry R(p)·m, a pre-RoPE mean m (scale 8 against a spread of 1) rotated by the key's
  // own position, as real keys do. A static μ (its mean over the positions) misses most of it
  // (the fast pairs average out), so TurboQuant codes it as spread; stored as k − R(p)·m with
  // q·R(p)·m added back per score, attention is exact up to the codes (float64 over the
  // decoded keys plus R(p)·m, checked inside) and as close to the exact keys as for keys
  // without any mean. Decodes, chunked prefill, GQA, partial blocks; also with turbo values and
  // block copies.
  for (const char* name : {"turbo3.5", "turbo2.5"}) {
    SCOPED_TRACE(name);
    QuantAttnCase plain{name, "f16", 16, 4, 2, 64, {{0, 37}, {19, 6}, {40, 1}}, 1.0};
    plain.key_spikes = false;
    QuantAttnCase stat = plain;
    stat.rope_offset = 8.0f;
    stat.center = true;
    QuantAttnCase rope = plain;
    rope.rope_offset = 8.0f;
    rope.rope_center = true;
    const double e_plain = check_quant_attention(plain, 330, false);
    const double e_static = check_quant_attention(stat, 320, false);
    const double e_rope = check_quant_attention(rope, 320, false);
    EXPECT_LT(e_rope, 0.7 * e_static) << "static " << e_static;
    EXPECT_LT(e_rope, 1.3 * e_plain) << "no mean " << e_plain;
    QuantAttnCase both = rope;
    both.v_format = name;
    both.equalize = true;
    check_quant_attention(both, 321, true);
    // NeoX pairs and a partial rotation (the channels past it keep a static mean).
    QuantAttnCase neox = rope;
    neox.rope_neox = true;
    EXPECT_LT(check_quant_attention(neox, 322, false), 0.7 * e_static);
    QuantAttnCase partial = neox;
    partial.rope_dim = 48;
    partial.first_center = true;
    partial.sink = 6.0f;
    check_quant_attention(partial, 323, true);
    partial.rope_neox = false;
    check_quant_attention(partial, 324, false);
  }
}

TEST(CpuQuantAttention, EqualizedTurboKeysAreExactUpToTheCodesAndCutTheError) {
  // Keys whose channels c % 17 == 0 have 12x the spread, centered and equalized by
  // s_c = sqrt(σ_c) (the optimum for these isotropic random queries): the fused attention
  // equals float64 attention over the decoded keys mapped back (s∘k̃ + μ; checked inside,
  // also with the 80-spike tokens), and without the
  // spikes the error against the exact keys drops, as the estimate hd·Σσ²/(Σσ)² (3.5x in
  // score MSE here) says it should. (A spike token's deviation sits in a quiet channel,
  // where equalization raises its error by |q∘s|²/|q|²: it pays only where the variance
  // really is in the loud channels.)
  for (const char* name : {"turbo3.5", "turbo2.5"}) {
    SCOPED_TRACE(name);
    QuantAttnCase centered{name, "f16", 16, 4, 2, 64, {{0, 37}, {19, 6}}, 1.0, 4.0f, true};
    centered.key_spikes = false;
    QuantAttnCase equalized = centered;
    equalized.equalize = true;
    const double e_centered = check_quant_attention(centered, 310, false);
    const double e_equalized = check_quant_attention(equalized, 310, false);
    EXPECT_LT(e_equalized, 0.8 * e_centered) << e_centered;
    QuantAttnCase both = equalized;  // turbo values too, spikes, and a copy of every block
    both.v_format = name;
    both.key_spikes = true;
    check_quant_attention(both, 311, true);
  }
}

TEST(CpuQuantAttention, KeysAndValuesMayDifferAndBlocksCopyWithTheirScales) {
  check_quant_attention({"int4", "int8", 16, 4, 2, 64, {{33, 1}, {7, 9}}, 0.17}, 200, false);
  check_quant_attention({"turbo3.5:qjl", "fp8_e4m3:token", 16, 4, 2, 64, {{20, 1}}, 0.35}, 201, false);
  // A block copy (copy-on-write, swap) moves pages with their scales: attention over the
  // copies is as right as over the originals.
  for (const char* name : {"int4", "int8:g16", "turbo3:qjl", "fp8_e5m2:token"})
    check_quant_attention({name, name, 8, 4, 2, 32, {{21, 1}, {9, 4}}, 0.85}, 202, true);
}

TEST(CpuQuantAttention, TheFirstKeysOwnCenterRemovesASinkThatTheMeanMisses) {
  // The key at position 0 carries a sink offset (scale 12 against a spread of 1) that the other
  // keys lack, as models' first keys do (docs/design/kv-quant.md, "The first key"). Centered
  // like the rest, TurboQuant spends that key's bits on the offset; centered on its own mean
  // (k_first) it is coded like any other key: attention is exact up to the codes (checked
  // inside, against float64 with the keys decoded back) and closer to the exact keys than
  // with the sink coded like the rest, and than without a sink at all (the sink key,
  // now nearly exact, takes much of the queries' weight). Static and position-aware centering, chunked prefill past position 0,
  // decodes, GQA, turbo values, block copies.
  for (const char* name : {"turbo3.5", "turbo2.5"}) {
    for (const bool rope : {false, true}) {
      SCOPED_TRACE(std::string(name) + (rope ? " position-aware" : " static"));
      QuantAttnCase plain{name, "f16", 16, 4, 2, 64, {{0, 37}, {19, 6}, {40, 1}}, 1.0};
      plain.key_spikes = false;
      plain.key_offset = rope ? 0.0f : 4.0f;
      plain.center = !rope;
      plain.rope_offset = rope ? 8.0f : 0.0f;
      plain.rope_center = rope;
      QuantAttnCase sunk = plain;
      sunk.sink = 12.0f;
      QuantAttnCase first = sunk;
      first.first_center = true;
      const double e_plain = check_quant_attention(plain, 330, false);
      const double e_sunk = check_quant_attention(sunk, 330, false);
      const double e_first = check_quant_attention(first, 330, false);
      // (seed 330: e_first / e_sunk 0.65-0.82, e_first / e_plain 0.72-0.85)
      EXPECT_LT(e_first, 0.9 * e_sunk) << "sink centered like the rest " << e_sunk;
      EXPECT_LT(e_first, 1.1 * e_plain) << "no sink " << e_plain;
      QuantAttnCase both = first;
      both.v_format = name;
      both.equalize = true;
      check_quant_attention(both, 331, true);
    }
  }
}
