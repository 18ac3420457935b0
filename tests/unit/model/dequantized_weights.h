// Test helper: a copy of quantized model weights with every group-quantized (W4G/W8G) or FP8W
// linear layer decoded to f32, so a model run on it is the reference for the quantized kernels.
#pragma once

#include <memory>

#include "model/model.h"
#include "quant/fp8_weight.h"
#include "quant/group_quant.h"

namespace tessera::testing_util {

inline std::shared_ptr<ModelWeights> dequantized_copy(const ModelWeights& q) {
  auto f = std::make_shared<ModelWeights>(q);
  auto decode = [&](WeightMatrix& m) {
    if (!is_group_quant(m.dtype) && !is_fp8_weight(m.dtype)) return;
    float* out = f->make_f32(static_cast<size_t>(m.rows * m.cols));  // [rows][cols]
    if (is_fp8_weight(m.dtype)) {
      for (int64_t r = 0; r < m.rows; ++r)
        fp8_dequantize_row(m.fp8_layout(), static_cast<const uint8_t*>(m.data), r, out + r * m.cols);
      m = WeightMatrix{out, DType::F32, m.rows, m.cols};
      return;
    }
    const GroupQuantLayout l = m.gq_layout();
    for (int64_t r = 0; r < m.rows; ++r) gq_dequantize_row(l, static_cast<const uint8_t*>(m.data), r, out + r * m.cols);
    m = WeightMatrix{out, DType::F32, m.rows, m.cols};
  };
  for (LayerWeights& L : f->layers)
    for (WeightMatrix* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) decode(*m);
  decode(f->output);
  return f;
}

}  // namespace tessera::testing_util
