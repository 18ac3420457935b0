// The group-quantized builder and reference decoder (quant/group_quant.h): the layout's
// packing, act-order permutations kept (and identity ones dropped), default zero points
// dropped, bad input refused naming what is wrong, and round-to-nearest within half a step.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp16.h"
#include "quant/group_quant.h"

using namespace tessera;

namespace {

GroupQuantSource source(int bits, int64_t rows, int64_t cols, int64_t group, const std::vector<uint8_t>& codes,
                        const std::vector<uint16_t>& scales, const std::vector<uint8_t>& zeros,
                        const std::vector<int32_t>& g_idx) {
  return GroupQuantSource{bits, rows, cols, group, codes, scales, zeros, g_idx};
}

std::string error_of(const GroupQuantSource& s) {
  try {
    build_group_quant(s, "w");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GroupQuant, W4PackingIsTheDocumentedNibbleOrder) {
  // One row of 40 columns (padded to 64): codes k % 16; nibble order per 32 columns.
  std::vector<uint8_t> codes(40);
  for (int k = 0; k < 40; ++k) codes[k] = static_cast<uint8_t>(k % 16);
  const std::vector<uint16_t> scales = {f32_to_fp16(0.5f)};
  auto m = build_group_quant(source(4, 1, 40, 40, codes, scales, {}, {}), "w");
  EXPECT_EQ(m.layout.code_row_bytes, 32);
  EXPECT_FALSE(m.layout.has_zeros);
  EXPECT_FALSE(m.layout.has_perm);
  const uint8_t* b = m.data.get();
  EXPECT_EQ(b[0], 0x00 | (0 << 4));   // column 0 low, column 16 (16 % 16 = 0) high
  EXPECT_EQ(b[3], 0x03 | (3 << 4));   // column 3, column 19
  EXPECT_EQ(b[16], 0x00 | (0 << 4));  // second block: column 32 low, column 48 (padding) high
  EXPECT_EQ(b[7 + 16], 7);            // column 39, padding 0
  std::vector<float> row(40);
  gq_dequantize_row(m.layout, b, 0, row.data());
  for (int k = 0; k < 40; ++k) EXPECT_EQ(row[k], (k % 16 - 8) * 0.5f);
}

TEST(GroupQuant, ActOrderIsKeptAsAPermutation) {
  // 4 columns, groups of 2 ... but groups must be multiples of 32: use 64 columns, groups of 32,
  // with g_idx alternating 0, 1 (act-order scatters each group).
  const int64_t cols = 64, rows = 3;
  std::vector<int32_t> g_idx(cols);
  for (int k = 0; k < cols; ++k) g_idx[k] = k % 2;
  std::vector<uint8_t> codes(rows * cols), zeros(2 * rows);
  std::mt19937 rng(1);
  for (auto& c : codes) c = static_cast<uint8_t>(rng() % 16);
  for (auto& z : zeros) z = static_cast<uint8_t>(rng() % 16);
  std::vector<uint16_t> scales(2 * rows);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = f32_to_fp16(0.25f + 0.125f * static_cast<float>(i));
  auto m = build_group_quant(source(4, rows, cols, 32, codes, scales, zeros, g_idx), "w");
  ASSERT_TRUE(m.layout.has_perm);
  ASSERT_TRUE(m.layout.has_zeros);
  const int32_t* perm = gq_perm(m.layout, m.data.get());
  for (int j = 0; j < cols; ++j) EXPECT_EQ(perm[j], j < 32 ? 2 * j : 2 * (j - 32) + 1);  // stable sort by group
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    gq_dequantize_row(m.layout, m.data.get(), r, row.data());
    for (int k = 0; k < cols; ++k) {
      const int g = k % 2;
      EXPECT_EQ(row[k],
                static_cast<float>(codes[r * cols + k] - zeros[g * rows + r]) * fp16_to_f32(scales[g * rows + r]));
    }
  }
}

TEST(GroupQuant, IdentityPermutationAndDefaultZerosAreDropped) {
  const int64_t cols = 96, rows = 2;
  std::vector<int32_t> g_idx(cols);
  for (int k = 0; k < cols; ++k) g_idx[k] = k / 64;  // partial last group of 32
  std::vector<uint8_t> codes(rows * cols, 200), zeros(2 * rows, 128);
  std::vector<uint16_t> scales(2 * rows, f32_to_fp16(1.0f));
  auto m = build_group_quant(source(8, rows, cols, 64, codes, scales, zeros, g_idx), "w");
  EXPECT_FALSE(m.layout.has_perm);
  EXPECT_FALSE(m.layout.has_zeros);
  EXPECT_EQ(m.layout.n_groups, 2);
  EXPECT_EQ(m.layout.code_row_bytes, 96);
  std::vector<float> row(cols);
  gq_dequantize_row(m.layout, m.data.get(), 1, row.data());
  EXPECT_EQ(row[95], 72.0f);
}

TEST(GroupQuant, BadInputIsRefusedNamingIt) {
  const std::vector<uint16_t> one_scale = {f32_to_fp16(1.0f)};
  std::vector<uint8_t> codes(64, 1);
  EXPECT_NE(error_of(source(3, 1, 64, 64, codes, one_scale, {}, {})).find("bits"), std::string::npos);
  EXPECT_NE(error_of(source(4, 1, 64, 16, codes, one_scale, {}, {})).find("group size"), std::string::npos);
  codes[5] = 16;
  EXPECT_NE(error_of(source(4, 1, 64, 64, codes, one_scale, {}, {})).find("out of range"), std::string::npos);
  codes[5] = 1;
  EXPECT_NE(error_of(source(4, 1, 64, 32, codes, one_scale, {}, {})).find("scales"), std::string::npos);
  // g_idx putting 33 columns in group 0 and 31 in group 1.
  std::vector<int32_t> g_idx(64, 1);
  for (int k = 0; k < 33; ++k) g_idx[k] = 0;
  const std::vector<uint16_t> two = {f32_to_fp16(1.0f), f32_to_fp16(1.0f)};
  EXPECT_NE(error_of(source(4, 1, 64, 32, codes, two, {}, g_idx)).find("g_idx"), std::string::npos);
  g_idx[0] = 2;
  EXPECT_NE(error_of(source(4, 1, 64, 32, codes, two, {}, g_idx)).find("g_idx[0] = 2"), std::string::npos);
  const std::vector<uint16_t> inf = {0x7C00};
  EXPECT_NE(error_of(source(4, 1, 64, 64, codes, inf, {}, {})).find("not finite"), std::string::npos);
}

TEST(GroupQuant, TypesAreNeverReadFromGguf) {
  // W4G/W8G are tessera's own: a GGUF tensor type id equal to theirs is unknown, not them.
  EXPECT_EQ(dtype_from_ggml_id(static_cast<uint32_t>(DType::W4G)), DType::Unknown);
  EXPECT_EQ(dtype_from_ggml_id(static_cast<uint32_t>(DType::W8G)), DType::Unknown);
  EXPECT_TRUE(is_group_quant(DType::W4G) && !is_group_quant(DType::Q4_0));
}

TEST(GroupQuant, RoundToNearestIsWithinHalfAStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0, 1);
  const int64_t rows = 7, cols = 200;
  std::vector<float> w(rows * cols);
  for (auto& v : w) v = d(rng);
  for (int bits : {4, 8})
    for (int64_t group : {int64_t{32}, int64_t{128}, cols})
      for (bool asym : {false, true}) {
        auto m = quantize_group_rtn(w.data(), rows, cols, bits, group, asym);
        std::vector<float> row(cols);
        for (int64_t r = 0; r < rows; ++r) {
          gq_dequantize_row(m.layout, m.data.get(), r, row.data());
          for (int64_t k = 0; k < cols; ++k) {
            const float step = fp16_to_f32(gq_scale_f16(m.layout, m.data.get(), r, k / group));
            // Half a step, plus the f16 rounding of the scale over the range (up to 2^-11 of a
            // step per level); symmetric ranges clamp one level short at the positive end.
            const float levels = static_cast<float>((1 << bits) - 1);
            const float bound = asym ? (0.5f + levels / 2048.0f + 0.01f) * step : step * 1.001f;
            ASSERT_LE(std::fabs(row[k] - w[r * cols + k]), bound)
                << bits << " bits, group " << group << (asym ? " asym" : " sym") << " at " << r << "," << k;
          }
        }
      }
}
