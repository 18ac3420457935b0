// Scalar reference codecs of the K-quants (256-element super-blocks): Q4_K, Q5_K, Q6_K and
// the activation format Q8_K. The quantizers are GGML's reference ones without an importance
// matrix (quantize_row_*_ref): a weighted least-squares search for each sub-block's scale
// (and min), then the scales themselves quantized to 6 or 8 bits against one fp16 super-scale,
// then every element re-rounded against its final sub-block scale. Every float operation is
// in GGML's order so that the bytes are identical (see quant.cpp on FMA contraction).
#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "quant/quant.h"

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tessera {

namespace {

constexpr float kGroupMaxEps = 1e-15f;  // below this a group counts as all zero (GGML)

// GGML's nearest_int: adding 1.5 * 2^23 leaves round(x) (ties to even, the FPU's mode) in
// the low mantissa bits. Valid for |x| <= 2^22, which every caller's scaling guarantees.
inline int nearest_int(float x) {
  const float biased = x + 12582912.f;
  int32_t bits;
  std::memcpy(&bits, &biased, sizeof bits);
  return (bits & 0x007fffff) - 0x00400000;
}

inline int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// GGML's make_qkx2_quants (use_mad = false): fits x[i] ~ scale * L[i] - the_min with
// L in [0, nmax] and the_min >= 0, minimizing sum(w * err^2). Starts from the min/max grid,
// then tries nstep + 1 grids with nmax + rmin + rdelta * is levels over the range, refitting
// scale and min by least squares on each and keeping the best. Returns the scale.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min, uint8_t* Laux,
                       float rmin, float rdelta, int nstep) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = static_cast<uint8_t>(clamp_int(l, 0, nmax));
    float diff = scale * static_cast<float>(L[i]) + min - x[i];
    diff = diff * diff;
    best_error += weights[i] * diff;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      const float w = weights[i];
      const float lf = static_cast<float>(l);
      sum_l += w * lf;
      sum_l2 += w * lf * lf;
      sum_xl += w * lf * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {  // a positive offset is not representable: refit scale alone
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        diff = diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// GGML's make_qx_quants with rmse_type = 1 and no importance weights: symmetric fit
// x[i] ~ scale * (L[i] - nmax), L in [0, 2*nmax), weights x^2. Tries 19 grids around nmax
// levels per max and keeps the one maximizing (sum w x l)^2 / sum w l^2. Returns the scale.
float make_qx_quants_rmse1(int n, int nmax, const float* x, int8_t* L) {
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float lf = static_cast<float>(l);
    sumlx += w * x[i] * lf;
    suml2 += w * lf * lf;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      const float lf = static_cast<float>(l);
      sumlx += w * x[i] * lf;
      suml2 += w * lf * lf;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        L[i] = static_cast<int8_t>(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Shared first half of Q4_K/Q5_K quantization of one super-block: per-32 scale/min search,
// 6-bit packing of both against fp16 d/dmin, and the final levels L[256] in [0, nmax].
void quantize_scales_mins_k(const float* x, int nmax, float rmin, int nstep, uint16_t* d_out, uint16_t* dmin_out,
                            uint8_t packed[kKScaleBytes], uint8_t L[kQK_K]) {
  constexpr int kSub = kQK_K / 32;
  float scales[kSub], mins[kSub], weights[32];
  uint8_t Laux[32];
  float max_scale = 0;  // mins are subtracted, so scales are positive
  float max_min = 0;
  for (int j = 0; j < kSub; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }

  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < kSub; ++j) {
    // GGML stores nearest_int into a uint8_t first (wrapping), then clamps to 63.
    uint8_t ls = static_cast<uint8_t>(nearest_int(inv_scale * scales[j]));
    uint8_t lm = static_cast<uint8_t>(nearest_int(inv_min * mins[j]));
    ls = ls < 63 ? ls : 63;
    lm = lm < 63 ? lm : 63;
    if (j < 4) {
      packed[j] = ls;
      packed[j + 4] = lm;
    } else {
      packed[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      packed[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      packed[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  *d_out = f32_to_fp16(max_scale / 63.f);
  *dmin_out = f32_to_fp16(max_min / 63.f);

  // Re-round every element against the scale and min it will actually be decoded with.
  for (int j = 0; j < kSub; ++j) {
    uint8_t sc, m;
    unpack_scale_min_k4(j, packed, &sc, &m);
    const float d = fp16_to_f32(*d_out) * static_cast<float>(sc);
    if (d == 0) continue;  // keeps the search's levels, as GGML does
    const float dm = fp16_to_f32(*dmin_out) * static_cast<float>(m);
    for (int ii = 0; ii < 32; ++ii) {
      L[32 * j + ii] = static_cast<uint8_t>(clamp_int(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax));
    }
  }
}

}  // namespace

void unpack_scale_min_k4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  // Bytes 0-3: low 6 bits = scale of sub-blocks 0-3, top 2 bits = high bits of scale 4-7.
  // Bytes 4-7: the same for the mins. Bytes 8-11: low nibble scale 4-7, high nibble min 4-7.
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *min = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// ---------------------------------------------------------------------------- dequantize

// Sub-blocks 2k and 2k+1 share qs[32k .. 32k+32): low nibbles, then high nibbles.
void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* q = x[i].qs;
    const float d = fp16_to_f32(x[i].d);
    const float min = fp16_to_f32(x[i].dmin);
    for (int j = 0, is = 0; j < kQK_K; j += 64, is += 2, q += 32) {
      uint8_t sc, m;
      unpack_scale_min_k4(is, x[i].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      unpack_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

// As Q4_K, plus a 5th bit per element: bit 2k (2k+1) of qh[l] for sub-block 2k (2k+1).
void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const uint8_t* ql = x[i].qs;
    const uint8_t* qh = x[i].qh;
    const float d = fp16_to_f32(x[i].d);
    const float min = fp16_to_f32(x[i].dmin);
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0, is = 0; j < kQK_K; j += 64, is += 2, ql += 32) {
      uint8_t sc, m;
      unpack_scale_min_k4(is, x[i].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc), m1 = min * static_cast<float>(m);
      unpack_scale_min_k4(is + 1, x[i].scales, &sc, &m);
      const float d2 = d * static_cast<float>(sc), m2 = min * static_cast<float>(m);
      for (int l = 0; l < 32; ++l) {
        *y++ = d1 * static_cast<float>((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        *y++ = d2 * static_cast<float>((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
      }
      u1 = static_cast<uint8_t>(u1 << 2);
      u2 = static_cast<uint8_t>(u2 << 2);
    }
  }
}

// Each 128-element half: ql[0..64) and qh[0..32) hold four 32-runs; element l + 32k takes
// its low nibble from ql[l + 32(k&1)] (low nibble for k < 2, high for k >= 2) and its top
// two bits from qh[l] bits 2k..2k+1. Scales are per 16 elements.
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = fp16_to_f32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    for (int half = 0; half < kQK_K; half += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        // (d * scale) * q, left to right as in GGML
        y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void dequantize_row_q8_k(const BlockQ8_K* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    for (int j = 0; j < kQK_K; ++j) y[i * kQK_K + j] = x[i].d * static_cast<float>(x[i].qs[j]);
  }
}

// ------------------------------------------------------------------------------ quantize

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n) {
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    quantize_scales_mins_k(x, 15, -1.f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* q = y[i].qs;
    for (int j = 0; j < kQK_K; j += 64, q += 32) {
      for (int l = 0; l < 32; ++l) q[l] = static_cast<uint8_t>(L[j + l] | (L[j + l + 32] << 4));
    }
  }
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n) {
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    quantize_scales_mins_k(x, 31, -0.5f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
    uint8_t* qh = y[i].qh;
    uint8_t* ql = y[i].qs;
    std::memset(qh, 0, sizeof y[i].qh);
    uint8_t m1 = 1, m2 = 2;
    for (int base = 0; base < kQK_K; base += 64, ql += 32) {
      for (int j = 0; j < 32; ++j) {
        int l1 = L[base + j];
        if (l1 > 15) {
          l1 -= 16;
          qh[j] |= m1;
        }
        int l2 = L[base + j + 32];
        if (l2 > 15) {
          l2 -= 16;
          qh[j] |= m2;
        }
        ql[j] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
      m1 = static_cast<uint8_t>(m1 << 2);
      m2 = static_cast<uint8_t>(m2 << 2);
    }
  }
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n) {
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float max_scale = 0;
    float max_abs_scale = 0;
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const float scale = make_qx_quants_rmse1(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      if (std::fabs(scale) > max_abs_scale) {
        max_abs_scale = std::fabs(scale);
        max_scale = scale;
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }

    const float iscale = -128.f / max_scale;
    y[i].d = f32_to_fp16(1 / iscale);
    for (int ib = 0; ib < kQK_K / 16; ++ib) {
      const int s = nearest_int(iscale * scales[ib]);
      y[i].scales[ib] = static_cast<int8_t>(s < 127 ? s : 127);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      const float d = fp16_to_f32(y[i].d) * static_cast<float>(y[i].scales[j]);
      if (d == 0) continue;  // keeps the search's levels, as GGML does
      for (int ii = 0; ii < 16; ++ii) {
        const int l = clamp_int(nearest_int(x[16 * j + ii] / d), -32, 31);
        L[16 * j + ii] = static_cast<int8_t>(l + 32);
      }
    }

    uint8_t* ql = y[i].ql;
    uint8_t* qh = y[i].qh;
    for (int j = 0; j < kQK_K; j += 128, ql += 64, qh += 32) {
      for (int l = 0; l < 32; ++l) {
        const int q1 = L[j + l + 0] & 0xF;
        const int q2 = L[j + l + 32] & 0xF;
        const int q3 = L[j + l + 64] & 0xF;
        const int q4 = L[j + l + 96] & 0xF;
        ql[l] = static_cast<uint8_t>(q1 | (q3 << 4));
        ql[l + 32] = static_cast<uint8_t>(q2 | (q4 << 4));
        qh[l] = static_cast<uint8_t>((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                                     ((L[j + l + 96] >> 4) << 6));
      }
    }
  }
}

// Activation format: d = max / -127 in f32 (sign of the largest-magnitude element), so that
// element is -127 exactly; bsums[k] = sum of qs[16k .. 16k+16).
void quantize_row_q8_k(const float* x, BlockQ8_K* y, int64_t n) {
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float max = 0;
    float amax = 0;
    for (int j = 0; j < kQK_K; ++j) {
      const float ax = std::fabs(x[j]);
      if (ax > amax) {
        amax = ax;
        max = x[j];
      }
    }
    if (amax == 0) {
      // GGML leaves bsums unwritten here; zero is the only consistent value.
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[j * 16 + ii];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

}  // namespace tessera
