#pragma once
// FP8 E4M3 weights with one f32 scale per output row (DType::FP8W, core/fp8_weight.h): the
// E4M3 codec (OCP FP8 E4M3, "e4m3fn": no infinities, 0x7F/0xFF NaN, largest 448), the
// reference decoder, and round-to-nearest quantization. docs/design/weight-quant.md.
#include <cstdint>
#include <memory>

#include "core/fp8_weight.h"

namespace tessera {

inline constexpr float kE4M3Max = 448.0f;

// Nearest E4M3 code, ties to even, saturating: |x| >= 448 (infinities too) gives ±448; NaN
// gives 0x7F with x's sign. Subnormals (|x| < 2^-6, steps of 2^-9) are kept.
uint8_t e4m3_from_float(float x);
// The value of a code (exact in f32); 0x7F/0xFF are NaN.
float e4m3_to_float(uint8_t code);
// All 256 decoded values, for table lookups.
const float* e4m3_table();

struct Fp8Matrix {
  Fp8WeightLayout layout;
  std::shared_ptr<uint8_t> data;  // 64-byte aligned, layout.total_bytes long
};

// Round-to-nearest quantization of a [rows][cols] f32 matrix, as vLLM's --quantization fp8
// does per channel: scale[r] = amax(row r) / 448 in f32 (1 for an all-zero row), code =
// e4m3_from_float(x / scale[r]). Throws tessera::Error naming the row for a non-finite value.
Fp8Matrix quantize_fp8_rtn(const float* w, int64_t rows, int64_t cols);

// One row of it: writes cols codes, returns the row's scale.
float quantize_fp8_row(const float* x, int64_t cols, uint8_t* codes, int64_t row_index = 0);

// An empty (all-zero) buffer of the layout, for builders that fill codes and scales.
Fp8Matrix make_fp8_matrix(int64_t rows, int64_t cols);

// out[0..cols) = row r: e4m3_to_float(code) * scale[r], one f32 rounding.
void fp8_dequantize_row(const Fp8WeightLayout& l, const uint8_t* buf, int64_t r, float* out);

}  // namespace tessera
