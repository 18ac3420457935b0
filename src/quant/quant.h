#pragma once
// Reference (scalar) conversions for every supported storage format. The SIMD kernels in
// backend/cpu are tested against these, and these against float64 math in the tests.
#include <cstdint>

#include "core/dtype.h"

namespace tessera {

// dst[0..n) = src row decoded to f32. n must be a multiple of the type's block size.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// Encodes n f32 values into `type` (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1,
// Q4_K, Q5_K, Q6_K, Q8_K) with round-to-nearest, as GGML's reference quantizers do.
// Used for dummy weights, activations and tests.
void quantize_row(DType type, const float* src, void* dst, int64_t n);

}  // namespace tessera
