// Portable kernels: the fallback on CPUs without AVX2 and the readable statement of what the
// SIMD kernels compute, bit for bit (matmul_kernels.h, "The canonical order"). Block dots are
// exact integer sums per block, scaled in f32.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_kernels.h"
#include "core/error.h"
#include "core/fp16.h"
#include "quant/blocks.h"

namespace tessera::mm {

namespace {

float h2f(uint16_t h) { return fp16_to_f32(h); }
float fp16_round(float f) { return fp16_to_f32(f32_to_fp16(f)); }

// ---- activation quantizers (GGML numerics, see matmul_kernels.h) --------------------------

void quantize_q8_scalar(const float* x, uint8_t* row, const ActLayout& l) {
  int8_t* qs = reinterpret_cast<int8_t*>(row);
  float* d32 = reinterpret_cast<float*>(row + l.off_d32);
  float* s32 = reinterpret_cast<float*>(row + l.off_s32);
  int32_t* sum32 = reinterpret_cast<int32_t*>(row + l.off_sum32);
  for (int64_t b = 0; b < l.cols / 32; ++b) {
    const float* xb = x + b * 32;
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.f;
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      const int q = static_cast<int>(std::nearbyint(xb[j] * id));
      qs[b * 32 + j] = static_cast<int8_t>(q);
      sum += q;
    }
    d32[b] = fp16_round(d);
    s32[b] = fp16_round(d * static_cast<float>(sum));
    sum32[b] = sum;
  }
}

void quantize_q8k_scalar(const float* x, uint8_t* row, const ActLayout& l) {
  int8_t* qs = reinterpret_cast<int8_t*>(row);
  float* d32 = reinterpret_cast<float*>(row + l.off_d32);
  float* s32 = reinterpret_cast<float*>(row + l.off_s32);
  int32_t* sum32 = reinterpret_cast<int32_t*>(row + l.off_sum32);
  int32_t* sum16 = reinterpret_cast<int32_t*>(row + l.off_sum16);
  for (int64_t b = 0; b < l.cols / 256; ++b) {
    const float* xb = x + b * 256;
    int8_t* q = qs + b * 256;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; ++j) {
      const float ax = std::fabs(xb[j]);
      if (ax > amax) {
        amax = ax;
        max = xb[j];
      }
    }
    float d = 0.0f;
    if (amax == 0.0f) {
      std::memset(q, 0, 256);
    } else {
      const float iscale = -127.f / max;
      for (int j = 0; j < 256; ++j) {
        const int v = nearest_int_ggml(iscale * xb[j]);
        q[j] = static_cast<int8_t>(v < 127 ? v : 127);
      }
      d = 1.0f / iscale;
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += q[g * 16 + j];
      sum16[b * 16 + g] = s;
    }
    for (int g = 0; g < 8; ++g) {
      const int s = sum16[b * 16 + 2 * g] + sum16[b * 16 + 2 * g + 1];
      d32[b * 8 + g] = d;
      sum32[b * 8 + g] = s;
      s32[b * 8 + g] = d * static_cast<float>(s);
    }
  }
  finish_q8k_row(row, l);
}

// ---- block decoders to integers ------------------------------------------------------------
// Each writes the 32 (or 256) integer quants of a block in element order.

void ints_q4(const uint8_t* qs, int offset, int* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = (qs[j] & 0x0F) - offset;
    q[j + 16] = (qs[j] >> 4) - offset;
  }
}

void ints_q5(const uint8_t* qh_bytes, const uint8_t* qs, int offset, int* q) {
  uint32_t qh;
  std::memcpy(&qh, qh_bytes, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = ((qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - offset;
    q[j + 16] = ((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - offset;
  }
}

// GGML's get_scale_min_k4: 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block.
void scale_min_k4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K / Q5_K quants of a super-block (0..15 or 0..31), element order.
void ints_qk45(const uint8_t* qs, const uint8_t* qh, int* q) {
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      int lo = qs[c * 32 + l] & 0x0F, hi = qs[c * 32 + l] >> 4;
      if (qh) {
        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
      }
      q[c * 64 + l] = lo;
      q[c * 64 + 32 + l] = hi;
    }
  }
}

// Q6_K quants of a super-block minus 32, element order.
void ints_q6k(const BlockQ6_K& b, int* q) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* ql = b.ql + half * 64;
    const uint8_t* qh = b.qh + half * 32;
    int* o = q + half * 128;
    for (int l = 0; l < 32; ++l) {
      o[l] = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
      o[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
      o[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      o[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
    }
  }
}

int dot32(const int* q, const int8_t* x) {
  int s = 0;
  for (int j = 0; j < 32; ++j) s += q[j] * x[j];
  return s;
}

// ---- kernels ---------------------------------------------------------------------------------
// The canonical order of matmul_kernels.h, spelled out with explicit fmaf (correctly rounded,
// so equal to the SIMD kernels' FMA instructions).

template <typename RowDot>
void for_each_output(const MatmulTask& t, RowDot dot) {
  for (int64_t r = 0; r < t.n_w; ++r) {
    const uint8_t* w = t.w + r * t.w_stride;
    for (int64_t i = 0; i < t.n_x; ++i) t.y[i * t.ldy + r] = dot(w, i);
  }
}

template <typename ToF32>
void kernel_float(const MatmulTask& t, ToF32 to_f32) {
  for_each_output(t, [&](const uint8_t* w, int64_t i) {
    const float* x = t.x + i * t.ldx;
    float acc[kLanes] = {};
    for (int64_t k = 0; k < t.cols; ++k) acc[k % kLanes] = std::fmaf(to_f32(w, k), x[k], acc[k % kLanes]);
    return sum8_canonical(acc);
  });
}

void kernel_f32(const MatmulTask& t) {
  kernel_float(t, [](const uint8_t* w, int64_t k) { return reinterpret_cast<const float*>(w)[k]; });
}
void kernel_f16(const MatmulTask& t) {
  kernel_float(t, [](const uint8_t* w, int64_t k) { return h2f(reinterpret_cast<const uint16_t*>(w)[k]); });
}
void kernel_bf16(const MatmulTask& t) {
  kernel_float(t, [](const uint8_t* w, int64_t k) { return bf16_to_f32(reinterpret_cast<const uint16_t*>(w)[k]); });
}

// 32-element block formats against Q8 activations: q holds the quants minus the zero point.
template <typename Block, bool kHasMin, typename Decode>
void kernel_q32(const MatmulTask& t, Decode decode) {
  const int64_t nb = t.cols / 32;
  for_each_output(t, [&](const uint8_t* wrow, int64_t i) {
    const Block* w = reinterpret_cast<const Block*>(wrow);
    const ActRow a = act_row(t.act, *t.act_layout, i);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      int q[32];
      float d, m;
      decode(w[b], q, &d, &m);
      acc = std::fmaf(d * a.d32[b], static_cast<float>(dot32(q, a.qs + b * 32)), acc);
      if constexpr (kHasMin) acc = std::fmaf(m, a.s32[b], acc);
    }
    return acc;
  });
}

void kernel_q4_0(const MatmulTask& t) {
  kernel_q32<BlockQ4_0, false>(t, [](const BlockQ4_0& b, int* q, float* d, float*) {
    ints_q4(b.qs, 8, q);
    *d = h2f(b.d);
  });
}
void kernel_q4_1(const MatmulTask& t) {
  kernel_q32<BlockQ4_1, true>(t, [](const BlockQ4_1& b, int* q, float* d, float* m) {
    ints_q4(b.qs, 0, q);
    *d = h2f(b.d);
    *m = h2f(b.m);
  });
}
void kernel_q5_0(const MatmulTask& t) {
  kernel_q32<BlockQ5_0, false>(t, [](const BlockQ5_0& b, int* q, float* d, float*) {
    ints_q5(b.qh, b.qs, 16, q);
    *d = h2f(b.d);
  });
}
void kernel_q5_1(const MatmulTask& t) {
  kernel_q32<BlockQ5_1, true>(t, [](const BlockQ5_1& b, int* q, float* d, float* m) {
    ints_q5(b.qh, b.qs, 0, q);
    *d = h2f(b.d);
    *m = h2f(b.m);
  });
}
void kernel_q8_0(const MatmulTask& t) {
  kernel_q32<BlockQ8_0, false>(t, [](const BlockQ8_0& b, int* q, float* d, float*) {
    for (int j = 0; j < 32; ++j) q[j] = b.qs[j];
    *d = h2f(b.d);
  });
}

// Q4_K / Q5_K: per super-block isum = sum_j sc_j * (q_j . x_j) and msum = sum_j m_j * sum(x_j)
// in integers; y = sum of d*dx*isum - dmin*dx*msum over super-blocks.
template <typename Block>
void kernel_qk45(const MatmulTask& t) {
  const int64_t nb = t.cols / 256;
  for_each_output(t, [&](const uint8_t* wrow, int64_t i) {
    const Block* w = reinterpret_cast<const Block*>(wrow);
    const ActRow a = act_row(t.act, *t.act_layout, i);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      int q[256];
      if constexpr (std::is_same_v<Block, BlockQ5_K>) {
        ints_qk45(w[b].qs, w[b].qh, q);
      } else {
        ints_qk45(w[b].qs, nullptr, q);
      }
      int isum = 0, msum = 0;
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        scale_min_k4(j, w[b].scales, &sc, &m);
        isum += sc * dot32(q + j * 32, a.qs + b * 256 + j * 32);
        msum += m * a.sum32[b * 8 + j];
      }
      const float dx = a.d32[b * 8];
      acc = std::fmaf(h2f(w[b].d) * dx, static_cast<float>(isum), acc);
      acc = std::fmaf(-(h2f(w[b].dmin) * dx), static_cast<float>(msum), acc);
    }
    return acc;
  });
}

void kernel_q6_k(const MatmulTask& t) {
  const int64_t nb = t.cols / 256;
  for_each_output(t, [&](const uint8_t* wrow, int64_t i) {
    const BlockQ6_K* w = reinterpret_cast<const BlockQ6_K*>(wrow);
    const ActRow a = act_row(t.act, *t.act_layout, i);
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      int q[256];
      ints_q6k(w[b], q);
      int isum = 0;
      for (int g = 0; g < 16; ++g) {
        int s = 0;
        for (int j = 0; j < 16; ++j) s += q[g * 16 + j] * a.qs[b * 256 + g * 16 + j];
        isum += w[b].scales[g] * s;
      }
      acc = std::fmaf(h2f(w[b].d) * a.d32[b * 8], static_cast<float>(isum), acc);
    }
    return acc;
  });
}

}  // namespace

void dequantize_row_scalar(DType type, const uint8_t* src, float* dst, int64_t cols) {
  int q[256];
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, cols * 4);
      return;
    case DType::F16:
    case DType::BF16:
      for (int64_t k = 0; k < cols; ++k) {
        uint16_t h;
        std::memcpy(&h, src + 2 * k, 2);
        dst[k] = type == DType::F16 ? fp16_to_f32(h) : bf16_to_f32(h);
      }
      return;
    case DType::Q4_0:
      for (int64_t b = 0; b < cols / 32; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ4_0*>(src)[b];
        ints_q4(blk.qs, 8, q);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = q[j] * h2f(blk.d);
      }
      return;
    case DType::Q4_1:
      for (int64_t b = 0; b < cols / 32; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ4_1*>(src)[b];
        ints_q4(blk.qs, 0, q);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = q[j] * h2f(blk.d) + h2f(blk.m);
      }
      return;
    case DType::Q5_0:
      for (int64_t b = 0; b < cols / 32; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ5_0*>(src)[b];
        ints_q5(blk.qh, blk.qs, 16, q);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = q[j] * h2f(blk.d);
      }
      return;
    case DType::Q5_1:
      for (int64_t b = 0; b < cols / 32; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ5_1*>(src)[b];
        ints_q5(blk.qh, blk.qs, 0, q);
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = q[j] * h2f(blk.d) + h2f(blk.m);
      }
      return;
    case DType::Q8_0:
      for (int64_t b = 0; b < cols / 32; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ8_0*>(src)[b];
        for (int j = 0; j < 32; ++j) dst[b * 32 + j] = blk.qs[j] * h2f(blk.d);
      }
      return;
    case DType::Q4_K:
    case DType::Q5_K:
      for (int64_t b = 0; b < cols / 256; ++b) {
        const uint8_t* scales;
        uint16_t d, dmin;
        if (type == DType::Q4_K) {
          const auto& blk = reinterpret_cast<const BlockQ4_K*>(src)[b];
          ints_qk45(blk.qs, nullptr, q);
          scales = blk.scales, d = blk.d, dmin = blk.dmin;
        } else {
          const auto& blk = reinterpret_cast<const BlockQ5_K*>(src)[b];
          ints_qk45(blk.qs, blk.qh, q);
          scales = blk.scales, d = blk.d, dmin = blk.dmin;
        }
        for (int j = 0; j < 8; ++j) {
          int sc, m;
          scale_min_k4(j, scales, &sc, &m);
          const float dl = h2f(d) * sc, ml = h2f(dmin) * m;
          for (int e = 0; e < 32; ++e) dst[b * 256 + j * 32 + e] = dl * q[j * 32 + e] - ml;
        }
      }
      return;
    case DType::Q6_K:
      for (int64_t b = 0; b < cols / 256; ++b) {
        const auto& blk = reinterpret_cast<const BlockQ6_K*>(src)[b];
        ints_q6k(blk, q);
        for (int e = 0; e < 256; ++e) dst[b * 256 + e] = h2f(blk.d) * blk.scales[e / 16] * q[e];
      }
      return;
    default:
      break;
  }
  fail("dequantize_row: weight type ", dtype_name(type), " is not supported");
}

const KernelSet& scalar_kernel_set() {
  static const KernelSet set = {
      "scalar",
      quantize_q8_scalar,
      quantize_q8k_scalar,
      {kernel_f32, kernel_f16, kernel_bf16, kernel_q4_0, kernel_q4_1, kernel_q5_0, kernel_q5_1, kernel_q8_0,
       kernel_qk45<BlockQ4_K>, kernel_qk45<BlockQ5_K>, kernel_q6_k},
      {},
      1,
  };
  return set;
}

}  // namespace tessera::mm
