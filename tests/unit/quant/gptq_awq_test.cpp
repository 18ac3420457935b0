// GPTQ and AWQ on one layer against the independent float64 numpy implementations of
// tools/fixtures/make_gptq_awq_fixtures.py (same activations, same weights): the same codes up
// to rounding ties, the same output error ||X (Q - W)^T||^2, AWQ's same alpha and losses; GPTQ
// and AWQ beat round-to-nearest on the calibration activations; bad options are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "quant/awq.h"
#include "quant/gptq.h"
#include "quant/group_quant.h"
#include "quant_test_util.h"

using namespace tessera;
using namespace tessera::quant_test;

namespace {

std::string gptq_fixture(const std::string& name) { return std::string(TESSERA_FIXTURES_DIR) + "/gptq/" + name; }

struct Layer {
  int64_t rows = 0, cols = 0, tokens = 0;
  std::vector<double> x;  // [tokens][cols]
  std::vector<float> w;   // [rows][cols]
  std::vector<double> h;  // XᵀX [cols][cols]
  nlohmann::json index;
};

const Layer& layer() {
  static const Layer l = [] {
    Layer l;
    const std::vector<uint8_t> idx = read_bytes(gptq_fixture("index.json"));
    l.index = nlohmann::json::parse(idx.begin(), idx.end());
    l.rows = l.index["rows"];
    l.cols = l.index["cols"];
    l.tokens = l.index["tokens"];
    const std::vector<uint8_t> xb = read_bytes(gptq_fixture("x.f16"));
    EXPECT_EQ(static_cast<int64_t>(xb.size()), l.tokens * l.cols * 2);
    l.x.resize(static_cast<size_t>(l.tokens * l.cols));
    for (size_t i = 0; i < l.x.size(); ++i)
      l.x[i] = fp16_to_f32(static_cast<uint16_t>(xb[2 * i] | (xb[2 * i + 1] << 8)));
    l.w = read_f32(gptq_fixture("w.f32"));
    EXPECT_EQ(static_cast<int64_t>(l.w.size()), l.rows * l.cols);
    l.h.assign(static_cast<size_t>(l.cols * l.cols), 0.0);
    for (int64_t t = 0; t < l.tokens; ++t)
      for (int64_t i = 0; i < l.cols; ++i)
        for (int64_t j = 0; j < l.cols; ++j) l.h[i * l.cols + j] += l.x[t * l.cols + i] * l.x[t * l.cols + j];
    return l;
  }();
  return l;
}

// Σ_r d_r·H·d_rᵀ = ||X dᵀ||², in double.
double out_err(const Layer& l, const float* d, int64_t rows) {
  double s = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < l.cols; ++i) {
      double t = 0;
      for (int64_t j = 0; j < l.cols; ++j) t += l.h[i * l.cols + j] * d[r * l.cols + j];
      s += t * d[r * l.cols + i];
    }
  return s;
}

double out_err_of(const Layer& l, const std::vector<float>& q) {
  std::vector<float> d(q.size());
  for (size_t i = 0; i < q.size(); ++i) d[i] = q[i] - l.w[i];
  return out_err(l, d.data(), l.rows);
}

std::vector<float> dequantize(const GroupQuantMatrix& m) {
  std::vector<float> out(static_cast<size_t>(m.layout.rows * m.layout.cols));
  for (int64_t r = 0; r < m.layout.rows; ++r)
    gq_dequantize_row(m.layout, m.data.get(), r, out.data() + r * m.layout.cols);
  return out;
}

// Codes in input-column order.
std::vector<uint8_t> codes_of(const GroupQuantMatrix& m) {
  const GroupQuantLayout& l = m.layout;
  const int32_t* perm = gq_perm(l, m.data.get());
  std::vector<uint8_t> out(static_cast<size_t>(l.rows * l.cols));
  for (int64_t r = 0; r < l.rows; ++r)
    for (int64_t j = 0; j < l.cols; ++j) out[r * l.cols + (perm ? perm[j] : j)] = gq_code(l, m.data.get(), r, j);
  return out;
}

double mismatch_fraction(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  EXPECT_EQ(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) n += a[i] != b[i];
  return static_cast<double>(n) / static_cast<double>(a.size());
}

}  // namespace

TEST(Gptq, MatchesTheNumpyReference) {
  const Layer& l = layer();
  int n_cases = 0;
  for (const auto& c : l.index["cases"]) {
    if (c["method"] != "gptq") continue;
    ++n_cases;
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    GptqOptions o;
    o.bits = c["bits"];
    o.group_size = c["group_size"];
    o.asymmetric = c["asymmetric"];
    o.act_order = c["act_order"];
    o.damp = c["damp"];
    const GptqHessian h = gptq_prepare(l.h.data(), l.cols, o.damp, o.act_order);
    EXPECT_EQ(h.dead[7], 1);  // the fixture's inactive channel
    const GptqResult r = gptq_quantize(l.w.data(), l.rows, l.cols, h, o, 2);
    // The buffer decodes to what the result says, codes included.
    EXPECT_EQ(codes_of(r.matrix), r.codes);
    EXPECT_EQ(dequantize(r.matrix), r.dequantized);
    const double mis = mismatch_fraction(r.codes, read_bytes(gptq_fixture(name + ".codes")));
    std::printf("[ %s ] codes differing from numpy: %.4f%%\n", name.c_str(), 100 * mis);
    EXPECT_LE(mis, 2e-3);  // rounding ties only (float64 sums in another order)
    const double err = out_err_of(l, r.dequantized), want = c["out_err"], rtn = c["rtn_out_err"];
    EXPECT_NEAR(err, want, 1e-3 * want);
    EXPECT_LT(err, 0.9 * rtn);  // GPTQ beats RTN on its calibration activations
    // RTN through tessera's own quantizer gives the reference's RTN error.
    const GroupQuantMatrix q = quantize_group_rtn(l.w.data(), l.rows, l.cols, o.bits, o.group_size, o.asymmetric);
    EXPECT_NEAR(out_err_of(l, dequantize(q)), rtn, 1e-6 * rtn);
    if (o.act_order) {
      EXPECT_TRUE(r.matrix.layout.has_perm);
      const std::vector<float> gidx = read_f32(gptq_fixture(name + ".gidx"));  // i32 bits
      ASSERT_EQ(gidx.size(), r.g_idx.size());
      for (size_t k = 0; k < gidx.size(); ++k) {
        int32_t want_g;
        std::memcpy(&want_g, &gidx[k], 4);
        ASSERT_EQ(r.g_idx[k], want_g) << k;
      }
    }
  }
  EXPECT_EQ(n_cases, 4);
}

TEST(Awq, MatchesTheNumpyReference) {
  const Layer& l = layer();
  std::vector<double> x_mean(static_cast<size_t>(l.cols), 0.0);
  for (int64_t t = 0; t < l.tokens; ++t)
    for (int64_t k = 0; k < l.cols; ++k) x_mean[k] += std::fabs(l.x[t * l.cols + k]) / static_cast<double>(l.tokens);
  int n_cases = 0;
  for (const auto& c : l.index["cases"]) {
    if (c["method"] != "awq") continue;
    ++n_cases;
    const std::string name = c["name"];
    SCOPED_TRACE(name);
    AwqOptions o;
    o.bits = c["bits"];
    o.group_size = c["group_size"];
    o.asymmetric = c["asymmetric"];
    const AwqMatrix m{l.w.data(), l.rows};
    const AwqScales s = awq_search_scales(
        {&m, 1}, l.cols, x_mean.data(), [&](const float* d, int64_t rows) { return out_err(l, d, rows); }, o);
    EXPECT_DOUBLE_EQ(s.alpha, static_cast<double>(c["alpha"]));
    ASSERT_EQ(s.loss.size(), c["losses"].size());
    for (size_t i = 0; i < s.loss.size(); ++i) EXPECT_NEAR(s.loss[i], c["losses"][i], 1e-3 * double(c["losses"][i]));
    // Clipping on the scaled weights with the scaled inputs' Gram, then RTN.
    std::vector<float> ws(l.w);
    for (size_t i = 0; i < ws.size(); ++i) ws[i] *= s.s[i % l.cols];
    std::vector<double> hs(l.h);
    for (int64_t a = 0; a < l.cols; ++a)
      for (int64_t b = 0; b < l.cols; ++b) hs[a * l.cols + b] /= static_cast<double>(s.s[a]) * s.s[b];
    awq_clip(ws.data(), l.rows, l.cols, hs.data(), o, 2);
    const GroupQuantMatrix q = quantize_group_rtn(ws.data(), l.rows, l.cols, o.bits, o.group_size, o.asymmetric);
    const double mis = mismatch_fraction(codes_of(q), read_bytes(gptq_fixture(name + ".codes")));
    std::printf("[ %s ] codes differing from numpy: %.4f%%\n", name.c_str(), 100 * mis);
    EXPECT_LE(mis, 2e-3);
    std::vector<float> eff = dequantize(q);
    for (size_t i = 0; i < eff.size(); ++i) eff[i] /= s.s[i % l.cols];
    const double err = out_err_of(l, eff), want = c["out_err"];
    EXPECT_NEAR(err, want, 1e-3 * want);
    EXPECT_LT(err, 0.9 * static_cast<double>(c["rtn_out_err"]));
    // The fake quantization the search scores is the same thing.
    std::vector<float> fake(l.w.size());
    const AwqOptions no_clip = o;
    awq_fake_quantize(l.w.data(), l.rows, l.cols, s.s, no_clip, fake.data());
    EXPECT_NEAR(out_err_of(l, fake), s.loss[static_cast<size_t>(std::lround(s.alpha * o.n_grid))], 1e-9 * err + 1e-12);
  }
  EXPECT_EQ(n_cases, 2);
}

TEST(Gptq, RefusesBadOptions) {
  const Layer& l = layer();
  auto error_of = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // A Hessian that damping cannot make positive definite (a negative diagonal).
  std::vector<double> bad(16, 0.0);
  for (int i = 0; i < 4; ++i) bad[i * 4 + i] = i == 2 ? -5.0 : 1.0;
  EXPECT_NE(error_of([&] { gptq_prepare(bad.data(), 4, 0.01, false); }).find("not positive definite"),
            std::string::npos);
  EXPECT_NE(error_of([&] { gptq_prepare(l.h.data(), l.cols, -1, false); }).find("damp"), std::string::npos);
  const GptqHessian h = gptq_prepare(l.h.data(), l.cols, 0.01, false);
  GptqOptions o;
  o.bits = 3;
  EXPECT_NE(error_of([&] { gptq_quantize(l.w.data(), l.rows, l.cols, h, o); }).find("bits"), std::string::npos);
  o.bits = 4;
  o.group_size = 48;
  EXPECT_NE(error_of([&] { gptq_quantize(l.w.data(), l.rows, l.cols, h, o); }).find("group size"), std::string::npos);
  o.group_size = 32;
  EXPECT_NE(error_of([&] { gptq_quantize(l.w.data(), l.rows, l.cols - 32, h, o); }).find("Hessian"), std::string::npos);
  AwqOptions a;
  a.bits = 3;
  const AwqMatrix m{l.w.data(), l.rows};
  std::vector<double> mean(static_cast<size_t>(l.cols), 1.0);
  EXPECT_NE(error_of([&] {
              awq_search_scales(
                  {&m, 1}, l.cols, mean.data(), [](const float*, int64_t) { return 0.0; }, a);
            }).find("bits"),
            std::string::npos);
}
