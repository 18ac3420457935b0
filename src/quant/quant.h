#pragma once
// Reference (scalar) conversions for every supported storage format. The SIMD kernels in
// backend/cpu are tested against these, and these against float64 math in the tests.
#include <cstdint>

#include "core/dtype.h"
#include "quant/blocks.h"

namespace tessera {

// dst[0..n) = src row decoded to f32. n must be a multiple of the type's block size.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// Encodes n f32 values into `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1,
// Q4_K, Q5_K, Q6_K, Q8_K) with round-to-nearest, as GGML's reference quantizers do.
// Used for dummy weights, activations and tests.
void quantize_row(DType type, const float* src, void* dst, int64_t n);

// The per-format routines behind the two dispatchers, for callers that already know the
// format (kernels' scalar tails, activation quantization). n must be a multiple of the
// block size; unlike the dispatchers they do not check it. Bit-exact with GGML's
// dequantize_row_* and quantize_row_*_ref (docs/design/quant.md).
void dequantize_row_q4_0(const BlockQ4_0* src, float* dst, int64_t n);
void dequantize_row_q4_1(const BlockQ4_1* src, float* dst, int64_t n);
void dequantize_row_q5_0(const BlockQ5_0* src, float* dst, int64_t n);
void dequantize_row_q5_1(const BlockQ5_1* src, float* dst, int64_t n);
void dequantize_row_q8_0(const BlockQ8_0* src, float* dst, int64_t n);
void dequantize_row_q8_1(const BlockQ8_1* src, float* dst, int64_t n);
void dequantize_row_q4_k(const BlockQ4_K* src, float* dst, int64_t n);
void dequantize_row_q5_k(const BlockQ5_K* src, float* dst, int64_t n);
void dequantize_row_q6_k(const BlockQ6_K* src, float* dst, int64_t n);
void dequantize_row_q8_k(const BlockQ8_K* src, float* dst, int64_t n);

void quantize_row_q4_0(const float* src, BlockQ4_0* dst, int64_t n);
void quantize_row_q4_1(const float* src, BlockQ4_1* dst, int64_t n);
void quantize_row_q5_0(const float* src, BlockQ5_0* dst, int64_t n);
void quantize_row_q5_1(const float* src, BlockQ5_1* dst, int64_t n);
void quantize_row_q8_0(const float* src, BlockQ8_0* dst, int64_t n);
void quantize_row_q8_1(const float* src, BlockQ8_1* dst, int64_t n);
void quantize_row_q4_k(const float* src, BlockQ4_K* dst, int64_t n);
void quantize_row_q5_k(const float* src, BlockQ5_K* dst, int64_t n);
void quantize_row_q6_k(const float* src, BlockQ6_K* dst, int64_t n);
void quantize_row_q8_k(const float* src, BlockQ8_K* dst, int64_t n);

// Unpacks the 6-bit scale and min of sub-block j (0..7) from a Q4_K/Q5_K scales[12]
// (GGML's get_scale_min_k4). SIMD kernels unpack the same layout.
void unpack_scale_min_k4(int j, const uint8_t* scales, uint8_t* scale, uint8_t* min);

}  // namespace tessera
