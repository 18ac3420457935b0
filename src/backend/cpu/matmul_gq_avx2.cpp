// AVX2 kernels for group-quantized weights (W4G/W8G). Eight weight rows at a time, one f32
// lane per row: per 32-column block each row's codes are unpacked in registers and dotted with
// the Q8 activation block (maddubs), the 8 rows' i32 sums reduced into one vector, the zero
// points taken out through the activation's exact block sum, and one FMA per block advances
// all 8 outputs in the canonical order (bitwise the scalar kernel's result).
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"

namespace tessera::mm {

namespace {

// 32 codes of a row's block b as unsigned bytes in column order.
template <int kBits>
inline __m256i block_codes(const uint8_t* row, int64_t b) {
  if constexpr (kBits == 8)
    return load256(row + b * 32);
  else
    return nibbles_32(row + b * 16);
}

// i32 partial sums (8 lanes) of codes · x for one block. W8: codes - 128 with the sign trick
// (|w| · sign(x, w) keeps maddubs' i16 pairs in range); the 128 comes back through sum(x).
template <int kBits>
inline __m256i block_dot(__m256i codes, __m256i x) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (kBits == 8) {
    const __m256i w = _mm256_xor_si256(codes, _mm256_set1_epi8(static_cast<char>(0x80)));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)), ones);
  } else {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, x), ones);
  }
}

// The first n (<= 8) entries of p as lanes, the rest repeat the last one (never read past p[n-1]).
inline __m256 load_scales8(const uint16_t* p, int n) {
  if (n == 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  uint16_t tmp[8];
  for (int i = 0; i < 8; ++i) tmp[i] = p[std::min(i, n - 1)];
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tmp)));
}
inline __m256i load_zeros8(const uint8_t* p, int n) {
  if (n == 8) return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  uint8_t tmp[16] = {};
  for (int i = 0; i < 8; ++i) tmp[i] = p[std::min(i, n - 1)];
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(tmp)));
}

// Prefill: the 8 rows' codes of every block transposed once into the task's scratch, so that
// one register holds 4 consecutive codes of each row ([block][step][row][4 bytes]; W8 stored
// as code - 128). A broadcast of 4 activation bytes times that register advances all 8 rows'
// sums in their own lanes: no horizontal reduction per block and input row.
template <int kBits>
void build_panel(const uint8_t* const rows[8], int64_t n_blocks, uint8_t* panel) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    __m256i r[8], out[8];
    for (int i = 0; i < 8; ++i) {
      r[i] = block_codes<kBits>(rows[i], b);
      if constexpr (kBits == 8) r[i] = _mm256_xor_si256(r[i], _mm256_set1_epi8(static_cast<char>(0x80)));
    }
    transpose_8x8(r, out);
    for (int s = 0; s < 8; ++s) _mm256_store_si256(reinterpret_cast<__m256i*>(panel + (b * 8 + s) * 32), out[s]);
  }
}

template <int kBits>
inline __m256i panel_block_sum(const uint8_t* panel_block, const int8_t* xq) {
  const __m256i ones = _mm256_set1_epi16(1);
  auto step = [&](int s) {
    int32_t x4;
    std::memcpy(&x4, xq + 4 * s, 4);
    const __m256i xs = _mm256_set1_epi32(x4);
    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel_block + 32 * s));
    if constexpr (kBits == 8)
      return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(xs, w)), ones);
    else
      return _mm256_maddubs_epi16(w, xs);  // 4-bit: 8 steps of pairs <= 2*15*128 stay in i16
  };
  if constexpr (kBits == 8) {
    __m256i acc = step(0);
    for (int s = 1; s < 8; ++s) acc = _mm256_add_epi32(acc, step(s));
    return acc;
  } else {
    __m256i acc = step(0);
    for (int s = 1; s < 8; ++s) acc = _mm256_add_epi16(acc, step(s));
    return _mm256_madd_epi16(acc, ones);
  }
}

// The same for two input rows at once: each panel register loaded once for both.
template <int kBits>
inline void panel_block_sum2(const uint8_t* panel_block, const int8_t* x0, const int8_t* x1, __m256i* s0, __m256i* s1) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a0 = _mm256_setzero_si256(), a1 = _mm256_setzero_si256();
  for (int s = 0; s < 8; ++s) {
    int32_t v0, v1;
    std::memcpy(&v0, x0 + 4 * s, 4);
    std::memcpy(&v1, x1 + 4 * s, 4);
    const __m256i xs0 = _mm256_set1_epi32(v0), xs1 = _mm256_set1_epi32(v1);
    const __m256i w = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel_block + 32 * s));
    if constexpr (kBits == 8) {
      const __m256i wa = _mm256_sign_epi8(w, w);
      a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xs0, w)), ones));
      a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_maddubs_epi16(wa, _mm256_sign_epi8(xs1, w)), ones));
    } else {
      a0 = _mm256_add_epi16(a0, _mm256_maddubs_epi16(w, xs0));
      a1 = _mm256_add_epi16(a1, _mm256_maddubs_epi16(w, xs1));
    }
  }
  if constexpr (kBits == 4) {
    a0 = _mm256_madd_epi16(a0, ones);
    a1 = _mm256_madd_epi16(a1, ones);
  }
  *s0 = a0;
  *s1 = a1;
}

// Decode, W4: two rows' 16 code bytes in one register (row 2p low lane, 2p+1 high), so one
// mask and one shift unpack both, each lane dotted with the matching half of the activation
// block; a 3-hadd tree gives the 8 rows' sums in order (GGUF Q4_0's direct kernel's trick).
inline __m256i direct_block_sum_w4(const uint8_t* const rows[8], int64_t b, const int8_t* xq) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const __m128i* xb = reinterpret_cast<const __m128i*>(xq);
  const __m256i xlo = _mm256_broadcastsi128_si256(_mm_loadu_si128(xb));
  const __m256i xhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(xb + 1));
  __m256i part[4];
  for (int p = 0; p < 4; ++p) {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[2 * p] + b * 16));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[2 * p + 1] + b * 16));
    const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
    const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    part[p] = _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi)), ones);
  }
  const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(part[0], part[1]), _mm256_hadd_epi32(part[2], part[3]));
  return _mm256_permutevar8x32_epi32(h, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

template <int kBits>
void gq_matmul_avx2(const MatmulTask& t) {
  const ActLayout& l = *t.act_layout;
  const int64_t n_blocks = l.cols / 32;
  // isum = raw + (bias - zero) * sum(x): raw is sum codes * x (W4) or (codes - 128) * x (W8).
  const int32_t bias = kBits == 8 ? 128 : 0;
  const __m256i zero_default = _mm256_set1_epi32(1 << (kBits - 1));
  for (int64_t r0 = 0; r0 < t.n_w; r0 += 8) {
    const int nr = static_cast<int>(std::min<int64_t>(8, t.n_w - r0));
    const uint8_t* rows[8];
    for (int i = 0; i < 8; ++i) rows[i] = t.w + (r0 + std::min(i, nr - 1)) * t.w_stride;
    // Prefill: codes transposed once (panel_bytes), then per group the rows' scales (f32) and
    // zero - bias (i32), read by every input row.
    const bool panel = t.scratch != nullptr && t.n_x >= 4;
    const int64_t n_groups = (t.cols + t.gq_group - 1) / t.gq_group;  // of the real width, not the padded
    float* group_scales = panel ? reinterpret_cast<float*>(t.scratch + n_blocks * 256) : nullptr;
    int32_t* group_zeros = panel ? reinterpret_cast<int32_t*>(group_scales + 8 * n_groups) : nullptr;
    auto group_vectors = [&](int64_t g, __m256* scale, __m256i* zero_minus_bias) {
      *scale = load_scales8(t.gq_scales + g * t.gq_ld + r0, nr);
      const __m256i z = t.gq_zeros ? load_zeros8(t.gq_zeros + g * t.gq_ld + r0, nr) : zero_default;
      *zero_minus_bias = _mm256_sub_epi32(z, _mm256_set1_epi32(bias));
    };
    if (panel) {
      build_panel<kBits>(rows, n_blocks, t.scratch);
      for (int64_t g = 0; g < n_groups; ++g) {
        __m256 sc;
        __m256i zb;
        group_vectors(g, &sc, &zb);
        _mm256_store_ps(group_scales + 8 * g, sc);
        _mm256_store_si256(reinterpret_cast<__m256i*>(group_zeros + 8 * g), zb);
      }
    }
    auto store = [&](int64_t x, __m256 acc) {
      float* y = t.y + x * t.ldy + r0;
      if (nr == 8) {
        _mm256_storeu_ps(y, acc);
      } else {
        float out[8];
        _mm256_storeu_ps(out, acc);
        std::memcpy(y, out, sizeof(float) * nr);
      }
    };
    int64_t x = 0;
    if (panel) {  // input rows in pairs
      for (; x + 1 < t.n_x; x += 2) {
        const ActRow a0 = act_row(t.act, l, x), a1 = act_row(t.act, l, x + 1);
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
        for (int64_t b = 0; b < n_blocks; ++b) {
          const int64_t g = b * 32 / t.gq_group;
          const __m256 scale = _mm256_load_ps(group_scales + 8 * g);
          const __m256i zero_minus_bias = _mm256_load_si256(reinterpret_cast<const __m256i*>(group_zeros + 8 * g));
          __m256i s0, s1;
          panel_block_sum2<kBits>(t.scratch + b * 256, a0.qs + b * 32, a1.qs + b * 32, &s0, &s1);
          s0 = _mm256_sub_epi32(s0, _mm256_mullo_epi32(zero_minus_bias, _mm256_set1_epi32(a0.sum32[b])));
          s1 = _mm256_sub_epi32(s1, _mm256_mullo_epi32(zero_minus_bias, _mm256_set1_epi32(a1.sum32[b])));
          acc0 = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(a0.d32[b])), _mm256_cvtepi32_ps(s0), acc0);
          acc1 = _mm256_fmadd_ps(_mm256_mul_ps(scale, _mm256_set1_ps(a1.d32[b])), _mm256_cvtepi32_ps(s1), acc1);
        }
        store(x, acc0);
        store(x + 1, acc1);
      }
    }
    for (; x < t.n_x; ++x) {
      const ActRow a = act_row(t.act, l, x);
      __m256 acc = _mm256_setzero_ps();
      int64_t g_cur = -1;
      __m256 scale = _mm256_setzero_ps();
      __m256i zero_minus_bias = _mm256_setzero_si256();
      for (int64_t b = 0; b < n_blocks; ++b) {
        const int64_t g = b * 32 / t.gq_group;
        if (g != g_cur) {
          g_cur = g;
          if (panel) {
            scale = _mm256_load_ps(group_scales + 8 * g);
            zero_minus_bias = _mm256_load_si256(reinterpret_cast<const __m256i*>(group_zeros + 8 * g));
          } else {
            group_vectors(g, &scale, &zero_minus_bias);
          }
        }
        __m256i isum;
        if (panel) {
          isum = panel_block_sum<kBits>(t.scratch + b * 256, a.qs + b * 32);
        } else if constexpr (kBits == 4) {
          if ((b & 3) == 0)  // the rows' next lines, 16 blocks ahead (short streams prefetch late)
            for (int i = 0; i < 8; ++i)
              _mm_prefetch(reinterpret_cast<const char*>(rows[i] + (b + 16) * 16), _MM_HINT_T0);
          isum = direct_block_sum_w4(rows, b, a.qs + b * 32);
        } else {
          const __m256i xq = load256(a.qs + b * 32);
          __m256i p[8];
          for (int i = 0; i < 8; ++i) p[i] = block_dot<kBits>(block_codes<kBits>(rows[i], b), xq);
          isum = hsum8x8_i32(p);
        }
        isum = _mm256_sub_epi32(isum, _mm256_mullo_epi32(zero_minus_bias, _mm256_set1_epi32(a.sum32[b])));
        const __m256 d = _mm256_mul_ps(scale, _mm256_set1_ps(a.d32[b]));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(isum), acc);
      }
      store(x, acc);
    }
  }
}

}  // namespace

void gq_matmul_avx2_w4(const MatmulTask& t) { gq_matmul_avx2<4>(t); }
void gq_matmul_avx2_w8(const MatmulTask& t) { gq_matmul_avx2<8>(t); }

}  // namespace tessera::mm
