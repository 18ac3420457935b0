// Scalar reference codecs for the plain types and the 32-element block formats, plus the
// dispatchers. Each routine repeats GGML's arithmetic operation for operation (same
// operand order, same int->float conversions, same f32 rounding points) so results are
// bit-exact with GGML; docs/design/quant.md lists the formats. The K-quants are in
// quant_k.cpp.
//
// Bit-exactness also needs every product and sum rounded on its own: the pragmas below
// forbid fusing a*b+c into an FMA (g++ and clang both would once FMA is enabled, e.g. by
// -march=native), and these files must never get -ffast-math.
#include "quant/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tessera {

namespace {

// The element of largest magnitude, with its sign; the first one wins a tie (GGML's scan).
float signed_absmax(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, int n, float* min_out, float* max_out) {
  float min = 3.40282347e38f, max = -3.40282347e38f;  // +-FLT_MAX like GGML
  for (int j = 0; j < n; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
  *min_out = min;
  *max_out = max;
}

float absmax(const float* x, int n) {
  float amax = 0.0f;
  for (int j = 0; j < n; ++j) amax = amax > std::fabs(x[j]) ? amax : std::fabs(x[j]);  // MAX()
  return amax;
}

// C's (int8_t)(float) as GGML's x86 build performs it: truncate toward zero to int, keep
// the low byte. In range (all finite inputs of these quantizers) it is plain truncation.
int8_t trunc_to_i8(float v) { return static_cast<int8_t>(static_cast<int>(v)); }

// GGML stores the 5th bit of element j of a Q5 block in bit j of a little-endian u32.
uint32_t load_qh(const uint8_t qh[4]) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

void store_qh(uint8_t qh[4], uint32_t v) { std::memcpy(qh, &v, 4); }

}  // namespace

// ---------------------------------------------------------------------------- dequantize

void dequantize_row_q4_0(const BlockQ4_0* x, float* y, int64_t n) {
  constexpr int qk = kQK4_0;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < qk / 2; ++j) {
      const int x0 = (x[i].qs[j] & 0x0F) - 8;
      const int x1 = (x[i].qs[j] >> 4) - 8;
      y[i * qk + j] = static_cast<float>(x0) * d;
      y[i * qk + j + qk / 2] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_row_q4_1(const BlockQ4_1* x, float* y, int64_t n) {
  constexpr int qk = kQK4_1;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    for (int j = 0; j < qk / 2; ++j) {
      const int x0 = x[i].qs[j] & 0x0F;
      const int x1 = x[i].qs[j] >> 4;
      y[i * qk + j] = static_cast<float>(x0) * d + m;
      y[i * qk + j + qk / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t n) {
  constexpr int qk = kQK5_0;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float d = fp16_to_f32(x[i].d);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < qk / 2; ++j) {
      const int high0 = ((qh >> j) << 4) & 0x10;  // bit j      -> element j
      const int high1 = (qh >> (j + 12)) & 0x10;  // bit j + 16 -> element j + 16
      const int x0 = ((x[i].qs[j] & 0x0F) | high0) - 16;
      const int x1 = ((x[i].qs[j] >> 4) | high1) - 16;
      y[i * qk + j] = static_cast<float>(x0) * d;
      y[i * qk + j + qk / 2] = static_cast<float>(x1) * d;
    }
  }
}

void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t n) {
  constexpr int qk = kQK5_1;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float d = fp16_to_f32(x[i].d);
    const float m = fp16_to_f32(x[i].m);
    const uint32_t qh = load_qh(x[i].qh);
    for (int j = 0; j < qk / 2; ++j) {
      const int high0 = ((qh >> j) << 4) & 0x10;
      const int high1 = (qh >> (j + 12)) & 0x10;
      const int x0 = (x[i].qs[j] & 0x0F) | high0;
      const int x1 = (x[i].qs[j] >> 4) | high1;
      y[i * qk + j] = static_cast<float>(x0) * d + m;
      y[i * qk + j + qk / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

void dequantize_row_q8_0(const BlockQ8_0* x, float* y, int64_t n) {
  constexpr int qk = kQK8_0;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < qk; ++j) y[i * qk + j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// GGML has no Q8_1 dequantizer (it is an activation format); this is the definition x = q*d.
void dequantize_row_q8_1(const BlockQ8_1* x, float* y, int64_t n) {
  constexpr int qk = kQK8_1;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float d = fp16_to_f32(x[i].d);
    for (int j = 0; j < qk; ++j) y[i * qk + j] = static_cast<float>(x[i].qs[j]) * d;
  }
}

// ------------------------------------------------------------------------------ quantize

// Symmetric 4-bit: d = max / -8 with `max` the signed extreme, so that element maps to q = 0
// exactly; the opposite extreme (+8 in units of d) clamps to q = 15.
void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n) {
  constexpr int qk = kQK4_0;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float* xb = x + i * qk;
    const float d = signed_absmax(xb, qk) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[qk / 2 + j] * id;
      // (int8_t)(v + 8.5f) truncates toward zero: round-half-up on the shifted value.
      const uint8_t q0 = static_cast<uint8_t>(std::min<int>(15, trunc_to_i8(x0 + 8.5f)));
      const uint8_t q1 = static_cast<uint8_t>(std::min<int>(15, trunc_to_i8(x1 + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

// Affine 4-bit: x = q * d + m with m = min, d = (max - min) / 15.
void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n) {
  constexpr int qk = kQK4_1;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float* xb = x + i * qk;
    float min, max;
    min_max(xb, qk, &min, &max);
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(min);
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = (xb[j] - min) * id;
      const float x1 = (xb[qk / 2 + j] - min) * id;
      const uint8_t q0 = static_cast<uint8_t>(std::min<int>(15, trunc_to_i8(x0 + 0.5f)));
      const uint8_t q1 = static_cast<uint8_t>(std::min<int>(15, trunc_to_i8(x1 + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n) {
  constexpr int qk = kQK5_0;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float* xb = x + i * qk;
    const float d = signed_absmax(xb, qk) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = xb[j] * id;
      const float x1 = xb[qk / 2 + j] * id;
      const uint8_t q0 = static_cast<uint8_t>(std::min<int>(31, trunc_to_i8(x0 + 16.5f)));
      const uint8_t q1 = static_cast<uint8_t>(std::min<int>(31, trunc_to_i8(x1 + 16.5f)));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + qk / 2);
    }
    store_qh(y[i].qh, qh);
  }
}

void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n) {
  constexpr int qk = kQK5_1;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float* xb = x + i * qk;
    float min, max;
    min_max(xb, qk, &min, &max);
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    y[i].m = f32_to_fp16(min);
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const float x0 = (xb[j] - min) * id;
      const float x1 = (xb[qk / 2 + j] - min) * id;
      // GGML converts straight to uint8_t here (no clamp): x0 + 0.5 is in [0.5, 31.5].
      const int q0 = static_cast<uint8_t>(static_cast<int>(x0 + 0.5f));
      const int q1 = static_cast<uint8_t>(static_cast<int>(x1 + 0.5f));
      y[i].qs[j] = static_cast<uint8_t>((q0 & 0x0F) | ((q1 & 0x0F) << 4));
      qh |= static_cast<uint32_t>((q0 & 0x10) >> 4) << j;
      qh |= static_cast<uint32_t>((q1 & 0x10) >> 4) << (j + qk / 2);
    }
    store_qh(y[i].qh, qh);
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  constexpr int qk = kQK8_0;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float* xb = x + i * qk;
    const float d = absmax(xb, qk) / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    for (int j = 0; j < qk; ++j) y[i].qs[j] = trunc_to_i8(std::round(xb[j] * id));
  }
}

// Like Q8_0, plus s = d * sum(q) (from the f32 d, rounded once to fp16) so that a dot with
// a Q4_1/Q5_1 row can add m * s instead of summing m over the block.
void quantize_row_q8_1(const float* x, BlockQ8_1* y, int64_t n) {
  constexpr int qk = kQK8_1;
  for (int64_t i = 0; i < n / qk; ++i) {
    const float* xb = x + i * qk;
    const float d = absmax(xb, qk) / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = f32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < qk; ++j) {
      y[i].qs[j] = trunc_to_i8(std::round(xb[j] * id));
      sum += y[i].qs[j];
    }
    y[i].s = f32_to_fp16(static_cast<float>(sum) * d);
  }
}

// ---------------------------------------------------------------------------- dispatch

namespace {

// Elements per block of the types the codecs handle; 0 for any other type.
int64_t codec_block_elems(DType type) {
  switch (type) {
    case DType::F32:
    case DType::F16:
    case DType::BF16:
      return 1;
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
    case DType::Q8_1:
      return 32;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
    case DType::Q8_K:
      return kQK_K;
    default:
      return 0;
  }
}

void check_row(const char* what, DType type, int64_t n) {
  const int64_t block = codec_block_elems(type);
  if (block == 0) {
    fail(what, ": unsupported type ", dtype_name(type), " (id ", static_cast<uint32_t>(type), ")");
  }
  if (n < 0 || n % block != 0) {
    fail(what, ": row of ", n, " elements is not a multiple of the ", dtype_name(type), " block size ", block);
  }
}

}  // namespace

void dequantize_row(DType type, const void* src, float* dst, int64_t n) {
  check_row("dequantize_row", type, n);
  switch (type) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = fp16_to_f32(h[i]);
      return;
    }
    case DType::BF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
      return;
    }
    case DType::Q4_0:
      return dequantize_row_q4_0(static_cast<const BlockQ4_0*>(src), dst, n);
    case DType::Q4_1:
      return dequantize_row_q4_1(static_cast<const BlockQ4_1*>(src), dst, n);
    case DType::Q5_0:
      return dequantize_row_q5_0(static_cast<const BlockQ5_0*>(src), dst, n);
    case DType::Q5_1:
      return dequantize_row_q5_1(static_cast<const BlockQ5_1*>(src), dst, n);
    case DType::Q8_0:
      return dequantize_row_q8_0(static_cast<const BlockQ8_0*>(src), dst, n);
    case DType::Q8_1:
      return dequantize_row_q8_1(static_cast<const BlockQ8_1*>(src), dst, n);
    case DType::Q4_K:
      return dequantize_row_q4_k(static_cast<const BlockQ4_K*>(src), dst, n);
    case DType::Q5_K:
      return dequantize_row_q5_k(static_cast<const BlockQ5_K*>(src), dst, n);
    case DType::Q6_K:
      return dequantize_row_q6_k(static_cast<const BlockQ6_K*>(src), dst, n);
    case DType::Q8_K:
      return dequantize_row_q8_k(static_cast<const BlockQ8_K*>(src), dst, n);
    default:
      break;
  }
  fail("dequantize_row: unsupported type ", dtype_name(type));  // unreachable: checked above
}

void quantize_row(DType type, const float* src, void* dst, int64_t n) {
  check_row("quantize_row", type, n);
  switch (type) {
    case DType::F32:
      if (n > 0) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::F16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_fp16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* h = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::Q4_0:
      return quantize_row_q4_0(src, static_cast<BlockQ4_0*>(dst), n);
    case DType::Q4_1:
      return quantize_row_q4_1(src, static_cast<BlockQ4_1*>(dst), n);
    case DType::Q5_0:
      return quantize_row_q5_0(src, static_cast<BlockQ5_0*>(dst), n);
    case DType::Q5_1:
      return quantize_row_q5_1(src, static_cast<BlockQ5_1*>(dst), n);
    case DType::Q8_0:
      return quantize_row_q8_0(src, static_cast<BlockQ8_0*>(dst), n);
    case DType::Q8_1:
      return quantize_row_q8_1(src, static_cast<BlockQ8_1*>(dst), n);
    case DType::Q4_K:
      return quantize_row_q4_k(src, static_cast<BlockQ4_K*>(dst), n);
    case DType::Q5_K:
      return quantize_row_q5_k(src, static_cast<BlockQ5_K*>(dst), n);
    case DType::Q6_K:
      return quantize_row_q6_k(src, static_cast<BlockQ6_K*>(dst), n);
    case DType::Q8_K:
      return quantize_row_q8_k(src, static_cast<BlockQ8_K*>(dst), n);
    default:
      break;
  }
  fail("quantize_row: unsupported type ", dtype_name(type));  // unreachable: checked above
}

}  // namespace tessera
