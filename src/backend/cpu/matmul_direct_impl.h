#pragma once
// The direct matmul kernels (weights read in their GGUF layout: decode and small batches), as
// the body of an anonymous namespace inside tessera::mm. Included once by each ISA's kernel
// file: matmul_kernels_avx2.cpp (AVX2 + FMA + F16C) and matmul_kernels_avx512.cpp, which
// defines TESSERA_MM_VNNI first so the integer block dots use _mm256_dpbusd_epi32. Each gets
// its own copy (internal linkage) compiled for its own instruction set; kDirectKernels is the
// table its KernelSet takes.
//
// Block dots follow GGML's integer arithmetic: unsigned weight bytes times signed activation
// bytes, summed to i32; signed weights go through the sign trick (|w| times x carrying w's
// sign). The f32 arithmetic follows the canonical order of matmul_kernels.h, so every ISA
// gives the same bits.
#include <immintrin.h>

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_kernels.h"
#include "quant/blocks.h"

namespace tessera::mm {

namespace {

// ---- direct kernels ------------------------------------------------------------------------
// Every output follows the canonical order of matmul_kernels.h, whatever the grouping: float
// weights keep column lanes (4 rows at a time), block weights one f32 lane per weight row
// (8 rows at a time): per block, the 8 rows' i32 partial sums are reduced to one vector
// (lane i: row i's exact block sum) and scaled with one FMA, blocks in order.

// Decode streams weights from DRAM. Rows read side by side are short streams that the
// hardware prefetchers pick up late, so while a group of rows computes, the bytes of the
// group after next are requested, a slice per step of the group's loop.
class RowPrefetch {
 public:
  RowPrefetch(const MatmulTask& t, int64_t r0, int group_rows, int64_t steps)
      : next_(reinterpret_cast<const char*>(t.w + (r0 + 2 * group_rows) * t.w_stride)),
        step_bytes_((group_rows * t.w_stride + steps - 1) / steps) {}
  void at(int64_t step) const {
    const char* p = next_ + step * step_bytes_;
    for (int64_t off = 0; off < step_bytes_; off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
  }

 private:
  const char* next_;
  int64_t step_bytes_;
};

template <template <int> class Rows>
void for_row_groups(const MatmulTask& t) {
  int64_t r = 0;
  for (; r + 4 <= t.n_w; r += 4) Rows<4>::run(t, r);
  switch (t.n_w - r) {
    case 3:
      Rows<3>::run(t, r);
      break;
    case 2:
      Rows<2>::run(t, r);
      break;
    case 1:
      Rows<1>::run(t, r);
      break;
    default:
      break;
  }
}

// Float weights (F32, F16, BF16 through the F32Src/F16Src/BF16Src loaders): column lanes,
// 8 columns per FMA, the last partial group zero-padded.
template <typename S>
struct FloatRows {
  template <int NR>
  struct R {
    static void run(const MatmulTask& t, int64_t r0) {
      const uint8_t* w[NR];
      for (int i = 0; i < NR; ++i) w[i] = t.w + (r0 + i) * t.w_stride;
      const int64_t k8 = t.cols / 8 * 8, tail = t.cols - k8;
      const RowPrefetch pf(t, r0, 4, k8 / 8 > 0 ? k8 / 8 : 1);
      for (int64_t j = 0; j < t.n_x; ++j) {
        const float* x = t.x + j * t.ldx;
        __m256 acc[NR];
        for (int i = 0; i < NR; ++i) acc[i] = _mm256_setzero_ps();
        for (int64_t k = 0; k < k8; k += 8) {
          pf.at(k / 8);
          const __m256 xv = _mm256_loadu_ps(x + k);
          for (int i = 0; i < NR; ++i) acc[i] = _mm256_fmadd_ps(S::load8(w[i] + k * S::kBytes), xv, acc[i]);
        }
        if (tail > 0) {
          const __m256 xv = load_first_ps(x + k8, static_cast<int>(tail));
          for (int i = 0; i < NR; ++i) acc[i] = _mm256_fmadd_ps(load_tail<S>(w[i] + k8 * S::kBytes, tail), xv, acc[i]);
        }
        for (int i = 0; i < NR; ++i) t.y[j * t.ldy + r0 + i] = hsum8_canonical(acc[i]);
      }
    }
  };
};

// Block formats: groups of 8 rows; a short last group repeats its first row in the unused
// lanes, which are not stored.
template <typename K>
void for_groups_of_8(const MatmulTask& t) {
  for (int64_t r = 0; r < t.n_w; r += 8) K::run(t, r, static_cast<int>(t.n_w - r < 8 ? t.n_w - r : 8));
}

struct RowGroup {
  const uint8_t* row[8];
  RowGroup(const MatmulTask& t, int64_t r0, int nr) {
    for (int i = 0; i < 8; ++i) row[i] = t.w + (r0 + (i < nr ? i : 0)) * t.w_stride;
  }
  template <typename Block>
  const Block& block(int i, int64_t b) const {
    return reinterpret_cast<const Block*>(row[i])[b];
  }
};

inline void store_lanes(float* y, __m256 v, int n) {
  if (n >= 8) {
    _mm256_storeu_ps(y, v);
  } else {
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(y, mask, v);
  }
}

inline int load_i32(const void* p) {
  int v;
  std::memcpy(&v, p, 4);
  return v;
}

// Two consecutive fp16 fields (d and m, or d and dmin) at byte `off` of each of the 8 rows,
// as f32 lanes = rows.
inline void rows_two_halves(const RowGroup& g, int64_t off, __m256* first, __m256* second) {
  const __m256 lo = _mm256_cvtph_ps(_mm_setr_epi32(load_i32(g.row[0] + off), load_i32(g.row[1] + off),
                                                   load_i32(g.row[2] + off), load_i32(g.row[3] + off)));
  const __m256 hi = _mm256_cvtph_ps(_mm_setr_epi32(load_i32(g.row[4] + off), load_i32(g.row[5] + off),
                                                   load_i32(g.row[6] + off), load_i32(g.row[7] + off)));
  // lo = d0 m0 d1 m1 | d2 m2 d3 m3: even lanes to `first`, odd to `second`, rows in order.
  const __m256 ds = _mm256_shuffle_ps(lo, hi, 0x88), ms = _mm256_shuffle_ps(lo, hi, 0xDD);
  *first = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ds), 0xD8));
  *second = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(ms), 0xD8));
}

// One fp16 field at byte `off` of each of the 8 rows (Q6_K's d, which ends its block).
inline __m256 rows_half(const RowGroup& g, int64_t off) {
  uint16_t h[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&h[i], g.row[i] + off, 2);
  return _mm256_cvtph_ps(_mm_setr_epi16(static_cast<short>(h[0]), static_cast<short>(h[1]), static_cast<short>(h[2]),
                                        static_cast<short>(h[3]), static_cast<short>(h[4]), static_cast<short>(h[5]),
                                        static_cast<short>(h[6]), static_cast<short>(h[7])));
}

// i32 sums of four u8 x s8 products per lane (signed weights through the sign trick), and of
// two such pairs of registers. AVX2: _mm256_maddubs_epi16 to i16 pairs (exact here: at most
// 2 x 15 x 127 or 2 x 127 x 127), then _mm256_madd_epi16; AVX-512 VNNI: _mm256_dpbusd_epi32
// straight into i32. The same integers either way, so the same bits.
#if defined(TESSERA_MM_VNNI)
inline __m256i dot_u8s8_i32(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
inline __m256i dot2_u8s8_i32(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
  return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, s0), u1, s1);
}
#else
inline __m256i dot_u8s8_i32(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
inline __m256i dot2_u8s8_i32(__m256i u0, __m256i s0, __m256i u1, __m256i s1) {
  return _mm256_madd_epi16(_mm256_add_epi16(_mm256_maddubs_epi16(u0, s0), _mm256_maddubs_epi16(u1, s1)),
                           _mm256_set1_epi16(1));
}
#endif
inline __m256i dot_s8s8_i32(__m256i w, __m256i x) {
  return dot_u8s8_i32(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

// Q5_0 / Q5_1 / Q8_0 (Q4_0 / Q4_1: Q4Rows below). A policy gives the 32 weight bytes of a
// block: unsigned, or signed (q - zero point) when kSigned.
struct PQ5_0 {
  using Block = BlockQ5_0;
  static constexpr bool kSigned = true, kHasMin = false;
  // q - 16 as a signed byte: the nibble where the 5th bit is set, nibble - 16 (0xF0 | nibble) where not.
  static __m256i quants(const Block& b) {
    const __m256i f0 = _mm256_set1_epi8(static_cast<char>(0xF0));
    return _mm256_or_si256(nibbles_32(b.qs), _mm256_andnot_si256(bits_to_bytes(b.qh), f0));
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

// The input rows in passes of 4, then 2, then 1 over the weights of one row group
// (K::pass<XR> unpacks each block once for its XR input rows); blocks of kBlockCols columns.
// kWide, with AVX-512 (32 vector registers: a Q4_x/Q8_0 block's unpacked quants and up to 7
// accumulators fit): 5 to 7 rows take one pass, so a speculative verification of 4 to 6 drafts
// unpacks the weights once instead of twice (AVX2's 16 registers would spill them).
template <typename K, int kBlockCols = 32, bool kWide = false>
void in_row_passes(const MatmulTask& t, int64_t r0, int nr) {
  const RowPrefetch pf(t, r0, 8, t.cols / kBlockCols);
  const RowGroup g(t, r0, nr);
  int64_t j = 0;
#if defined(TESSERA_MM_VNNI)
  if constexpr (kWide) switch (t.n_x) {
      case 5:
        return K::template pass<5>(t, g, pf, r0, nr, 0);
      case 6:
        return K::template pass<6>(t, g, pf, r0, nr, 0);
      case 7:
        return K::template pass<7>(t, g, pf, r0, nr, 0);
      default:
        break;
    }
#endif
  for (; j + 4 <= t.n_x; j += 4) K::template pass<4>(t, g, pf, r0, nr, j);
  for (; j + 2 <= t.n_x; j += 2) K::template pass<2>(t, g, pf, r0, nr, j);
  if (j < t.n_x) K::template pass<1>(t, g, pf, r0, nr, j);
}

template <typename P>
struct Q32Rows {
  // XR input rows per pass over the weights, as Q4Rows: each block's quants (and, for signed
  // weights, their magnitudes) and scales once for all of them; the per-output arithmetic is
  // the one-row order.
  template <int XR>
  static void pass(const MatmulTask& t, const RowGroup& g, const RowPrefetch& pf, int64_t r0, int nr, int64_t j0) {
    using Block = typename P::Block;
    const int64_t nb = t.cols / 32;
    ActRow a[XR];
    __m256 acc[XR];
    for (int x = 0; x < XR; ++x) a[x] = act_row(t.act, *t.act_layout, j0 + x), acc[x] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      pf.at(b);
      __m256i q[8], u[8];  // the rows' quants; u: what maddubs takes (|q| for signed weights)
      for (int i = 0; i < 8; ++i) {
        q[i] = P::quants(g.block<Block>(i, b));
        u[i] = P::kSigned ? _mm256_sign_epi8(q[i], q[i]) : q[i];
      }
      __m256 dw, mw;
      rows_two_halves(g, b * static_cast<int64_t>(sizeof(Block)), &dw, &mw);
      for (int x = 0; x < XR; ++x) {
        const __m256i xq = _mm256_load_si256(reinterpret_cast<const __m256i*>(a[x].qs + b * 32));
        __m256i part[8];
        for (int i = 0; i < 8; ++i) part[i] = dot_u8s8_i32(u[i], P::kSigned ? _mm256_sign_epi8(xq, q[i]) : xq);
        // acc = fma(d_w * d_x, isum, acc), then Q4_1/Q5_1 acc = fma(m_w, s_x, acc): the canonical order.
        acc[x] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a[x].d32[b])), _mm256_cvtepi32_ps(hsum8x8_i32(part)),
                                 acc[x]);
        if constexpr (P::kHasMin) acc[x] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a[x].s32[b]), acc[x]);
      }
    }
    for (int x = 0; x < XR; ++x) store_lanes(t.y + (j0 + x) * t.ldy + r0, acc[x], nr);
  }

  static void run(const MatmulTask& t, int64_t r0, int nr) { in_row_passes<Q32Rows, 32, true>(t, r0, nr); }
};

// Q4_0 / Q4_1, two rows per register: the 16 quant bytes of row 2p fill the low lane and
// those of row 2p+1 the high lane, so one AND gives both rows' first 16 quants and one
// shift+AND their last 16, each dotted with the matching half of the activation block
// broadcast to both lanes. Three hadds then leave the 8 rows' block sums in one register.
// Q4_0's offset of 8 comes out exactly in i32 through the activation's block sum.
template <bool kHasMin>
struct Q4Rows {
  // XR input rows per pass over the weights: each block's nibbles and scales are unpacked once
  // for all of them (a verification step or a small batch is compute-bound here, not
  // bandwidth-bound). Every output's arithmetic is the one-row order, so the bits do not move.
  template <int XR>
  static void pass(const MatmulTask& t, const RowGroup& g, const RowPrefetch& pf, int64_t r0, int nr, int64_t j0) {
    using Block = std::conditional_t<kHasMin, BlockQ4_1, BlockQ4_0>;
    const int64_t nb = t.cols / 32;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i row_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    ActRow a[XR];
    __m256 acc[XR];
    for (int x = 0; x < XR; ++x) a[x] = act_row(t.act, *t.act_layout, j0 + x), acc[x] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      pf.at(b);
      __m256i lo[4], hi[4];  // [row 2p: 16 quants | row 2p+1: 16], low then high nibbles
      for (int p = 0; p < 4; ++p) {
        const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g.block<Block>(2 * p, b).qs));
        const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g.block<Block>(2 * p + 1, b).qs));
        const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1);
        lo[p] = _mm256_and_si256(q, m4);
        hi[p] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      }
      __m256 dw, mw;
      rows_two_halves(g, b * static_cast<int64_t>(sizeof(Block)), &dw, &mw);
      for (int x = 0; x < XR; ++x) {
        const __m128i* xb = reinterpret_cast<const __m128i*>(a[x].qs + b * 32);
        const __m256i xlo = _mm256_broadcastsi128_si256(_mm_load_si128(xb));
        const __m256i xhi = _mm256_broadcastsi128_si256(_mm_load_si128(xb + 1));
        __m256i part[4];
        for (int p = 0; p < 4; ++p) part[p] = dot2_u8s8_i32(lo[p], xlo, hi[p], xhi);
        // Lanes r0 r2 r4 r6 | r1 r3 r5 r7, then rows in order.
        const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(part[0], part[1]), _mm256_hadd_epi32(part[2], part[3]));
        __m256i isum = _mm256_permutevar8x32_epi32(h, row_order);
        if constexpr (!kHasMin) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * a[x].sum32[b]));
        // acc = fma(d_w * d_x, isum, acc), then Q4_1/Q5_1 acc = fma(m_w, s_x, acc): the canonical order.
        acc[x] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a[x].d32[b])), _mm256_cvtepi32_ps(isum), acc[x]);
        if constexpr (kHasMin) acc[x] = _mm256_fmadd_ps(mw, _mm256_set1_ps(a[x].s32[b]), acc[x]);
      }
    }
    for (int x = 0; x < XR; ++x) store_lanes(t.y + (j0 + x) * t.ldy + r0, acc[x], nr);
  }

  static void run(const MatmulTask& t, int64_t r0, int nr) { in_row_passes<Q4Rows, 32, true>(t, r0, nr); }
};

// Q4_K / Q5_K: sub-block scales multiply the pair sums inside _mm256_madd_epi16; the mins
// meet the activation's sums of 32. XR input rows per pass, as Q4Rows: a weight row's
// super-block (its 256 quants as 8 registers, its scales) is unpacked once for all of them;
// every output keeps the one-row arithmetic.
template <bool kFive>
struct QK45Rows {
  template <int XR>
  static void pass(const MatmulTask& t, const RowGroup& g, const RowPrefetch& pf, int64_t r0, int nr, int64_t j0) {
    using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
    const int64_t nb = t.cols / 256;
    ActRow a[XR];
    __m256 acc[XR];
    for (int x = 0; x < XR; ++x) a[x] = act_row(t.act, *t.act_layout, j0 + x), acc[x] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      pf.at(b);
      __m256i part[XR][8];
      alignas(32) int32_t msum[XR][8];
      for (int i = 0; i < 8; ++i) {
        const Block& blk = g.block<Block>(i, b);
        uint8_t sm[16];
        unpack_k4_scales(blk.scales, sm);
        __m256i hbits = _mm256_setzero_si256();
        if constexpr (kFive) hbits = load256(blk.qh);
        if constexpr (XR == 1) {
          // One input row (decode): unpack and dot chunk by chunk, 2 registers of quants live
          // instead of 8 (holding all 8 measured 4% slower at 1 row on Llama-3.2-1B Q4_K).
          int summ = 0;
          for (int s = 0; s < 8; ++s) summ += sm[8 + s] * a[0].sum32[b * 8 + s];
          msum[0][i] = summ;
          const int8_t* xq = a[0].qs + b * 256;
          __m256i sumi = _mm256_setzero_si256();
          for (int c = 0; c < 4; ++c) {
            __m256i lo, hi;
            qk45_quants<kFive>(blk.qs, hbits, c, &lo, &hi);
            const __m256i plo = _mm256_maddubs_epi16(lo, load256(xq + 64 * c));
            const __m256i phi = _mm256_maddubs_epi16(hi, load256(xq + 64 * c + 32));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(plo, _mm256_set1_epi16(sm[2 * c])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(phi, _mm256_set1_epi16(sm[2 * c + 1])));
          }
          part[0][i] = sumi;
          continue;
        }
        __m256i lo[4], hi[4];  // the row's 256 quants, in the activation's order
        for (int c = 0; c < 4; ++c) qk45_quants<kFive>(blk.qs, hbits, c, &lo[c], &hi[c]);
        for (int x = 0; x < XR; ++x) {
          int summ = 0;
          for (int s = 0; s < 8; ++s) summ += sm[8 + s] * a[x].sum32[b * 8 + s];
          msum[x][i] = summ;
          const int8_t* xq = a[x].qs + b * 256;
          __m256i sumi = _mm256_setzero_si256();
          for (int c = 0; c < 4; ++c) {
            const __m256i plo = _mm256_maddubs_epi16(lo[c], load256(xq + 64 * c));
            const __m256i phi = _mm256_maddubs_epi16(hi[c], load256(xq + 64 * c + 32));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(plo, _mm256_set1_epi16(sm[2 * c])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(phi, _mm256_set1_epi16(sm[2 * c + 1])));
          }
          part[x][i] = sumi;
        }
      }
      __m256 dw, dmin;
      rows_two_halves(g, b * static_cast<int64_t>(sizeof(Block)), &dw, &dmin);
      for (int x = 0; x < XR; ++x) {
        const __m256 dx = _mm256_set1_ps(a[x].d32[b * 8]);
        acc[x] = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(hsum8x8_i32(part[x])), acc[x]);
        acc[x] =
            _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx),
                             _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(msum[x]))), acc[x]);
      }
    }
    for (int x = 0; x < XR; ++x) store_lanes(t.y + (j0 + x) * t.ldy + r0, acc[x], nr);
  }

  static void run(const MatmulTask& t, int64_t r0, int nr) { in_row_passes<QK45Rows, 256>(t, r0, nr); }
};

// Q6_K: unsigned 6-bit quants; the -32 offset is folded in exactly through the activation's
// sums of 16. XR input rows per pass, as QK45Rows (one half super-block's quants at a time).
struct Q6KRows {
  template <int XR>
  static void pass(const MatmulTask& t, const RowGroup& g, const RowPrefetch& pf, int64_t r0, int nr, int64_t j0) {
    const int64_t nb = t.cols / 256;
    ActRow a[XR];
    __m256 acc[XR];
    for (int x = 0; x < XR; ++x) a[x] = act_row(t.act, *t.act_layout, j0 + x), acc[x] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      pf.at(b);
      __m256i part[XR][8];
      for (int i = 0; i < 8; ++i) {
        const BlockQ6_K& blk = g.block<BlockQ6_K>(i, b);
        __m256i sumi[XR];
        for (int x = 0; x < XR; ++x) {
          int corr = 0;
          for (int s = 0; s < 16; ++s) corr += blk.scales[s] * a[x].sum16[b * 16 + s];
          sumi[x] = _mm256_zextsi128_si256(_mm_cvtsi32_si128(-32 * corr));
        }
        for (int half = 0; half < 2; ++half) {
          const int8_t* sc = blk.scales + 8 * half;
          __m256i q[4];
          q6k_quants(blk, half, q);
          for (int k = 0; k < 4; ++k) {
            const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(sc[2 * k + 1]), _mm_set1_epi16(sc[2 * k]));
            for (int x = 0; x < XR; ++x) {
              const __m256i p = _mm256_maddubs_epi16(q[k], load256(a[x].qs + b * 256 + 128 * half + 32 * k));
              sumi[x] = _mm256_add_epi32(sumi[x], _mm256_madd_epi16(p, scv));
            }
          }
        }
        for (int x = 0; x < XR; ++x) part[x][i] = sumi[x];
      }
      const __m256 dw = rows_half(g, b * static_cast<int64_t>(sizeof(BlockQ6_K)) + offsetof(BlockQ6_K, d));
      for (int x = 0; x < XR; ++x)
        acc[x] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a[x].d32[b * 8])),
                                 _mm256_cvtepi32_ps(hsum8x8_i32(part[x])), acc[x]);
    }
    for (int x = 0; x < XR; ++x) store_lanes(t.y + (j0 + x) * t.ldy + r0, acc[x], nr);
  }

  static void run(const MatmulTask& t, int64_t r0, int nr) { in_row_passes<Q6KRows, 256>(t, r0, nr); }
};

template <int NR>
using F32R = FloatRows<F32Src>::R<NR>;
template <int NR>
using F16R = FloatRows<F16Src>::R<NR>;
template <int NR>
using BF16R = FloatRows<BF16Src>::R<NR>;

// The direct kernels by weight kind (WKind order).
const MatmulKernel kDirectKernels[kNumWKinds] = {
    for_row_groups<F32R>,
    for_row_groups<F16R>,
    for_row_groups<BF16R>,
    for_groups_of_8<Q4Rows<false>>,
    for_groups_of_8<Q4Rows<true>>,
    for_groups_of_8<Q32Rows<PQ5_0>>,
    for_groups_of_8<Q32Rows<PQ5_1>>,
    for_groups_of_8<Q32Rows<PQ8_0>>,
    for_groups_of_8<QK45Rows<false>>,
    for_groups_of_8<QK45Rows<true>>,
    for_groups_of_8<Q6KRows>,
};

}  // namespace

}  // namespace tessera::mm
