// Properties of the codecs checked in float64, independent of GGML: the round-trip error of
// every block stays within the format's step size, side fields (Q8_1's s, Q8_K's bsums) hold
// what they claim, the K-quant scale packing matches its documented layout, and bad calls
// throw.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/quant.h"
#include "quant_test_util.h"

namespace tessera {
namespace {

using namespace quant_test;

// Largest absolute error of rounding v to fp16 (half an ulp; subnormal spacing is 2^-24).
double fp16_rounding(double v) { return std::max(std::fabs(v) * 0x1p-11, 0x1p-25); }

struct Stats {
  double min = 0, max = 0, amax = 0;
};

Stats stats_of(const float* x, int64_t n) {
  Stats s{x[0], x[0], 0};
  for (int64_t i = 0; i < n; ++i) {
    s.min = std::min<double>(s.min, x[i]);
    s.max = std::max<double>(s.max, x[i]);
    s.amax = std::max<double>(s.amax, std::fabs(x[i]));
  }
  return s;
}

// Bound on |x - dequantize(quantize(x))| over one block of the format, from the block's
// values alone. `slack` covers f32 rounding inside the quantizer (relative 2^-24 per step).
using BlockBound = std::function<double(const float* x)>;

double slack(const Stats& s) { return 1e-6 * s.amax; }

// Symmetric formats whose extreme maps exactly and whose opposite extreme may clamp one
// level short (Q4_0: +8 -> 7, Q5_0: +16 -> 15): one step. fp16 d moves level q by q*err(d).
BlockBound symmetric_clamped(int levels_per_side) {
  return [levels_per_side](const float* x) {
    const Stats s = stats_of(x, 32);
    const double step = s.amax / levels_per_side;
    return step + levels_per_side * fp16_rounding(step) + slack(s);
  };
}

// Q8_0 / Q8_1: amax maps to +-127, every value rounds to nearest: half a step.
BlockBound symmetric_rounded() {
  return [](const float* x) {
    const Stats s = stats_of(x, 32);
    const double step = s.amax / 127;
    return 0.5 * step + 127 * fp16_rounding(step) + slack(s);
  };
}

// Q4_1 / Q5_1: [min, max] in nmax steps, rounded to nearest; m = fp16(min).
BlockBound affine_rounded(int nmax) {
  return [nmax](const float* x) {
    const Stats s = stats_of(x, 32);
    const double step = (s.max - s.min) / nmax;
    return 0.5 * step + nmax * fp16_rounding(step) + fp16_rounding(s.min) + slack(s);
  };
}

// K-quants: each sub-block gets its own scale (and min), themselves rounded to 6 or 8 bits
// against the super-block's fp16 scales, and the search may clip a sub-block's extremes by
// about a level. With step_j = range_j / nmax (range including 0 where the format clamps
// the min to <= 0), D = max step_j / scale_levels the resolution of the sub-block scales and
// M = max offset / 63 that of the mins, the error is at most
//   max step_j                      one level: rounding plus the search's clipping
// + nmax * D / 2                    a sub-block scale rounded down shrinks its grid
// + M / 2                           a rounded min shifts its grid
// + fp16 rounding of D and M times their largest multipliers.
BlockBound k_quant(int sub_size, int nmax, bool with_min, int scale_levels) {
  return [=](const float* x) {
    double max_step = 0, max_offset = 0;
    for (int j = 0; j < kQK_K; j += sub_size) {
      const Stats s = stats_of(x + j, sub_size);
      const double range = with_min ? s.max - std::min(0.0, s.min) : s.amax;
      max_step = std::max(max_step, range / nmax);
      if (with_min) max_offset = std::max(max_offset, -std::min(0.0, s.min));
    }
    const double D = max_step / scale_levels, M = max_offset / 63;
    return max_step + 0.5 * nmax * D + 0.5 * M + scale_levels * nmax * fp16_rounding(D) +
           (with_min ? 63 * fp16_rounding(M) : 0.0) + slack(stats_of(x, kQK_K));
  };
}

// Q8_K: amax maps to +-127 with an f32 scale: half a step (plus f32 rounding of d * q).
BlockBound q8_k_bound() {
  return [](const float* x) {
    const Stats s = stats_of(x, kQK_K);
    const double step = s.amax / 127;
    return 0.5 * step + slack(s);
  };
}

struct FormatCase {
  DType type;
  BlockBound bound;
};

std::vector<FormatCase> block_formats() {
  return {
      {DType::Q4_0, symmetric_clamped(8)},        {DType::Q4_1, affine_rounded(15)},
      {DType::Q5_0, symmetric_clamped(16)},       {DType::Q5_1, affine_rounded(31)},
      {DType::Q8_0, symmetric_rounded()},         {DType::Q8_1, symmetric_rounded()},
      {DType::Q4_K, k_quant(32, 15, true, 63)},   {DType::Q5_K, k_quant(32, 31, true, 63)},
      {DType::Q6_K, k_quant(16, 32, false, 128)}, {DType::Q8_K, q8_k_bound()},
  };
}

// Rows of 7 super-blocks (1792 values) in shapes that stress different parts of the
// quantizers: plain Gaussian, per-sub-block scales over 6 decades, offsets, heavy tails,
// sparse outliers, one-signed data, ramps, constants and zeros.
std::vector<std::pair<std::string, std::vector<float>>> test_rows() {
  constexpr int n = 7 * kQK_K;
  std::mt19937_64 rng(1234567);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<std::pair<std::string, std::vector<float>>> rows;
  auto add = [&](const std::string& name, const std::function<double(int)>& f) {
    std::vector<float> v(n);
    for (int i = 0; i < n; ++i) v[i] = static_cast<float>(f(i));
    rows.emplace_back(name, std::move(v));
  };
  std::vector<double> sub_scale(n / 16), sub_offset(n / 16);
  for (auto& s : sub_scale) s = std::pow(10.0, 3.0 * uniform(rng));
  for (auto& o : sub_offset) o = 4.0 * uniform(rng);
  add("gaussian", [&](int) { return normal(rng); });
  add("small_weights", [&](int) { return 0.02 * normal(rng); });
  add("sub_block_scales", [&](int i) { return sub_scale[i / 16] * normal(rng); });
  add("sub_block_offsets", [&](int i) { return sub_offset[i / 32] + 0.2 * normal(rng); });
  add("heavy_tails", [&](int) { return normal(rng) / std::max(0.05, std::fabs(uniform(rng))); });
  add("sparse_outliers", [&](int) { return uniform(rng) > 0.98 ? 50.0 * uniform(rng) : 0.01 * normal(rng); });
  add("positive", [&](int) { return 3.0 + std::fabs(normal(rng)); });
  add("negative", [&](int) { return -0.5 - std::fabs(normal(rng)); });
  add("uniform", [&](int) { return uniform(rng); });
  add("ramp", [&](int i) { return -1.0 + 2.0 * i / n; });
  add("constant", [&](int) { return -1.75; });
  add("zeros", [&](int) { return 0.0; });
  add("tiny", [&](int) { return 1e-6 * normal(rng); });
  add("large", [&](int) { return 300.0 * normal(rng); });
  return rows;
}

TEST(QuantProperty, RoundTripErrorOfEveryBlockIsWithinTheFormatStep) {
  const auto rows = test_rows();
  for (const FormatCase& f : block_formats()) {
    const int64_t block = dtype_traits(f.type).block_elems;
    for (const auto& [name, x] : rows) {
      const auto n = static_cast<int64_t>(x.size());
      std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(f.type, n)));
      std::vector<float> y(x.size());
      quantize_row(f.type, x.data(), q.data(), n);
      dequantize_row(f.type, q.data(), y.data(), n);
      double worst_ratio = 0;
      int64_t worst_block = -1;
      for (int64_t b = 0; b < n / block; ++b) {
        const double bound = f.bound(x.data() + b * block);
        for (int64_t i = b * block; i < (b + 1) * block; ++i) {
          const double err = std::fabs(static_cast<double>(x[i]) - static_cast<double>(y[i]));
          ASSERT_TRUE(std::isfinite(y[i])) << dtype_name(f.type) << " " << name << " [" << i << "]";
          const double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
          if (ratio > worst_ratio) {
            worst_ratio = ratio;
            worst_block = b;
          }
        }
      }
      EXPECT_LE(worst_ratio, 1.0) << dtype_name(f.type) << " on " << name << ": block " << worst_block << " error is "
                                  << worst_ratio << " x the bound";
    }
  }
}

TEST(QuantProperty, ZerosAndExactGridValuesRoundTripExactly) {
  for (DType t : block_and_plain_types()) {
    const int64_t n = 2 * kQK_K;
    std::vector<float> zeros(n, 0.0f), y(n, 1.0f);
    std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(t, n)));
    quantize_row(t, zeros.data(), q.data(), n);
    dequantize_row(t, q.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], 0.0f) << dtype_name(t) << " [" << i << "]";
  }
  // Integers -127..127 are exact in the 8-bit formats when every block's amax is 127 (d = 1).
  std::vector<float> ints(kQK_K);
  for (int i = 0; i < kQK_K; ++i) ints[i] = static_cast<float>((i * 37) % 255 - 127);
  for (int i = 0; i < kQK_K; i += 32) ints[i] = (i / 32) % 2 ? 127.0f : -127.0f;
  for (DType t : {DType::Q8_0, DType::Q8_1, DType::Q8_K, DType::F16, DType::BF16, DType::F32}) {
    std::vector<uint8_t> q(static_cast<size_t>(dtype_row_bytes(t, kQK_K)));
    std::vector<float> y(kQK_K);
    quantize_row(t, ints.data(), q.data(), kQK_K);
    dequantize_row(t, q.data(), y.data(), kQK_K);
    EXPECT_EQ(first_bit_mismatch(y.data(), ints.data(), kQK_K), -1) << dtype_name(t);
  }
}

TEST(QuantProperty, PlainSixteenBitTypesRoundToNearest) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<double> exponent(-20, 15), mantissa(1, 2);
  const int64_t n = 4096;
  std::vector<float> x(n), y(n);
  for (auto& v : x) v = static_cast<float>((rng() & 1 ? -1 : 1) * mantissa(rng) * std::exp2(exponent(rng)));
  std::vector<uint16_t> h(n);
  for (DType t : {DType::F16, DType::BF16}) {
    quantize_row(t, x.data(), h.data(), n);
    dequantize_row(t, h.data(), y.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const double err = std::fabs(static_cast<double>(x[i]) - y[i]);
      const double bound = t == DType::F16 ? fp16_rounding(x[i]) : std::fabs(x[i]) * 0x1p-8;
      ASSERT_LE(err, bound) << dtype_name(t) << " x=" << x[i];
    }
  }
}

TEST(QuantProperty, Q8_1SumFieldIsScaleTimesSumOfQuants) {
  const auto rows = test_rows();
  for (const auto& [name, x] : rows) {
    std::vector<BlockQ8_1> q(x.size() / kQK8_1);
    quantize_row(DType::Q8_1, x.data(), q.data(), static_cast<int64_t>(x.size()));
    for (size_t b = 0; b < q.size(); ++b) {
      double sum = 0;
      for (int8_t v : q[b].qs) sum += v;
      // s is fp16(f32 d * sum): within the rounding of d and of s itself.
      const double d = fp16_to_f32(q[b].d), s = fp16_to_f32(q[b].s);
      const double want = d * sum;
      ASSERT_LE(std::fabs(s - want), fp16_rounding(want) + std::fabs(sum) * fp16_rounding(d) * 1.01)
          << name << " block " << b;
    }
  }
}

TEST(QuantProperty, Q8_KBlockSumsAreSumsOfSixteenQuants) {
  const auto rows = test_rows();
  for (const auto& [name, x] : rows) {
    std::vector<BlockQ8_K> q(x.size() / kQK_K);
    quantize_row_q8_k(x.data(), q.data(), static_cast<int64_t>(x.size()));
    for (size_t b = 0; b < q.size(); ++b) {
      for (int g = 0; g < kQK_K / 16; ++g) {
        int sum = 0;
        for (int i = 0; i < 16; ++i) sum += q[b].qs[16 * g + i];
        ASSERT_EQ(q[b].bsums[g], sum) << name << " block " << b << " group " << g;
      }
    }
  }
}

// The 12-byte layout of Q4_K/Q5_K scales, packed here from its description in
// docs/design/quant.md, must unpack to the same 6-bit values.
TEST(QuantProperty, KQuantScalePackingFollowsTheDocumentedLayout) {
  std::mt19937 rng(7);
  for (int rep = 0; rep < 200; ++rep) {
    uint8_t sc[8], mn[8], packed[kKScaleBytes] = {};
    for (int j = 0; j < 8; ++j) {
      sc[j] = static_cast<uint8_t>(rng() % 64);
      mn[j] = static_cast<uint8_t>(rng() % 64);
    }
    for (int j = 0; j < 4; ++j) {
      packed[j] = static_cast<uint8_t>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
      packed[j + 4] = static_cast<uint8_t>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
      packed[j + 8] = static_cast<uint8_t>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
    }
    for (int j = 0; j < 8; ++j) {
      uint8_t s, m;
      unpack_scale_min_k4(j, packed, &s, &m);
      ASSERT_EQ(s, sc[j]) << "scale " << j;
      ASSERT_EQ(m, mn[j]) << "min " << j;
    }
  }
}

TEST(QuantProperty, TypedEntryPointsEqualTheDispatchers) {
  const auto rows = test_rows();
  const std::vector<float>& x = rows[2].second;  // sub_block_scales
  const auto n = static_cast<int64_t>(x.size());
  std::vector<BlockQ4_K> a(n / kQK_K), b(n / kQK_K);
  quantize_row(DType::Q4_K, x.data(), a.data(), n);
  quantize_row_q4_k(x.data(), b.data(), n);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(BlockQ4_K)), 0);
  std::vector<float> ya(n), yb(n);
  dequantize_row(DType::Q4_K, a.data(), ya.data(), n);
  dequantize_row_q4_k(a.data(), yb.data(), n);
  EXPECT_EQ(first_bit_mismatch(ya.data(), yb.data(), n), -1);
}

// ----------------------------------------------------------------------------- errors

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(QuantErrors, UnsupportedTypesThrowNamingTheType) {
  float x[32] = {};
  uint8_t q[256] = {};
  for (DType t : {DType::I8, DType::I16, DType::I32, DType::Unknown, static_cast<DType>(10)}) {
    const std::string qe = error_of([&] { quantize_row(t, x, q, 32); });
    const std::string de = error_of([&] { dequantize_row(t, q, x, 32); });
    EXPECT_NE(qe.find("unsupported type"), std::string::npos) << qe;
    EXPECT_NE(de.find("unsupported type"), std::string::npos) << de;
    EXPECT_NE(qe.find(std::string(dtype_name(t))), std::string::npos) << qe;
  }
}

TEST(QuantErrors, RowLengthMustBeAMultipleOfTheBlock) {
  std::vector<float> x(2 * kQK_K);
  std::vector<uint8_t> q(4096);
  const std::string e = error_of([&] { quantize_row(DType::Q4_0, x.data(), q.data(), 33); });
  EXPECT_NE(e.find("33"), std::string::npos) << e;
  EXPECT_NE(e.find("Q4_0"), std::string::npos) << e;
  EXPECT_NE(e.find("32"), std::string::npos) << e;
  for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_K}) {
    EXPECT_THROW(quantize_row(t, x.data(), q.data(), 32), Error) << dtype_name(t);
    EXPECT_THROW(dequantize_row(t, q.data(), x.data(), 288), Error) << dtype_name(t);
  }
  EXPECT_THROW(dequantize_row(DType::Q8_0, q.data(), x.data(), -32), Error);
  // Plain types take any length; zero-length rows of any format are a no-op.
  EXPECT_NO_THROW(quantize_row(DType::F16, x.data(), q.data(), 3));
  EXPECT_NO_THROW(dequantize_row(DType::Q6_K, q.data(), x.data(), 0));
}

}  // namespace
}  // namespace tessera
