// FP8W weights (E4M3 codes, an f32 scale per row; core/fp8_weight.h) on the CPU: the
// reference path. Each weight row is decoded to f32 through the 256-entry table once per
// work item and dotted with every input row in f32, in a fixed order (8 interleaved partial
// sums, then summed pairwise), so an output does not depend on the batch, the split over
// threads or its neighbours; the row's scale multiplies the finished sum.
#include <vector>

#include "backend/cpu/matmul_kernels.h"
#include "quant/fp8_weight.h"

namespace tessera::mm {

void fp8_matmul_scalar(const MatmulTask& t) {
  const float* table = e4m3_table();
  thread_local std::vector<float> w;
  w.resize(static_cast<size_t>((t.cols + 7) / 8 * 8));
  const int64_t full = t.cols / 8 * 8;
  for (int64_t r = 0; r < t.n_w; ++r) {
    const uint8_t* codes = t.w + r * t.w_stride;
    for (int64_t k = 0; k < t.cols; ++k) w[k] = table[codes[k]];
    const float scale = t.fp8_scales[r];
    for (int64_t i = 0; i < t.n_x; ++i) {
      const float* x = t.x + i * t.ldx;
      float acc[8] = {};
      for (int64_t k = 0; k < full; k += 8)
        for (int j = 0; j < 8; ++j) acc[j] += w[k + j] * x[k + j];
      for (int64_t k = full; k < t.cols; ++k) acc[k - full] += w[k] * x[k];
      const float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      t.y[i * t.ldy + r] = s * scale;
    }
  }
}

}  // namespace tessera::mm
