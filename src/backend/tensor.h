#pragma once
// Views of device memory handed to backend ops. A view does not own memory: weights belong to
// the model (read-only, shared), activations and KV to the run.
#include <cstdint>

#include "core/dtype.h"
#include "core/fp8_weight.h"
#include "core/group_quant.h"

namespace tessera {

// A 2-D weight stored in its own format: `rows` output features, each of `cols` elements,
// rows contiguous with stride dtype_row_bytes(dtype, cols). For GGUF, rows = shape[1] and
// cols = shape[0]. Group-quantized weights (W4G/W8G) are one buffer of planes, codes first
// (core/group_quant.h): row_bytes() is the stride of the codes, bytes() the whole buffer.
// FP8W weights likewise: E4M3 codes with padded rows, then a scale per row (core/fp8_weight.h).
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  // W4G/W8G only: columns per scale group (== cols for one group per row), and which
  // optional planes follow the scales.
  int64_t group_size = 0;
  bool gq_zeros = false;
  bool gq_perm = false;

  GroupQuantLayout gq_layout() const {
    return GroupQuantLayout::make(dtype == DType::W8G ? 8 : 4, rows, cols, group_size, gq_zeros, gq_perm);
  }
  Fp8WeightLayout fp8_layout() const { return Fp8WeightLayout::make(rows, cols); }
  int64_t row_bytes() const {
    if (is_fp8_weight(dtype)) return fp8_layout().row_bytes;
    return is_group_quant(dtype) ? gq_layout().code_row_bytes : dtype_row_bytes(dtype, cols);
  }
  int64_t bytes() const {
    if (is_fp8_weight(dtype)) return fp8_layout().total_bytes;
    return is_group_quant(dtype) ? gq_layout().total_bytes : rows * row_bytes();
  }
  // FP8W: the per-row scales, after the codes.
  const float* fp8_scales() const {
    return reinterpret_cast<const float*>(static_cast<const uint8_t*>(data) + fp8_layout().off_scales);
  }
};

// One output of a matmul that shares its input with others (Q, K, V; gate, up):
// y[t * ldy + r] = sum_k x[t * ldx + k] * W[r, k] for t < n_rows, r < w.rows.
struct MatmulTarget {
  WeightMatrix w;
  float* y = nullptr;
  int64_t ldy = 0;
};

}  // namespace tessera
