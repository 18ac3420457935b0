#pragma once
// Group-quantized integer weights (W4G/W8G, core/group_quant.h): building the native buffer
// from unpacked codes (what every checkpoint loader produces after undoing its packing), the
// scalar reference decoder, and round-to-nearest quantization. docs/design/weight-quant.md.
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/group_quant.h"

namespace tessera {

// One matrix as a checkpoint describes it once unpacked, in input-column order.
struct GroupQuantSource {
  int bits = 4;
  int64_t rows = 0, cols = 0;
  int64_t group_size = 0;                // columns per group (== cols: one group per row)
  std::span<const uint8_t> codes;        // [rows][cols] unsigned codes, < 2^bits
  std::span<const uint16_t> scales_f16;  // [n_groups][rows] IEEE half bits
  std::span<const uint8_t> zeros;        // [n_groups][rows] unsigned zero points; empty: 2^(bits-1)
  std::span<const int32_t> g_idx;        // [cols] group of each input column; empty: column / group_size
};

// A built matrix: the layout and its buffer (64-byte aligned, layout.total_bytes long).
struct GroupQuantMatrix {
  GroupQuantLayout layout;
  std::shared_ptr<uint8_t> data;
};

// Builds the native buffer. With g_idx (GPTQ act-order), columns are sorted by group (stable)
// and the permutation kept; every group must then hold exactly group_size columns (the last
// one the rest), as GPTQ writes them. Zero points all equal to 2^(bits-1) are dropped, as is
// an identity permutation. Throws tessera::Error starting with `what` on bad input.
GroupQuantMatrix build_group_quant(const GroupQuantSource& src, const std::string& what);

// The code of stored column j of row r, and the zero and scale of its group.
uint8_t gq_code(const GroupQuantLayout& l, const uint8_t* buf, int64_t r, int64_t j);
uint8_t gq_zero(const GroupQuantLayout& l, const uint8_t* buf, int64_t r, int64_t g);
uint16_t gq_scale_f16(const GroupQuantLayout& l, const uint8_t* buf, int64_t r, int64_t g);
const int32_t* gq_perm(const GroupQuantLayout& l, const uint8_t* buf);  // nullptr without one

// out[0..cols) = row r in input-column order: out[perm[j]] = (code - zero) * scale, the
// product of the f32 integer difference and the f32 scale, one rounding.
void gq_dequantize_row(const GroupQuantLayout& l, const uint8_t* buf, int64_t r, float* out);

// The grid of one group: an f16 scale and a zero point for the values in [lo, hi], the range
// stretched to include 0 (as GPTQ's quantizer does). Symmetric: scale = max(-lo, hi) /
// ((2^bits - 1) / 2), zero 2^(bits-1); asymmetric: scale = (hi - lo) / (2^bits - 1), zero =
// round(-lo / scale). The scale is rounded to f16 first and the zero and codes follow the
// rounded one; an all-zero range gets scale 1. RTN, GPTQ and AWQ share it, so the methods
// differ only in what they feed it.
struct GroupGrid {
  uint16_t scale_f16 = 0;
  float scale = 1;
  int zero = 0, max_code = 15;
  int code(float x) const;  // clamp(round(x / scale) + zero, 0, max_code)
  float value(int q) const { return static_cast<float>(q - zero) * scale; }
};
GroupGrid group_grid(float lo, float hi, int bits, bool asymmetric);

// Round-to-nearest quantization of a [rows][cols] f32 matrix. Symmetric: scale =
// amax / ((2^bits - 1) / 2), zero 2^(bits-1); asymmetric: scale = (max - min) / (2^bits - 1)
// over a range that includes 0, zero = round(-min / scale). Scales are rounded to f16 first and
// the codes computed against the rounded scale: code = clamp(round(x / scale) + zero).
GroupQuantMatrix quantize_group_rtn(const float* w, int64_t rows, int64_t cols, int bits, int64_t group_size,
                                    bool asymmetric);

}  // namespace tessera
