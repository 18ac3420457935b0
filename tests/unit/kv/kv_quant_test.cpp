// Quantized KV formats (backend/kv_format.h, kv_codec.h) against float64 references: the
// names, page layouts, fp8 conversions, each codec's round trip on random and outlier-heavy
// rows, TurboQuant's rotation, codebooks and unbiased QJL estimate, and the CPU backend's
// fused attention over quantized pages (awkward lengths, partial blocks, GQA), including
// after block copies.
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

using namespace tessera;

namespace {

const char* const kAllFormats[] = {
    "f16",  "f32",      "fp8_e4m3", "fp8_e5m2",     "fp8_e4m3:head", "fp8_e4m3:token", "int8",       "int8:g16",
    "int4", "int4:g16", "int4:g32", "turbo2.5:qjl", "turbo3:qjl",    "turbo3.5:qjl",   "turbo4:qjl", "turbo3.5"};

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// Rows with a few large channels (as keys have) and an occasional huge token.
std::vector<float> outlier_rows(int n, int hd, std::mt19937& rng, bool spikes = true) {
  std::vector<float> v = randn(size_t(n) * hd, rng);
  for (int j = 0; j < n; ++j) {
    for (int c = 0; c < hd; c += 17) v[size_t(j) * hd + c] *= 12.0f;
    if (spikes && j % 11 == 3) v[size_t(j) * hd + (j % hd)] = 80.0f;
  }
  return v;
}

struct Page {
  KvFormat f;
  KvPageLayout l;
  int bs, hd;
  std::vector<float> consts;
  std::vector<uint8_t> bytes;
  Page(const std::string& name, bool key, int bs_, int hd_) : bs(bs_), hd(hd_) {
    f = parse_kv_format(name, key);
    check_kv_format(f, hd, bs);
    l = kv_page_layout(f, bs, hd);
    consts = make_kv_constants(f, 1, hd, 0, key, 7, {});
    bytes.assign(l.page_bytes, 0xAB);
  }
  KvHeadConstants c() const { return kv_head_constants(f, consts.data(), 1, hd, 0); }
  void encode(int offset, int n, const float* x) {
    std::vector<float> scratch(kv_encode_scratch_floats(hd));
    kv_encode_rows(f, l, hd, c(), bytes.data(), offset, n, x, hd, scratch.data());
  }
  // Decoded rows in the original basis (turbo rotated back).
  std::vector<float> decode(int n) const {
    std::vector<float> out(size_t(n) * hd);
    kv_decode_rows(f, l, hd, c(), bytes.data(), n, out.data());
    if (f.codec == KvCodec::Turbo)
      for (int j = 0; j < n; ++j) turbo_unrotate(out.data() + size_t(j) * hd, c().signs, hd);
    return out;
  }
};

double rel_rms(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += double(got[i] - ref[i]) * (got[i] - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace

TEST(KvFormat, NamesRoundTripAndBadNamesSayWhatIsAccepted) {
  for (const char* name : kAllFormats)
    for (bool key : {true, false}) {
      const KvFormat f = parse_kv_format(name, key);
      EXPECT_EQ(parse_kv_format(kv_format_name(f, key), key), f) << name;
    }
  EXPECT_EQ(parse_kv_format("auto", true), kv_format_of(DType::F16));
  EXPECT_EQ(kv_format_name(parse_kv_format("fp8", true)), "fp8_e4m3");
  // int4 defaults to KIVI: keys per channel, values per token in groups of 32.
  EXPECT_EQ(parse_kv_format("int4", true).scale, KvScale::Channel);
  EXPECT_EQ(kv_format_name(parse_kv_format("int4", false)), "int4:g32");
  // Turbo keys give every bit to the codes unless :qjl asks for the sketch (one bit of it).
  const KvFormat k35 = parse_kv_format("turbo3.5:qjl", true), v35 = parse_kv_format("turbo3.5:qjl", false);
  EXPECT_TRUE(k35.qjl);
  EXPECT_EQ(k35.bits_hi + k35.bits_lo, 5);
  EXPECT_EQ(v35.bits_hi + v35.bits_lo, 7);
  EXPECT_FALSE(v35.qjl);
  const KvFormat k35d = parse_kv_format("turbo3.5", true);
  EXPECT_FALSE(k35d.qjl);
  EXPECT_EQ(k35d.bits_hi + k35d.bits_lo, 7);
  EXPECT_EQ(parse_kv_format("turbo3.5:mse", true), k35d);
  EXPECT_EQ(kv_format_name(k35, true), "turbo3.5:qjl");
  EXPECT_EQ(kv_format_name(k35d, true), "turbo3.5");
  for (const char* bad : {"int3", "fp8:channel", "int8:g0", "int4:gx", "turbo5", "f16:head", ""}) {
    try {
      parse_kv_format(bad, true);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("KV cache format"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(check_kv_format(parse_kv_format("turbo3:qjl", true), 96, 16), Error);  // not a power of two
  EXPECT_THROW(check_kv_format(parse_kv_format("int8:g48", true), 64, 16), Error);
}

TEST(KvFormat, PageSizesCountScales) {
  const int bs = 16, hd = 64;
  EXPECT_EQ(kv_page_layout(parse_kv_format("f16", true), bs, hd).page_bytes, bs * hd * 2);
  EXPECT_EQ(kv_page_layout(parse_kv_format("fp8", true), bs, hd).page_bytes, bs * hd);
  EXPECT_EQ(kv_page_layout(parse_kv_format("int8", true), bs, hd).page_bytes, bs * hd + 2 * bs);
  EXPECT_EQ(kv_page_layout(parse_kv_format("int4:g32", true), bs, hd).page_bytes, bs * hd / 2 + 4 * bs * 2);
  EXPECT_EQ(kv_page_layout(parse_kv_format("int4", true), bs, hd).page_bytes, bs * hd / 2 + 4 * hd);
  // turbo3 values: 3 bits a channel + an f16 norm a token.
  EXPECT_EQ(kv_page_layout(parse_kv_format("turbo3:qjl", false), bs, hd).page_bytes, bs * hd * 3 / 8 + 2 * bs);
  // turbo3:qjl keys: 2 bits + 1 QJL bit a channel + two f16 norms a token.
  EXPECT_EQ(kv_page_layout(parse_kv_format("turbo3:qjl", true), bs, hd).page_bytes, bs * hd * 3 / 8 + 4 * bs);
  for (const char* name : kAllFormats) {
    EXPECT_EQ(kv_page_layout(parse_kv_format(name, true), bs, hd).page_bytes % 16, 0) << name;
  }
}

TEST(KvCodec, Fp8MatchesFloat64NearestEven) {
  for (KvCodec codec : {KvCodec::Fp8E4M3, KvCodec::Fp8E5M2}) {
    // Every finite code decodes and encodes back to itself.
    std::vector<double> finite;
    for (int v = 0; v < 256; ++v) {
      const float x = fp8_to_f32(uint8_t(v), codec);
      if (!std::isfinite(x)) continue;
      if (x != 0 || v == 0) {
        EXPECT_EQ(f32_to_fp8(x, codec), v) << v;
      }
      finite.push_back(x);
    }
    EXPECT_EQ(*std::max_element(finite.begin(), finite.end()), fp8_max(codec));
    // Random values go to the nearest representable value (saturating at the largest).
    std::mt19937 rng(3);
    std::uniform_real_distribution<double> mag(-12, 17);
    for (int i = 0; i < 20000; ++i) {
      const double x = (i % 2 ? -1 : 1) * std::exp2(mag(rng));
      const float got = fp8_to_f32(f32_to_fp8(float(x), codec), codec);
      double best = 1e300;
      for (double c : finite)
        best = std::min(best, std::fabs(c - std::clamp(x, -double(fp8_max(codec)), double(fp8_max(codec)))));
      EXPECT_LE(std::fabs(got - std::clamp(x, -double(fp8_max(codec)), double(fp8_max(codec)))),
                best * (1 + 1e-6) + 1e-30)
          << x;
    }
  }
}

TEST(KvCodec, RoundTripErrorWithinEachFormatsBound) {
  std::mt19937 rng(11);
  const int bs = 16, hd = 64;
  // Relative RMS error bounds per format, random rows and outlier-heavy rows.
  const std::vector<std::pair<std::string, double>> bounds = {
      {"f32", 1e-7},        {"f16", 1e-3},        {"fp8_e4m3:token", 0.04}, {"fp8_e5m2:token", 0.08},
      {"int8", 0.012},      {"int8:g16", 0.008},  {"int4:g16", 0.12},       {"int4:g32", 0.14},
      {"turbo4:qjl", 0.12}, {"turbo3:qjl", 0.22}, {"turbo2.5:qjl", 0.33}};
  for (const auto& [name, bound] : bounds)
    for (int kind = 0; kind < 2; ++kind) {
      const std::vector<float> x = kind == 0 ? randn(size_t(bs) * hd, rng) : outlier_rows(bs, hd, rng);
      Page p(name, false, bs, hd);
      p.encode(0, bs, x.data());
      const double err = rel_rms(p.decode(bs), x);
      EXPECT_LT(err, kind == 0 ? bound : 2 * bound) << name << (kind ? " outliers" : " random");
    }
}

TEST(KvCodec, IntegerCodesStayWithinHalfAStep) {
  std::mt19937 rng(12);
  const int bs = 8, hd = 32;
  const std::vector<float> x = outlier_rows(bs, hd, rng);
  for (const char* name : {"int8", "int8:g8", "int4:g8", "int4:g32"}) {
    Page p(name, false, bs, hd);
    p.encode(0, bs, x.data());
    const std::vector<float> y = p.decode(bs);
    const KvFormat f = p.f;
    const int g = f.scale == KvScale::Group ? f.group : hd;
    for (int j = 0; j < bs; ++j)
      for (int q = 0; q < hd / g; ++q) {
        double lo = 1e300, hi = -1e300, amax = 0;
        for (int c = q * g; c < (q + 1) * g; ++c) {
          lo = std::min<double>(lo, x[j * hd + c]);
          hi = std::max<double>(hi, x[j * hd + c]);
          amax = std::max<double>(amax, std::fabs(x[j * hd + c]));
        }
        // float64 step of the format, widened by the f16 rounding of the stored scale.
        const double step = f.codec == KvCodec::Int8 ? amax / 127 : (hi - lo) / 15;
        for (int c = q * g; c < (q + 1) * g; ++c)
          EXPECT_LE(std::fabs(y[j * hd + c] - x[j * hd + c]), 0.5 * step * 1.01 + 1e-3 * std::fabs(lo))
              << name << " token " << j << " channel " << c;
      }
  }
}

TEST(KvCodec, PerChannelInt4KeysWrittenTokenByTokenStayCloseToOneShot) {
  // KIVI keys: the page's per-channel range grows as decode writes tokens one at a time; the
  // earlier tokens are re-coded on the wider grid (one more rounding each time it widens), so a
  // page written token by token is within 1.5 steps of the final grid, one written at once
  // within half a step.
  std::mt19937 rng(13);
  const int bs = 16, hd = 64;
  const std::vector<float> x = outlier_rows(bs, hd, rng);
  Page once("int4", true, bs, hd), steps("int4", true, bs, hd);
  once.encode(0, bs, x.data());
  for (int j = 0; j < bs; ++j) steps.encode(j, 1, x.data() + size_t(j) * hd);
  const std::vector<float> a = once.decode(bs), b = steps.decode(bs);
  for (int c = 0; c < hd; ++c) {
    double lo = 1e300, hi = -1e300;
    for (int j = 0; j < bs; ++j) {
      lo = std::min<double>(lo, x[j * hd + c]);
      hi = std::max<double>(hi, x[j * hd + c]);
    }
    const double step = (hi - lo) / 15;
    for (int j = 0; j < bs; ++j) {
      EXPECT_LE(std::fabs(a[j * hd + c] - x[j * hd + c]), 0.51 * step + 1e-3) << c;
      EXPECT_LE(std::fabs(b[j * hd + c] - x[j * hd + c]), 1.5 * step + 1e-3) << c;
    }
  }
  EXPECT_LT(rel_rms(a, x), 0.1);
  EXPECT_LT(rel_rms(b, x), 0.15);
}

TEST(KvCodec, TurboRotationIsOrthonormalAndCodebooksAreLloydMax) {
  std::mt19937 rng(14);
  const int hd = 128;
  Page p("turbo3:qjl", false, 4, hd);
  const std::vector<float> x = randn(hd, rng);
  std::vector<float> y(hd);
  turbo_rotate(x.data(), p.c().signs, hd, y.data());
  double nx = 0, ny = 0;
  for (int i = 0; i < hd; ++i) {
    nx += double(x[i]) * x[i];
    ny += double(y[i]) * y[i];
  }
  EXPECT_NEAR(ny / nx, 1.0, 1e-5);
  turbo_unrotate(y.data(), p.c().signs, hd);
  for (int i = 0; i < hd; ++i) EXPECT_NEAR(y[i], x[i], 1e-5);
  // 1 bit: centroids ±E|t| = ±sqrt(2/pi) for a Gaussian; the sphere's marginal is close.
  const std::vector<double> c1 = turbo_codebook(1, hd);
  EXPECT_NEAR(c1[1], std::sqrt(2 / M_PI), 0.01);
  EXPECT_NEAR(c1[0], -c1[1], 1e-9);
  // The unit-variance MSE of b-bit Lloyd-Max quantizers of a Gaussian: 0.363, 0.118, 0.0345, 0.0095.
  const double known[] = {0.3634, 0.1175, 0.03454, 0.009497};
  std::normal_distribution<double> g;
  for (int bits = 1; bits <= 4; ++bits) {
    const std::vector<double> c = turbo_codebook(bits, 4096);
    double mse = 0;
    const int n = 200000;
    for (int i = 0; i < n; ++i) {
      const double t = g(rng);
      double best = 1e300;
      for (double v : c) best = std::min(best, (t - v) * (t - v));
      mse += best;
    }
    EXPECT_NEAR(mse / n, known[bits - 1], known[bits - 1] * 0.03) << bits << " bits";
  }
}

TEST(KvCodec, TurboKeysEstimateDotProductsWithoutBias) {
  // q·k from the MSE codes alone is biased (shrunk); adding the QJL term of the residual
  // removes the bias: over many keys the mean error is ~0 within its standard error.
  std::mt19937 rng(15);
  const int hd = 64, n = 4000;
  Page p("turbo2.5:qjl", true, 1, hd);
  const std::vector<float> q = randn(hd, rng);
  std::vector<float> qr(hd), sq(hd);
  turbo_rotate(q.data(), p.c().signs, hd, qr.data());
  for (int i = 0; i < hd; ++i) {
    double d = 0;
    for (int j = 0; j < hd; ++j) d += double(p.c().qjl[i * hd + j]) * qr[j];
    sq[i] = float(d);
  }
  double sum_mse = 0, sum_prod = 0, sq_prod = 0;
  std::vector<float> kf(hd), sgn(hd);
  float coef = 0;
  for (int t = 0; t < n; ++t) {
    std::vector<float> k = randn(hd, rng);
    for (int i = 0; i < hd; ++i) k[i] += 0.8f * q[i] / 8;  // correlated with q, so q·k is not ~0
    double truth = 0;
    for (int i = 0; i < hd; ++i) truth += double(q[i]) * k[i];
    p.encode(0, 1, k.data());
    kv_decode_rows(p.f, p.l, hd, p.c(), p.bytes.data(), 1, kf.data());
    kv_decode_qjl(p.l, hd, p.bytes.data(), 1, sgn.data(), &coef);
    double mse = 0, corr = 0;
    for (int i = 0; i < hd; ++i) {
      mse += double(qr[i]) * kf[i];
      corr += double(sq[i]) * sgn[i];
    }
    const double prod = mse + coef * corr;
    sum_mse += mse - truth;
    sum_prod += prod - truth;
    sq_prod += (prod - truth) * (prod - truth);
  }
  const double mean_prod = sum_prod / n, se = std::sqrt(sq_prod / n / n);
  EXPECT_LT(std::fabs(mean_prod), 3.5 * se) << "mean error " << mean_prod << " se " << se;
  EXPECT_GT(std::fabs(sum_mse / n), 5 * se) << "the MSE codes alone should be visibly biased here";
}

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
};

// R(p)·m for pairs (2i, 2i + 1) at frequencies freq (float, as the constants hold them).
std::vector<double> rope_rotate_f64(const std::vector<float>& m, const std::vector<float>& freq, int p) {
  std::vector<double> out(m.size());
  for (size_t i = 0; i < m.size() / 2; ++i) {
    const double a = double(p) * freq[i], c = std::cos(a), s = std::sin(a);
    out[2 * i] = c * m[2 * i] - s * m[2 * i + 1];
    out[2 * i + 1] = s * m[2 * i] + c * m[2 * i + 1];
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
  std::vector<float> freq(hd / 2);
  for (int i = 0; i < hd / 2; ++i) freq[i] = float(std::pow(10000.0, -2.0 * i / hd));
  auto rope_mean_at = [&](int kh, int p) {  // R(p)·m of head kh, [hd]
    return rope_rotate_f64(std::vector<float>(rope_m.begin() + kh * hd, rope_m.begin() + (kh + 1) * hd), freq, p);
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
  if (tc.center) spec.k_mean = {offset};
  if (tc.rope_center) {
    spec.k_mean = {rope_m};
    spec.k_rope_dim = hd;
    spec.k_rope_freq = {freq};
  }
  std::vector<float> equal(size_t(kvd), 1.0f);  // outlier_rows' channels c % 17 == 0 have σ 12
  for (int i = 0; i < kvd; ++i)
    if (tc.equalize && (i % hd) % 17 == 0) equal[i] = std::sqrt(12.0f);
  if (tc.equalize) spec.k_equal = {equal};
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
          const std::vector<double> rc = tc.rope_center ? rope_mean_at(kh, j) : std::vector<double>(hd, 0.0);
          for (int i = 0; i < hd; ++i)
            khat[size_t(j) * hd + i] =
                x[i] * equal[kh * hd + i] + (tc.center ? double(offset[kh * hd + i]) : 0.0) + rc[i];
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
            // position-aware centering: the pages hold k − R(j)·m; the kernel adds q·R(j)·m
            const std::vector<double> rc = tc.rope_center ? rope_mean_at(kh, j) : std::vector<double>(hd, 0.0);
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
    const double e_plain = check_quant_attention(plain, 300, false);
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
    const double e_plain = check_quant_attention(plain, 320, false);
    const double e_static = check_quant_attention(stat, 320, false);
    const double e_rope = check_quant_attention(rope, 320, false);
    EXPECT_LT(e_rope, 0.7 * e_static) << "static " << e_static;
    EXPECT_LT(e_rope, 1.3 * e_plain) << "no mean " << e_plain;
    QuantAttnCase both = rope;
    both.v_format = name;
    both.equalize = true;
    check_quant_attention(both, 321, true);
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

TEST(KvCodec, TurboScaleMakesTheCodesUnbiasedAlongTheVector) {
  // Lloyd–Max codes shrink a vector along itself by about (1 − D); the stored scale undoes
  // that (<ŷ, y> = |y|² up to the f16 rounding of the scale), except with QJL, which keeps
  // |y| and corrects the residual with its sketch.
  std::mt19937 rng(19);
  const int bs = 16, hd = 64;
  for (const char* name : {"turbo2.5", "turbo3", "turbo3.5", "turbo4", "turbo3:qjl"}) {
    for (bool key : {true, false}) {
      Page p(name, key, bs, hd);
      const std::vector<float> x = outlier_rows(bs, hd, rng);
      p.encode(0, bs, x.data());
      std::vector<float> dec(size_t(bs) * hd), y(hd);
      kv_decode_rows(p.f, p.l, hd, p.c(), p.bytes.data(), bs, dec.data());  // rotated basis
      for (int j = 0; j < bs; ++j) {
        turbo_rotate(x.data() + size_t(j) * hd, p.c().signs, hd, y.data());
        double along = 0, yy = 0;
        for (int i = 0; i < hd; ++i) {
          along += double(dec[size_t(j) * hd + i]) * y[i];
          yy += double(y[i]) * y[i];
        }
        if (p.f.qjl && key) {  // the stored scale is |y|
          uint16_t h;
          std::memcpy(&h, p.bytes.data() + p.l.meta_offset + 4 * j, 2);
          EXPECT_EQ(fp16_to_f32(h), fp16_to_f32(f32_to_fp16(float(std::sqrt(yy))))) << name << " token " << j;
        } else
          EXPECT_NEAR(along / yy, 1.0, 1e-3) << name << (key ? " K" : " V") << " token " << j;
      }
    }
  }
}

TEST(KvCodec, TurboKeysAreStoredCentered) {
  // Encoding x with key means μ writes exactly the bytes of encoding x − μ without them.
  std::mt19937 rng(17);
  const int bs = 16, hd = 64;
  for (const char* name : {"turbo3.5", "turbo3:qjl"}) {
    Page centered(name, true, bs, hd), plain(name, true, bs, hd);
    const std::vector<float> mean = randn(hd, rng, 3.0f);
    centered.consts = make_kv_constants(centered.f, 1, hd, 0, true, 7, {}, mean);
    std::vector<float> x = randn(size_t(bs) * hd, rng), xc(x.size());
    for (size_t i = 0; i < x.size(); ++i) xc[i] = x[i] - mean[i % hd];
    centered.encode(0, 5, x.data());
    centered.encode(5, bs - 5, x.data() + 5 * hd);
    plain.encode(0, bs, xc.data());
    EXPECT_EQ(centered.bytes, plain.bytes) << name;
  }
  // Means only for keys of a format that centers them, one per head and channel, finite.
  const KvFormat t = parse_kv_format("turbo3", true), i8 = parse_kv_format("int8", true);
  const std::vector<float> ok(2 * hd, 0.5f), short_row(hd, 0.5f);
  std::vector<float> nan_row = ok;
  nan_row[70] = NAN;
  EXPECT_EQ(make_kv_constants(t, 2, hd, 0, true, 7, {}, ok).size(), size_t(kv_constants_layout(t, 2, hd).total));
  auto expect_error = [&](const KvFormat& f, bool key, const std::vector<float>& m, const std::string& needle) {
    try {
      make_kv_constants(f, 2, hd, 3, key, 7, {}, m);
      ADD_FAILURE() << "accepted " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(t, false, ok, "means given for V");
  expect_error(i8, true, ok, "int8, which does not center");
  expect_error(t, true, short_row, "64 values for 2 KV heads x head_dim 64");
  expect_error(t, true, nan_row, "layer 3 head 1 channel 6 is nan");
}

TEST(CpuQuantAttention, KeysAndValuesMayDifferAndBlocksCopyWithTheirScales) {
  check_quant_attention({"int4", "int8", 16, 4, 2, 64, {{33, 1}, {7, 9}}, 0.17}, 200, false);
  check_quant_attention({"turbo3.5:qjl", "fp8_e4m3:token", 16, 4, 2, 64, {{20, 1}}, 0.35}, 201, false);
  // A block copy (copy-on-write, swap) moves pages with their scales: attention over the
  // copies is as right as over the originals.
  for (const char* name : {"int4", "int8:g16", "turbo3:qjl", "fp8_e5m2:token"})
    check_quant_attention({name, name, 8, 4, 2, 32, {{21, 1}, {9, 4}}, 0.85}, 202, true);
}

TEST(KvCache, QuantizedBlocksAreSmallerAndStaticScalesAreChecked) {
  CpuBackend be(1);
  KvCacheSpec spec = KvCacheSpec::plain(2, 2, 64, 16, 4, DType::F16);
  const int64_t f16 = spec.block_bytes();
  spec.k_format = spec.v_format = parse_kv_format("fp8", true);
  EXPECT_EQ(spec.block_bytes() * 2, f16);
  spec.k_format = parse_kv_format("turbo3.5", true);
  spec.v_format = parse_kv_format("turbo3.5", false);
  EXPECT_LT(spec.block_bytes() * 3.5, f16);
  EXPECT_EQ(spec.format_name(), "turbo3.5");
  spec.k_format = parse_kv_format("turbo3.5:qjl", true);
  EXPECT_EQ(spec.format_name(), "k=turbo3.5:qjl v=turbo3.5");
  // Static scales: one row per layer, each 1 or n_kv_heads values, only for static formats.
  spec.k_format = spec.v_format = parse_kv_format("fp8_e4m3:head", true);
  spec.k_scales = {{0.5f, 0.25f}, {1.0f}};
  spec.v_scales = {{2.0f}, {3.0f, 4.0f}};
  KvCache ok(be, spec);
  EXPECT_EQ(ok.layer(0).k_consts[1], 0.25f);
  EXPECT_EQ(ok.layer(1).v_consts[1], 4.0f);
  spec.k_scales = {{0.5f, 0.25f, 1.0f}, {1.0f}};
  EXPECT_THROW(KvCache(be, spec), Error);
  spec.k_scales = {{-1.0f}, {1.0f}};
  EXPECT_THROW(KvCache(be, spec), Error);
  spec.k_scales.clear();
  spec.k_format = spec.v_format = parse_kv_format("int8", true);
  EXPECT_THROW(KvCache(be, spec), Error);  // per-token scales: static ones make no sense
  spec.v_scales.clear();
  // Key means: one row per layer of n_kv_heads * head_dim values, for turbo keys only.
  spec.k_mean = {std::vector<float>(2 * 64, 1.0f), std::vector<float>(2 * 64, -1.0f)};
  EXPECT_THROW(KvCache(be, spec), Error);  // int8 keys are not centered
  spec.k_format = spec.v_format = parse_kv_format("turbo3", true);
  KvCache centered(be, spec);
  const KvConstantsLayout cl = kv_constants_layout(spec.k_format, 2, 64);
  EXPECT_EQ(centered.layer(1).k_consts[cl.mean + 5], -1.0f);
  EXPECT_EQ(centered.layer(1).v_consts[cl.mean + 5], 0.0f);  // values are not centered
  spec.k_mean.pop_back();
  EXPECT_THROW(KvCache(be, spec), Error);  // one row for two layers
  // Key equalization: beside the means, finite and > 0, folded into the query's signs (D∘s)
  // and the store's (D/s).
  spec.k_mean.push_back(std::vector<float>(2 * 64, -1.0f));
  spec.k_equal = {std::vector<float>(2 * 64, 2.0f), std::vector<float>(2 * 64, 0.5f)};
  KvCache equalized(be, spec);
  const float d = centered.layer(1).k_consts[cl.signs + 7];
  EXPECT_EQ(equalized.layer(1).k_consts[cl.signs + 7], d * 0.5f);
  EXPECT_EQ(equalized.layer(1).k_consts[cl.store_signs + 7], d / 0.5f);
  EXPECT_EQ(equalized.layer(1).v_consts[cl.store_signs + 7], equalized.layer(1).v_consts[cl.signs + 7]);
  spec.k_equal[1][3] = 0.0f;
  EXPECT_THROW(KvCache(be, spec), Error);
  spec.k_equal[1][3] = NAN;
  EXPECT_THROW(KvCache(be, spec), Error);
  spec.k_equal[1].pop_back();
  EXPECT_THROW(KvCache(be, spec), Error);  // n_kv_heads * head_dim values
  spec.k_equal.pop_back();
  EXPECT_THROW(KvCache(be, spec), Error);  // one row for two layers
  spec.k_equal = {std::vector<float>(2 * 64, 2.0f), std::vector<float>(2 * 64, 0.5f)};
  spec.k_mean.clear();
  EXPECT_THROW(KvCache(be, spec), Error);  // equalization without centering
}

TEST(KvCache, ConstantsDigestFollowsEveryStaticConstant) {
  // Part of the prefix-cache fingerprint: caches whose stores differ never share blocks.
  KvCacheSpec a = KvCacheSpec::plain(2, 2, 64, 16, 4, DType::F16);
  a.k_format = parse_kv_format("turbo3.5", true);
  a.v_format = parse_kv_format("turbo3.5", false);
  a.k_mean = {std::vector<float>(2 * 64, 1.0f), std::vector<float>(2 * 64, -1.0f)};
  KvCacheSpec b = a;
  EXPECT_EQ(a.constants_digest(), b.constants_digest());
  b.k_equal = {std::vector<float>(2 * 64, 1.0f), std::vector<float>(2 * 64, 1.0f)};
  EXPECT_NE(a.constants_digest(), b.constants_digest());
  KvCacheSpec c = b;
  c.k_equal[1][5] = 1.5f;
  EXPECT_NE(b.constants_digest(), c.constants_digest());
  c = a;
  c.k_mean[0][0] = 1.25f;
  EXPECT_NE(a.constants_digest(), c.constants_digest());
  c = a;
  c.v_scales = {{1.0f}, {1.0f}};
  EXPECT_NE(a.constants_digest(), c.constants_digest());
}
