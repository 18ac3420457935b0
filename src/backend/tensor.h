#pragma once
// Views of device memory handed to backend ops. A view does not own memory: weights belong to
// the model (read-only, shared), activations and KV to the run.
#include <cstdint>

#include "core/dtype.h"

namespace tessera {

// A 2-D weight stored in its own format: `rows` output features, each of `cols` elements,
// rows contiguous with stride dtype_row_bytes(dtype, cols). For GGUF, rows = shape[1] and
// cols = shape[0].
struct WeightMatrix {
  const void* data = nullptr;
  DType dtype = DType::F32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_bytes() const { return dtype_row_bytes(dtype, cols); }
};

// One output of a matmul that shares its input with others (Q, K, V; gate, up):
// y[t * ldy + r] = sum_k x[t * ldx + k] * W[r, k] for t < n_rows, r < w.rows.
struct MatmulTarget {
  WeightMatrix w;
  float* y = nullptr;
  int64_t ldy = 0;
};

}  // namespace tessera
