// FP8W weights (E4M3 codes, an f32 scale per row) on the CPU: the E4M3 codec, RTN
// quantization and CpuMatmul against numpy float64 (tests/fixtures/fp8, written by
// tools/fixtures/make_fp8_fixtures.py), then against a float64 reference written here on more
// awkward shapes, with NaN sentinels past every output row.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "quant/fp8_weight.h"
#include "unit/quant/quant_test_util.h"

using namespace tessera;

namespace {

// Every finite E4M3 magnitude, from the bit pattern's definition, in float64.
double e4m3_value(int code) {
  const int e = (code >> 3) & 0xF, m = code & 7;
  return e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
}

// The nearest code to x (float64), ties to the even code, saturating at 448.
uint8_t reference_e4m3(double x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const double a = std::fabs(x);
  if (a >= 448.0) return sign | 0x7E;
  int best = 0;
  for (int c = 1; c <= 0x7E; ++c) {
    const double d = std::fabs(e4m3_value(c) - a), db = std::fabs(e4m3_value(best) - a);
    if (d < db || (d == db && (c & 1) == 0)) best = c;
  }
  return sign | static_cast<uint8_t>(best);
}

std::string fp8_fixture(const std::string& name) { return std::string(TESSERA_FIXTURES_DIR) + "/fp8/" + name; }

std::vector<double> read_f64(const std::string& path) {
  const std::vector<uint8_t> bytes = quant_test::read_bytes(path);
  std::vector<double> out(bytes.size() / 8);
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * 8);
  return out;
}

}  // namespace

TEST(Fp8Weight, CodecMatchesNumpy) {
  const std::vector<float> in = quant_test::read_f32(fp8_fixture("codec_in.f32"));
  const std::vector<uint8_t> want = quant_test::read_bytes(fp8_fixture("codec_out.u8"));
  ASSERT_EQ(in.size(), want.size());
  ASSERT_GT(in.size(), 20000u);
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(e4m3_from_float(in[i]), want[i]) << "x=" << in[i];
}

// RTN codes and scales bit for bit, and CpuMatmul within f32 rounding of numpy's float64
// product of the same quantized weights (batches 33 and 5, widths 77 and 256).
TEST(Fp8Weight, RtnAndCpuMatmulMatchNumpy) {
  ThreadPool pool(2);
  CpuMatmul mm(pool);
  struct Case {
    const char* name;
    int64_t rows, cols, n;
  };
  for (const Case& c : {Case{"a", 19, 77, 33}, Case{"b", 64, 256, 5}}) {
    const std::string p = c.name;
    const std::vector<float> w = quant_test::read_f32(fp8_fixture(p + ".w.f32"));
    const std::vector<uint8_t> codes = quant_test::read_bytes(fp8_fixture(p + ".codes.u8"));
    const std::vector<float> scales = quant_test::read_f32(fp8_fixture(p + ".scales.f32"));
    const std::vector<float> x = quant_test::read_f32(fp8_fixture(p + ".x.f32"));
    const std::vector<double> y_ref = read_f64(fp8_fixture(p + ".y.f64"));
    ASSERT_EQ(w.size(), size_t(c.rows * c.cols));
    ASSERT_EQ(x.size(), size_t(c.n * c.cols));
    ASSERT_EQ(y_ref.size(), size_t(c.n * c.rows));
    const Fp8Matrix q = quantize_fp8_rtn(w.data(), c.rows, c.cols);
    const WeightMatrix wm{q.data.get(), DType::FP8W, c.rows, c.cols};
    for (int64_t r = 0; r < c.rows; ++r) {
      EXPECT_EQ(wm.fp8_scales()[r], scales[r]) << p << " row " << r;
      EXPECT_EQ(
          quant_test::first_byte_mismatch(q.data.get() + r * q.layout.row_bytes, codes.data() + r * c.cols, c.cols), -1)
          << p << " row " << r;
    }
    std::vector<float> y(c.n * c.rows, std::nanf(""));
    const MatmulTarget t{wm, y.data(), c.rows};
    mm.run(x.data(), c.n, c.cols, std::span(&t, 1));
    double num = 0, den = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      num += (y[i] - y_ref[i]) * (y[i] - y_ref[i]);
      den += y_ref[i] * y_ref[i];
    }
    EXPECT_LT(std::sqrt(num / den), 1e-6) << p;
  }
}

TEST(Fp8Weight, E4M3RoundingMatchesFloat64Reference) {
  // Every code decodes to its definition, and encodes back to itself (NaN excepted).
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(e4m3_to_float(static_cast<uint8_t>(c))));
      continue;
    }
    const double v = (c & 0x80 ? -1 : 1) * e4m3_value(c & 0x7F);
    EXPECT_EQ(e4m3_to_float(static_cast<uint8_t>(c)), static_cast<float>(v)) << c;
    if (c != 0x80) {
      EXPECT_EQ(e4m3_from_float(static_cast<float>(v)), c) << c;
    }
  }
  // Exact midpoints between neighbours (ties to even), and points just either side.
  for (int c = 0; c < 0x7E; ++c) {
    const double mid = 0.5 * (e4m3_value(c) + e4m3_value(c + 1));
    for (double x : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e9), -mid}) {
      const auto f = static_cast<float>(x);
      EXPECT_EQ(e4m3_from_float(f), reference_e4m3(f)) << "x=" << x << " code " << c;
    }
  }
  // Random values over every binade, subnormals and the saturating range.
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> expo(-14.0, 10.0), mant(1.0, 2.0);
  for (int i = 0; i < 200000; ++i) {
    const auto x = static_cast<float>((rng() & 1 ? -1 : 1) * mant(rng) * std::exp2(std::floor(expo(rng))));
    ASSERT_EQ(e4m3_from_float(x), reference_e4m3(x)) << "x=" << x;
  }
  EXPECT_EQ(e4m3_from_float(1e9f), 0x7E);
  EXPECT_EQ(e4m3_from_float(-std::numeric_limits<float>::infinity()), 0xFE);
  EXPECT_EQ(e4m3_from_float(std::nanf("")) & 0x7F, 0x7F);
  EXPECT_EQ(e4m3_from_float(0x1p-10f), 0x00);  // half the smallest subnormal: ties to even (0)
  EXPECT_EQ(e4m3_from_float(0x1.8p-10f), 0x01);
  EXPECT_EQ(e4m3_from_float(0x1.8p-9f), 0x02);  // 1.5 steps: ties to even (2)
}

TEST(Fp8Weight, RtnQuantizationIsWithinHalfAStepAndRefusesNonFinite) {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  const int64_t rows = 13, cols = 77;
  std::vector<float> w(rows * cols);
  for (auto& v : w) v = nd(rng);
  for (int64_t j = 0; j < cols; ++j) w[5 * cols + j] = 0.0f;  // an all-zero row
  const Fp8Matrix m = quantize_fp8_rtn(w.data(), rows, cols);
  EXPECT_EQ(m.layout.row_bytes, 80);
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    fp8_dequantize_row(m.layout, m.data.get(), r, row.data());
    float amax = 0;
    for (int64_t j = 0; j < cols; ++j) amax = std::max(amax, std::fabs(w[r * cols + j]));
    for (int64_t j = 0; j < cols; ++j) {
      // E4M3 has 3 mantissa bits: the error is at most 2^-4 relative, or half a subnormal step.
      const double bound = std::max(std::fabs(w[r * cols + j]) / 16.0, amax / 448.0 * std::ldexp(1.0, -10)) * 1.0001;
      EXPECT_LE(std::fabs(row[j] - w[r * cols + j]), bound) << r << "," << j;
    }
    for (int64_t j = cols; j < m.layout.row_bytes; ++j) EXPECT_EQ(m.data.get()[r * m.layout.row_bytes + j], 0);
  }
  w[3] = std::nanf("");
  EXPECT_THROW(quantize_fp8_rtn(w.data(), rows, cols), Error);
}

TEST(Fp8Weight, CpuMatmulMatchesFloat64OnAwkwardShapes) {
  ThreadPool pool(2);
  CpuMatmul mm(pool);
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t cols : {1, 7, 40, 77, 96, 257}) {
    for (int64_t rows : {1, 9, 70}) {
      std::vector<float> wf(rows * cols);
      for (auto& v : wf) v = nd(rng) * 0.05f;
      const Fp8Matrix q = quantize_fp8_rtn(wf.data(), rows, cols);
      std::vector<float> dec(rows * cols);
      for (int64_t r = 0; r < rows; ++r) fp8_dequantize_row(q.layout, q.data.get(), r, dec.data() + r * cols);
      const WeightMatrix w{q.data.get(), DType::FP8W, rows, cols};
      for (int64_t n : {1, 2, 8, 33, 300}) {
        const int64_t ldx = cols + 3, ldy = rows + 2;
        std::vector<float> x(n * ldx);
        for (auto& v : x) v = nd(rng);
        std::vector<float> y(n * ldy, std::nanf(""));
        const MatmulTarget t{w, y.data(), ldy};
        mm.run(x.data(), n, ldx, std::span(&t, 1));
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; ++i) {
          for (int64_t r = 0; r < rows; ++r) {
            double ref = 0;
            for (int64_t k = 0; k < cols; ++k) ref += double(x[i * ldx + k]) * dec[r * cols + k];
            num += (y[i * ldy + r] - ref) * (y[i * ldy + r] - ref);
            den += ref * ref;
          }
          for (int64_t r = rows; r < ldy; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + r])) << n << " " << r;
        }
        EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 1e-5) << rows << "x" << cols << " n=" << n;
      }
    }
  }
  std::vector<float> out(2 * 40);
  const Fp8Matrix q = quantize_fp8_rtn(std::vector<float>(3 * 40, 0.5f).data(), 3, 40);
  const WeightMatrix w{q.data.get(), DType::FP8W, 3, 40};
  const int32_t ids[] = {2, 0};
  cpu_get_rows(w, ids, 2, out.data());
  for (float v : out) EXPECT_FLOAT_EQ(v, 0.5f);
}
