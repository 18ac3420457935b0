#pragma once
// GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for Generative
// Pre-trained Transformers"): one linear layer's weights quantized column by column onto the
// group grid (quant/group_quant.h), each column's rounding error spread over the columns not
// yet quantized through the inverse Hessian of the layer's calibration inputs, H = 2·XᵀX.
// docs/design/weight-quant.md ("GPTQ") has the details and where they follow the reference.
#include <cstdint>
#include <vector>

#include "quant/group_quant.h"

namespace tessera {

struct GptqOptions {
  int bits = 4;
  int64_t group_size = 128;  // a multiple of 32, or the row length (one group per row)
  bool asymmetric = false;
  double damp = 0.01;      // λ = damp · mean(diag H) added to the diagonal
  bool act_order = false;  // columns in descending diag(H) order, written with g_idx
  int64_t block = 128;     // columns per lazy-update block
};

// What every matrix reading the same inputs shares: the processing order and the upper
// Cholesky factor U of (H + λI)⁻¹ (U rows are the "Hinv" rows of the paper's Algorithm 1).
struct GptqHessian {
  int64_t cols = 0;
  std::vector<int32_t> order;  // [cols] processing position i holds input column order[i]
  std::vector<uint8_t> dead;   // [cols] 1 where diag(H) == 0: the column is zeroed
  std::vector<double> u;       // [cols][cols] upper triangular, in processing order
};

// h: [cols][cols] the (symmetric) Hessian 2·XᵀX, or XᵀX (the scale does not matter to GPTQ).
// Throws tessera::Error when H + λI is not positive definite (raise damp).
GptqHessian gptq_prepare(const double* h, int64_t cols, double damp, bool act_order);

struct GptqResult {
  GroupQuantMatrix matrix;
  std::vector<uint8_t> codes;      // [rows][cols] in input-column order
  std::vector<int32_t> g_idx;      // [cols] group of each input column
  std::vector<float> dequantized;  // [rows][cols] Q(W), input-column order
};

// w: [rows][cols] f32. Rows run in parallel over `threads` (0: hardware concurrency).
GptqResult gptq_quantize(const float* w, int64_t rows, int64_t cols, const GptqHessian& h, const GptqOptions& o,
                         int threads = 0);

}  // namespace tessera
