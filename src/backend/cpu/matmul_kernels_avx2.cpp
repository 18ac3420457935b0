// AVX2 + FMA + F16C: the activation quantizers and the direct kernels, which read weights in
// their GGUF layout (decode and small batches). Prefill panels: matmul_panel_avx2.cpp.
//
// Block dots follow GGML: unsigned weight bytes times signed activation bytes with
// _mm256_maddubs_epi16, pairs summed to i32 with _mm256_madd_epi16, one f32 FMA per block
// with the product of the two scales. Signed weights go through the sign trick
// (|w| times x carrying w's sign).
#include <immintrin.h>

#include <cstddef>
#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "quant/blocks.h"

namespace tessera::mm {

namespace {

inline float fp16_round(float f) { return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

inline float hsum8(__m256 v) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

inline int hsum_i32(__m256i v) {
  __m128i r = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
  r = _mm_add_epi32(r, _mm_shuffle_epi32(r, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(r);
}

inline float hmax_abs(__m256 m) {
  __m128 r = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
  r = _mm_max_ps(r, _mm_movehl_ps(r, r));
  r = _mm_max_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// 32 i32 (four vectors, element order) to 32 i8 with saturation, element order kept.
inline __m256i pack_i32_to_i8(__m256i i0, __m256i i1, __m256i i2, __m256i i3) {
  const __m256i a = _mm256_packs_epi32(i0, i1);
  const __m256i b = _mm256_packs_epi32(i2, i3);
  return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline __m256i round_to_i32(__m256 v) {
  return _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// i32 pair sums of u8 x s8 products, then to f32.
inline __m256 dot_u8s8_f32(__m256i u, __m256i s) {
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
inline __m256 dot_s8s8_f32(__m256i w, __m256i x) {
  return dot_u8s8_f32(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

}  // namespace

// ---- activation quantizers ---------------------------------------------------------------

void avx2_quantize_q8(const float* x, uint8_t* row, const ActLayout& l) {
  float* d32 = reinterpret_cast<float*>(row + l.off_d32);
  float* s32 = reinterpret_cast<float*>(row + l.off_s32);
  int32_t* sum32 = reinterpret_cast<int32_t*>(row + l.off_sum32);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < l.cols / 32; ++b) {
    const float* xb = x + b * 32;
    __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
    __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    const float amax = hmax_abs(m);
    const float d = amax / 127.f;
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.f / amax : 0.0f);
    const __m256i i0 = round_to_i32(_mm256_mul_ps(v0, id)), i1 = round_to_i32(_mm256_mul_ps(v1, id));
    const __m256i i2 = round_to_i32(_mm256_mul_ps(v2, id)), i3 = round_to_i32(_mm256_mul_ps(v3, id));
    const int sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(row + b * 32), pack_i32_to_i8(i0, i1, i2, i3));
    d32[b] = fp16_round(d);
    s32[b] = fp16_round(d * static_cast<float>(sum));
    sum32[b] = sum;
  }
}

void avx2_quantize_q8k(const float* x, uint8_t* row, const ActLayout& l) {
  float* d32 = reinterpret_cast<float*>(row + l.off_d32);
  float* s32 = reinterpret_cast<float*>(row + l.off_s32);
  int32_t* sum32 = reinterpret_cast<int32_t*>(row + l.off_sum32);
  int32_t* sum16 = reinterpret_cast<int32_t*>(row + l.off_sum16);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < l.cols / 256; ++b) {
    const float* xb = x + b * 256;
    uint8_t* q = row + b * 256;
    __m256 m = _mm256_setzero_ps();
    for (int k = 0; k < 256; k += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + k)));
    const float amax = hmax_abs(m);
    float d = 0.0f;
    if (amax == 0.0f) {
      std::memset(q, 0, 256);
      for (int g = 0; g < 16; ++g) sum16[b * 16 + g] = 0;
    } else {
      // GGML scales by the first element of largest magnitude, sign included.
      int first = 0;
      const __m256 va = _mm256_set1_ps(amax);
      for (int k = 0; k < 256; k += 8) {
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + k)), va, _CMP_EQ_OQ));
        if (mask) {
          first = k + __builtin_ctz(mask);
          break;
        }
      }
      const float iscale = -127.f / xb[first];
      const __m256 vs = _mm256_set1_ps(iscale);
      for (int k = 0; k < 256; k += 32) {
        const __m256i i0 = round_to_i32(_mm256_mul_ps(_mm256_loadu_ps(xb + k), vs));
        const __m256i i1 = round_to_i32(_mm256_mul_ps(_mm256_loadu_ps(xb + k + 8), vs));
        const __m256i i2 = round_to_i32(_mm256_mul_ps(_mm256_loadu_ps(xb + k + 16), vs));
        const __m256i i3 = round_to_i32(_mm256_mul_ps(_mm256_loadu_ps(xb + k + 24), vs));
        // Saturation to int8 is GGML's MIN(127, v); v >= -127 here.
        const __m256i packed = pack_i32_to_i8(i0, i1, i2, i3);
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + k), packed);
        // Group sums from the stored bytes (saturated values, as GGML sums them).
        const __m256i w16 = _mm256_maddubs_epi16(_mm256_set1_epi8(1), packed);  // 16 pair sums
        const __m256i w32 = _mm256_madd_epi16(w16, _mm256_set1_epi16(1));         // 8 quad sums
        alignas(32) int32_t quad[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(quad), w32);
        sum16[b * 16 + k / 16] = quad[0] + quad[1] + quad[2] + quad[3];
        sum16[b * 16 + k / 16 + 1] = quad[4] + quad[5] + quad[6] + quad[7];
      }
      d = 1.0f / iscale;
    }
    for (int g = 0; g < 8; ++g) {
      const int s = sum16[b * 16 + 2 * g] + sum16[b * 16 + 2 * g + 1];
      d32[b * 8 + g] = d;
      sum32[b * 8 + g] = s;
      s32[b * 8 + g] = d * static_cast<float>(s);
    }
  }
}

namespace {

// ---- direct kernels ------------------------------------------------------------------------
// Groups of NR weight rows share each activation block; every output is one row's block
// loop, so results do not depend on how rows are grouped or split between threads.

template <template <int> class Rows>
void for_row_groups(const MatmulTask& t) {
  int64_t r = 0;
  for (; r + 4 <= t.n_w; r += 4) Rows<4>::run(t, r);
  switch (t.n_w - r) {
    case 3: Rows<3>::run(t, r); break;
    case 2: Rows<2>::run(t, r); break;
    case 1: Rows<1>::run(t, r); break;
    default: break;
  }
}

// Float weights: F32, F16 (F16C), BF16 (shifted into the high half of an f32).
struct LoadF32 {
  static __m256 load8(const uint8_t* w, int64_t k) { return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + k); }
  static float load1(const uint8_t* w, int64_t k) { return reinterpret_cast<const float*>(w)[k]; }
};
struct LoadF16 {
  static __m256 load8(const uint8_t* w, int64_t k) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k)));
  }
  static float load1(const uint8_t* w, int64_t k) {
    uint16_t h;
    std::memcpy(&h, w + 2 * k, 2);
    return h2f(h);
  }
};
struct LoadBF16 {
  static __m256 load8(const uint8_t* w, int64_t k) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * k)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
  static float load1(const uint8_t* w, int64_t k) {
    uint16_t h;
    std::memcpy(&h, w + 2 * k, 2);
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

template <typename L>
struct FloatRows {
  template <int NR>
  struct R {
    static void run(const MatmulTask& t, int64_t r0) {
      const uint8_t* w[NR];
      for (int i = 0; i < NR; ++i) w[i] = t.w + (r0 + i) * t.w_stride;
      const int64_t k8 = t.cols / 8 * 8;
      for (int64_t j = 0; j < t.n_x; ++j) {
        const float* x = t.x + j * t.ldx;
        __m256 acc[NR];
        for (int i = 0; i < NR; ++i) acc[i] = _mm256_setzero_ps();
        for (int64_t k = 0; k < k8; k += 8) {
          const __m256 xv = _mm256_loadu_ps(x + k);
          for (int i = 0; i < NR; ++i) acc[i] = _mm256_fmadd_ps(L::load8(w[i], k), xv, acc[i]);
        }
        for (int i = 0; i < NR; ++i) {
          float s = hsum8(acc[i]);
          for (int64_t k = k8; k < t.cols; ++k) s += L::load1(w[i], k) * x[k];
          t.y[j * t.ldy + r0 + i] = s;
        }
      }
    }
  };
};

// Q5_0 / Q5_1 / Q8_0 (Q4_0 / Q4_1: Q4PairRows below). A policy gives the 32 weight bytes of
// a block (unsigned, or signed when kSigned), its scale and, when kHasMin, its offset m
// (times the activation's s).
struct PQ5_0 {
  using Block = BlockQ5_0;
  static constexpr bool kSigned = true, kHasMin = false;
  // q - 16 as a signed byte: the nibble where the 5th bit is set, nibble - 16 (0xF0 | nibble) where not.
  static __m256i quants(const Block& b) {
    return _mm256_or_si256(nibbles_32(b.qs), _mm256_andnot_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(static_cast<char>(0xF0))));
  }
};
struct PQ5_1 {
  using Block = BlockQ5_1;
  static constexpr bool kSigned = false, kHasMin = true;
  static __m256i quants(const Block& b) {
    return _mm256_or_si256(nibbles_32(b.qs), _mm256_and_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(0x10)));
  }
};
struct PQ8_0 {
  using Block = BlockQ8_0;
  static constexpr bool kSigned = true, kHasMin = false;
  static __m256i quants(const Block& b) { return load256(b.qs); }
};

inline uint32_t load_u32(const void* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Four rows at a time (shorter groups repeat their first row and drop the extra results):
// the fp16 scales (and mins) of the 4 rows' blocks are converted together, [d0 m0 .. d3 m3]
// times [dx s .. dx s] in one multiply; lane 2i is row i's block scale, the odd lanes
// accumulate the m * s terms.
template <typename P>
struct Q32Rows {
  template <int NR>
  struct R {
    static void run(const MatmulTask& t, int64_t r0) {
      using Block = typename P::Block;
      static_assert(offsetof(Block, d) == 0);
      const int64_t nb = t.cols / 32;
      const Block* w[4];
      for (int i = 0; i < 4; ++i) w[i] = reinterpret_cast<const Block*>(t.w + (r0 + (i < NR ? i : 0)) * t.w_stride);
      for (int64_t j = 0; j < t.n_x; ++j) {
        const ActRow a = act_row(t.act, *t.act_layout, j);
        __m256 acc[NR];
        __m256 accm = _mm256_setzero_ps();
        for (int i = 0; i < NR; ++i) acc[i] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
          const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(a.qs + b * 32));
          const __m128i dm16 = _mm_setr_epi32(static_cast<int>(load_u32(&w[0][b])), static_cast<int>(load_u32(&w[1][b])),
                                              static_cast<int>(load_u32(&w[2][b])), static_cast<int>(load_u32(&w[3][b])));
          const __m256 xs = _mm256_unpacklo_ps(_mm256_set1_ps(a.d32[b]), _mm256_set1_ps(a.s32[b]));
          const __m256 scales = _mm256_mul_ps(_mm256_cvtph_ps(dm16), xs);
          if constexpr (P::kHasMin) accm = _mm256_add_ps(accm, scales);
          for (int i = 0; i < NR; ++i) {
            const __m256i q = P::quants(w[i][b]);
            const __m256 p = P::kSigned ? dot_s8s8_f32(q, xq) : dot_u8s8_f32(q, xq);
            const __m256 sc = _mm256_permutevar8x32_ps(scales, _mm256_set1_epi32(2 * i));
            acc[i] = _mm256_fmadd_ps(sc, p, acc[i]);
          }
        }
        alignas(32) float mins[8];
        _mm256_store_ps(mins, accm);
        for (int i = 0; i < NR; ++i) t.y[j * t.ldy + r0 + i] = hsum8(acc[i]) + (P::kHasMin ? mins[2 * i + 1] : 0.0f);
      }
    }
  };
};

// Q4_0 / Q4_1, two rows per register: the 16 quant bytes of row i fill the low lane and
// those of row i+1 the high lane, so one AND gives both rows' first 16 quants and one
// shift+AND their last 16, each dotted with the matching half of the activation block
// broadcast to both lanes. Lanes 0-3 then hold row i's block sum, lanes 4-7 row i+1's.
// Q4_0's offset of 8 comes out exactly in i32 through the activation's block sum.
template <bool kHasMin>
struct Q4PairRows {
  template <int NR>
  struct R {
    static void run(const MatmulTask& t, int64_t r0) {
      using Block = std::conditional_t<kHasMin, BlockQ4_1, BlockQ4_0>;
      constexpr int kPairs = (NR + 1) / 2;
      const int64_t nb = t.cols / 32;
      const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
      const Block* w[4];
      for (int i = 0; i < 4; ++i) w[i] = reinterpret_cast<const Block*>(t.w + (r0 + (i < NR ? i : 0)) * t.w_stride);
      // Scale lanes of [d0 m0 d1 m1 d2 m2 d3 m3] for a pair: row 2p in lanes 0-3, 2p+1 in 4-7.
      const __m256i pair_idx[2] = {_mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6)};
      for (int64_t j = 0; j < t.n_x; ++j) {
        const ActRow a = act_row(t.act, *t.act_layout, j);
        __m256 acc[kPairs];
        __m256 accm = _mm256_setzero_ps();
        for (int p = 0; p < kPairs; ++p) acc[p] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
          const __m128i* xb = reinterpret_cast<const __m128i*>(a.qs + b * 32);
          const __m256i xlo = _mm256_broadcastsi128_si256(_mm_load_si128(xb));
          const __m256i xhi = _mm256_broadcastsi128_si256(_mm_load_si128(xb + 1));
          const __m128i dm16 = _mm_setr_epi32(static_cast<int>(load_u32(&w[0][b])), static_cast<int>(load_u32(&w[1][b])),
                                              static_cast<int>(load_u32(&w[2][b])), static_cast<int>(load_u32(&w[3][b])));
          const __m256 xs = _mm256_unpacklo_ps(_mm256_set1_ps(a.d32[b]), _mm256_set1_ps(a.s32[b]));
          const __m256 scales = _mm256_mul_ps(_mm256_cvtph_ps(dm16), xs);
          if constexpr (kHasMin) accm = _mm256_add_ps(accm, scales);
          __m256i corr = _mm256_setzero_si256();
          if constexpr (!kHasMin)  // 8 * sum(x) out of lane 0 and lane 4 of each pair's sums
            corr = _mm256_and_si256(_mm256_set1_epi32(8 * a.sum32[b]), _mm256_setr_epi32(-1, 0, 0, 0, -1, 0, 0, 0));
          for (int p = 0; p < kPairs; ++p) {
            const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[2 * p][b].qs));
            const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[2 * p + 1 < 4 ? 2 * p + 1 : 0][b].qs));
            const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
            const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo, xlo), _mm256_maddubs_epi16(hi, xhi));
            __m256i p32 = _mm256_madd_epi16(p16, ones);
            if constexpr (!kHasMin) p32 = _mm256_sub_epi32(p32, corr);
            acc[p] = _mm256_fmadd_ps(_mm256_permutevar8x32_ps(scales, pair_idx[p]), _mm256_cvtepi32_ps(p32), acc[p]);
          }
        }
        alignas(32) float mins[8], sums[2 * kPairs][4];
        _mm256_store_ps(mins, accm);
        for (int p = 0; p < kPairs; ++p) {
          _mm_store_ps(sums[2 * p], _mm256_castps256_ps128(acc[p]));
          _mm_store_ps(sums[2 * p + 1], _mm256_extractf128_ps(acc[p], 1));
        }
        for (int i = 0; i < NR; ++i)
          t.y[j * t.ldy + r0 + i] = (sums[i][0] + sums[i][1]) + (sums[i][2] + sums[i][3]) + (kHasMin ? mins[2 * i + 1] : 0.0f);
      }
    }
  };
};

// Q4_K / Q5_K: sub-block scales multiply the pair sums inside _mm256_madd_epi16; the mins
// meet the activation's sums of 32.
template <bool kFive>
struct QK45Rows {
  template <int NR>
  struct R {
    static void run(const MatmulTask& t, int64_t r0) {
      using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
      const int64_t nb = t.cols / 256;
      const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
      const Block* w[NR];
      for (int i = 0; i < NR; ++i) w[i] = reinterpret_cast<const Block*>(t.w + (r0 + i) * t.w_stride);
      for (int64_t j = 0; j < t.n_x; ++j) {
        const ActRow a = act_row(t.act, *t.act_layout, j);
        __m256 acc[NR];
        float accm[NR];
        for (int i = 0; i < NR; ++i) acc[i] = _mm256_setzero_ps(), accm[i] = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          const int8_t* xq = a.qs + b * 256;
          const float dx = a.d32[b * 8];
          for (int i = 0; i < NR; ++i) {
            const Block& blk = w[i][b];
            uint8_t sm[16];
            unpack_k4_scales(blk.scales, sm);
            int summ = 0;
            for (int g = 0; g < 8; ++g) summ += sm[8 + g] * a.sum32[b * 8 + g];
            __m256i hbits = _mm256_setzero_si256();
            if constexpr (kFive) hbits = load256(blk.qh);
            __m256i sumi = _mm256_setzero_si256();
            for (int c = 0; c < 4; ++c) {
              const __m256i bits = load256(blk.qs + 32 * c);
              __m256i lo = _mm256_and_si256(bits, m4);
              __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
              if constexpr (kFive) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), m1), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c + 1), m1), 4));
              }
              const __m256i plo = _mm256_maddubs_epi16(lo, load256(xq + 64 * c));
              const __m256i phi = _mm256_maddubs_epi16(hi, load256(xq + 64 * c + 32));
              sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(plo, _mm256_set1_epi16(sm[2 * c])));
              sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(phi, _mm256_set1_epi16(sm[2 * c + 1])));
            }
            acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(blk.d) * dx), _mm256_cvtepi32_ps(sumi), acc[i]);
            accm[i] -= h2f(blk.dmin) * dx * static_cast<float>(summ);
          }
        }
        for (int i = 0; i < NR; ++i) t.y[j * t.ldy + r0 + i] = hsum8(acc[i]) + accm[i];
      }
    }
  };
};

// Q6_K: unsigned 6-bit quants; the -32 offset is folded in exactly through the activation's
// sums of 16.
template <int NR>
struct Q6KRows {
  static void run(const MatmulTask& t, int64_t r0) {
    const int64_t nb = t.cols / 256;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    const BlockQ6_K* w[NR];
    for (int i = 0; i < NR; ++i) w[i] = reinterpret_cast<const BlockQ6_K*>(t.w + (r0 + i) * t.w_stride);
    for (int64_t j = 0; j < t.n_x; ++j) {
      const ActRow a = act_row(t.act, *t.act_layout, j);
      __m256 acc[NR];
      for (int i = 0; i < NR; ++i) acc[i] = _mm256_setzero_ps();
      for (int64_t b = 0; b < nb; ++b) {
        const float dx = a.d32[b * 8];
        for (int i = 0; i < NR; ++i) {
          const BlockQ6_K& blk = w[i][b];
          int corr = 0;
          for (int g = 0; g < 16; ++g) corr += blk.scales[g] * a.sum16[b * 16 + g];
          __m256i sumi = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-32 * corr));
          for (int half = 0; half < 2; ++half) {
            const uint8_t* ql = blk.ql + 64 * half;
            const int8_t* sc = blk.scales + 8 * half;
            const int8_t* xq = a.qs + b * 256 + 128 * half;
            const __m256i l0 = load256(ql), l1 = load256(ql + 32), h = load256(blk.qh + 32 * half);
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4)),
            };
            for (int k = 0; k < 4; ++k) {
              const __m256i p = _mm256_maddubs_epi16(q[k], load256(xq + 32 * k));
              const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
              sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scv));
            }
          }
          acc[i] = _mm256_fmadd_ps(_mm256_set1_ps(h2f(blk.d) * dx), _mm256_cvtepi32_ps(sumi), acc[i]);
        }
      }
      for (int i = 0; i < NR; ++i) t.y[j * t.ldy + r0 + i] = hsum8(acc[i]);
    }
  }
};

template <int NR> using F32R = FloatRows<LoadF32>::R<NR>;
template <int NR> using F16R = FloatRows<LoadF16>::R<NR>;
template <int NR> using BF16R = FloatRows<LoadBF16>::R<NR>;
template <int NR> using Q4_0R = Q4PairRows<false>::R<NR>;
template <int NR> using Q4_1R = Q4PairRows<true>::R<NR>;
template <int NR> using Q5_0R = Q32Rows<PQ5_0>::R<NR>;
template <int NR> using Q5_1R = Q32Rows<PQ5_1>::R<NR>;
template <int NR> using Q8_0R = Q32Rows<PQ8_0>::R<NR>;
template <int NR> using Q4KR = QK45Rows<false>::R<NR>;
template <int NR> using Q5KR = QK45Rows<true>::R<NR>;

}  // namespace

const MatmulKernel avx2_direct_kernels[kNumWKinds] = {
    for_row_groups<F32R>,  for_row_groups<F16R>,  for_row_groups<BF16R>, for_row_groups<Q4_0R>,
    for_row_groups<Q4_1R>, for_row_groups<Q5_0R>, for_row_groups<Q5_1R>, for_row_groups<Q8_0R>,
    for_row_groups<Q4KR>,  for_row_groups<Q5KR>,  for_row_groups<Q6KRows>,
};

const KernelSet& avx2_kernel_set() {
  static const KernelSet set = [] {
    KernelSet s{};
    s.name = "avx2";
    s.quantize_q8 = avx2_quantize_q8;
    s.quantize_q8k = avx2_quantize_q8k;
    for (int k = 0; k < kNumWKinds; ++k) s.direct[k] = avx2_direct_kernels[k], s.panel[k] = avx2_panel_kernels[k];
    s.panel_rows = 2 * kAvx2PanelRows;
    return s;
  }();
  return set;
}

}  // namespace tessera::mm
