#include "quant/fp8_weight.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace tessera {

uint8_t e4m3_from_float(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | 0x7F;  // NaN
  float a;
  std::memcpy(&a, &abs_bits, 4);
  if (a >= kE4M3Max) return sign | 0x7E;  // saturate (infinities too)
  if (a < 0x1p-6f) {
    // Subnormal: steps of 2^-9; a * 512 is exact, nearbyint rounds ties to even (m = 8 is the
    // smallest normal, code 0x08, so the carry is right as it is).
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  // Normal: round the f32 mantissa to 3 bits, ties to even; a carry moves into the exponent.
  const uint32_t rounded = abs_bits + 0x7FFFFu + ((abs_bits >> 20) & 1u);
  const uint32_t code = (rounded >> 20) - ((127u - 7u) << 3);
  return sign | static_cast<uint8_t>(code > 0x7Eu ? 0x7Eu : code);
}

float e4m3_to_float(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int e = (code >> 3) & 0xF, m = code & 7;
  if ((code & 0x7F) == 0x7F) return std::nanf("");
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
}

const float* e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) t[v] = e4m3_to_float(static_cast<uint8_t>(v));
    return t;
  }();
  return table.data();
}

Fp8Matrix make_fp8_matrix(int64_t rows, int64_t cols) {
  TESSERA_CHECK(rows > 0 && cols > 0, "fp8 weight: shape [", rows, ", ", cols, "] is empty");
  Fp8Matrix m;
  m.layout = Fp8WeightLayout::make(rows, cols);
  auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, static_cast<size_t>(m.layout.total_bytes)));
  TESSERA_CHECK(p, "fp8 weight: out of memory allocating ", m.layout.total_bytes, " bytes");
  std::memset(p, 0, static_cast<size_t>(m.layout.total_bytes));
  m.data = std::shared_ptr<uint8_t>(p, [](uint8_t* q) { std::free(q); });
  return m;
}

float quantize_fp8_row(const float* x, int64_t cols, uint8_t* codes, int64_t row_index) {
  float amax = 0.0f;
  for (int64_t j = 0; j < cols; ++j) {
    TESSERA_CHECK(std::isfinite(x[j]), "fp8 quantization: row ", row_index, " column ", j, " holds ", x[j]);
    amax = std::max(amax, std::fabs(x[j]));
  }
  const float scale = amax > 0.0f ? amax / kE4M3Max : 1.0f;
  for (int64_t j = 0; j < cols; ++j) codes[j] = e4m3_from_float(x[j] / scale);
  return scale;
}

Fp8Matrix quantize_fp8_rtn(const float* w, int64_t rows, int64_t cols) {
  Fp8Matrix m = make_fp8_matrix(rows, cols);
  const Fp8WeightLayout& l = m.layout;
  auto* scales = reinterpret_cast<float*>(m.data.get() + l.off_scales);
  for (int64_t r = 0; r < rows; ++r)
    scales[r] = quantize_fp8_row(w + r * cols, cols, m.data.get() + r * l.row_bytes, r);
  return m;
}

void fp8_dequantize_row(const Fp8WeightLayout& l, const uint8_t* buf, int64_t r, float* out) {
  const float* table = e4m3_table();
  const uint8_t* codes = buf + r * l.row_bytes;
  float scale;
  std::memcpy(&scale, buf + l.off_scales + r * 4, 4);
  for (int64_t j = 0; j < l.cols; ++j) out[j] = table[codes[j]] * scale;
}

}  // namespace tessera
