// Portable kernels for group-quantized weights (W4G/W8G): the fallback and the readable
// definition of what the AVX2 kernels compute bit for bit (matmul_kernels.h).
#include <cmath>

#include "backend/cpu/matmul_kernels.h"
#include "core/fp16.h"

namespace tessera::mm {

namespace {

template <int kBits>
int code_at(const uint8_t* row, int64_t b, int j) {
  if constexpr (kBits == 8) {
    return row[b * 32 + j];
  } else {
    const uint8_t byte = row[b * 16 + (j & 15)];
    return j < 16 ? byte & 0x0F : byte >> 4;
  }
}

template <int kBits>
void gq_matmul_scalar(const MatmulTask& t) {
  const ActLayout& l = *t.act_layout;
  const int64_t n_blocks = l.cols / 32;
  const int zero_default = 1 << (kBits - 1);
  for (int64_t r = 0; r < t.n_w; ++r) {
    const uint8_t* row = t.w + r * t.w_stride;
    for (int64_t x = 0; x < t.n_x; ++x) {
      const ActRow a = act_row(t.act, l, x);
      float acc = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t g = b * 32 / t.gq_group;
        const int zero = t.gq_zeros ? t.gq_zeros[g * t.gq_ld + r] : zero_default;
        int32_t isum = 0;
        for (int j = 0; j < 32; ++j) isum += (code_at<kBits>(row, b, j) - zero) * a.qs[b * 32 + j];
        const float scale = fp16_to_f32(t.gq_scales[g * t.gq_ld + r]);
        acc = std::fmaf(scale * a.d32[b], static_cast<float>(isum), acc);
      }
      t.y[x * t.ldy + r] = acc;
    }
  }
}

}  // namespace

void gq_matmul_scalar_w4(const MatmulTask& t) { gq_matmul_scalar<4>(t); }
void gq_matmul_scalar_w8(const MatmulTask& t) { gq_matmul_scalar<8>(t); }

}  // namespace tessera::mm
