// Quantized KV formats (backend/kv_format.h, kv_codec.h) against float64 references: the
// names, page layouts, fp8 conversions, each codec's round trip on random and outlier-heavy
// rows, TurboQuant's rotation, codebooks, unbiased scale and QJL estimate, centering, and the
// cache's constants (the fused attention: kv_quant_attention_test.cpp).
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

const char* const kAllFormats[] = {
    "f16",  "f32",      "fp8_e4m3", "fp8_e5m2",     "fp8_e4m3:head", "fp8_e4m3:token", "int8",       "int8:g16",
    "int4", "int4:g16", "int4:g32", "turbo2.5:qjl", "turbo3:qjl",    "turbo3.5:qjl",   "turbo4:qjl", "turbo3.5"};

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
  void encode(int offset, int n, const float* x, const int32_t* positions = nullptr) {
    std::vector<float> scratch(kv_encode_scratch_floats(hd));
    kv_encode_rows(f, l, hd, c(), bytes.data(), offset, n, x, hd, scratch.data(), positions);
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

// Position-aware centering's RoPE: an even dimension within head_dim and at most 256 (the CPU
// attention's per-call tables), one frequency per pair, each finite; errors name the layer.
TEST(KvCodec, PositionAwareCenteringRopeIsChecked) {
  const KvFormat t = parse_kv_format("turbo3", true);
  const auto error_of = [&](int hd, int rot, size_t n_freq) -> std::string {
    const std::vector<float> mean(size_t(hd), 0.5f), freq(n_freq, 0.01f);
    try {
      make_kv_constants(t, 1, hd, 2, true, 7, {}, mean, {}, {rot, false, freq, {}});
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of(64, 64, 32), "");
  EXPECT_EQ(error_of(512, 256, 128), "");
  EXPECT_NE(error_of(64, 63, 31).find("layer 2: RoPE dimension 63 is not even"), std::string::npos);
  EXPECT_NE(error_of(64, 128, 64).find("exceeds head_dim 64 or 256"), std::string::npos);
  EXPECT_NE(error_of(512, 512, 256).find("RoPE dimension 512"), std::string::npos);
  EXPECT_NE(error_of(64, 64, 16).find("16 RoPE frequencies for RoPE dimension 64"), std::string::npos);
}

TEST(KvCodec, TheFirstKeyIsStoredAroundItsOwnCenter) {
  // With a first-key center f beside the means μ, the key at position 0 is encoded exactly as
  // x − f would be without centering, every other key as x − μ; a position-less store of such
  // keys is refused.
  std::mt19937 rng(19);
  const int bs = 16, hd = 64;
  for (const char* name : {"turbo3.5", "turbo2.5:qjl"}) {
    Page centered(name, true, bs, hd), plain(name, true, bs, hd);
    const std::vector<float> mean = randn(hd, rng, 3.0f), first = randn(hd, rng, 12.0f);
    centered.consts = make_kv_constants(centered.f, 1, hd, 0, true, 7, {}, mean, {}, {0, false, {}, first});
    ASSERT_NE(centered.c().first, nullptr);
    std::vector<float> x = randn(size_t(bs) * hd, rng), xc(x.size());
    for (size_t i = 0; i < x.size(); ++i) xc[i] = x[i] - (i < size_t(hd) ? first[i] : mean[i % hd]);
    std::vector<int32_t> pos(bs);
    std::iota(pos.begin(), pos.end(), 0);
    centered.encode(0, 3, x.data(), pos.data());
    centered.encode(3, bs - 3, x.data() + 3 * hd, pos.data() + 3);
    plain.encode(0, bs, xc.data());
    EXPECT_EQ(centered.bytes, plain.bytes) << name;
    EXPECT_THROW(centered.encode(0, 1, x.data()), Error);
  }
  const KvFormat t = parse_kv_format("turbo3", true);
  const std::vector<float> ok(2 * hd, 0.5f), short_row(hd, 0.5f);
  std::vector<float> nan_row = ok;
  nan_row[3] = NAN;
  EXPECT_EQ(make_kv_constants(t, 2, hd, 0, true, 7, {}, ok).size(),
            make_kv_constants(t, 2, hd, 0, true, 7, {}, ok, {}, {0, false, {}, ok}).size());
  auto expect_error = [&](bool key, const std::vector<float>& mean, const std::vector<float>& first,
                          const std::string& needle) {
    try {
      make_kv_constants(t, 2, hd, 4, key, 7, {}, mean, {}, {0, false, {}, first});
      ADD_FAILURE() << "accepted " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(true, {}, ok, "first-key center of layer 4 needs the key means");
  expect_error(false, {}, ok, "needs the key means");
  expect_error(true, ok, short_row, "64 values for 2 KV heads x head_dim 64");
  expect_error(true, ok, nan_row, "layer 4 head 0 channel 3 is nan");
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
