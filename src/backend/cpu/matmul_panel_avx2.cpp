// AVX2 prefill kernels. Eight weight rows at a time are repacked into a panel in the
// thread's scratch (L1-sized) so that one 32-byte load holds 4 consecutive quants of each of
// the 8 rows; a broadcast of 4 activation bytes times that register, through
// _mm256_maddubs_epi16, advances all 8 dot products at once, one register lane per weight
// row. The lanes need no horizontal sums: the i16 pair sums of up to 8 steps are added in
// i16 where they cannot overflow and turned to i32 (K-quants: times their sub-block scales)
// with _mm256_madd_epi16, giving each row's exact integer block sum. The f32 step then
// follows the canonical order of matmul_kernels.h: per (weight row, input row) one
// accumulator, blocks in order, one FMA per block. Each panel meets every input row of the task, 2 or 3 rows per pass, so the repacking is
// paid once per many rows.
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_kernels.h"
#include "quant/blocks.h"

namespace tessera::mm {

namespace {

constexpr int P = kAvx2PanelRows;  // 8

inline void store_transposed(const __m256i rows[P], uint8_t* dst) {
  __m256i g[P];
  transpose_8x8(rows, g);
  for (int i = 0; i < P; ++i) _mm256_store_si256(reinterpret_cast<__m256i*>(dst) + i, g[i]);
}

// ---- quantized panels ------------------------------------------------------------------------
// Layout (Panel in matmul_kernels.h): q [cols/32][8 groups of 4][8 rows][4 bytes]; 32-value
// blocks: d, m [cols/32][8 rows] f32; K-quants per super-block: d, dmin (in m) [8 rows] f32,
// sc [16][8 rows] as i16 pairs (sc, sc) and Q4_K/Q5_K's mp [4][8 rows] as i16 pairs
// (m_2k, m_2k+1), the operands of _mm256_madd_epi16.
// Q6_K's quants are stored signed (q - 32) and dotted against the activation + 128 (the
// unsigned operand of maddubs): sum (x + 128)(q - 32) = sum x (q - 32) + 128 sum (q - 32),
// so the zero point becomes one weight-only integer per row and super-block, wc =
// 128 sum_g sc_g sum (q - 32), subtracted once; 4 products of at most 255 * 32 fit in i16.

template <typename D>
void repack(const MatmulTask& t, int64_t r0, int nrows, const Panel& p) {
  constexpr int kBlocks = D::kChunk / 32;  // 32-value blocks per chunk
  const int64_t n_chunks = t.cols / D::kChunk;
  const int64_t src_bytes = t.w_stride / n_chunks;  // bytes of one block of the row
  alignas(32) uint8_t q[P][D::kChunk];
  float d[P], m[P];
  SuperScales ss[P];
  // The panel after the next one is requested while this one is repacked (eight rows read
  // side by side are eight short streams the hardware prefetchers pick up late).
  const char* ahead = reinterpret_cast<const char*>(t.w + (r0 + 2 * P) * t.w_stride);
  const int64_t ahead_step = (P * t.w_stride + n_chunks - 1) / n_chunks;
  for (int64_t c = 0; c < n_chunks; ++c) {
    for (int64_t off = 0; off < ahead_step; off += 64) _mm_prefetch(ahead + c * ahead_step + off, _MM_HINT_T0);
    for (int i = 0; i < P; ++i) {
      const uint8_t* src = t.w + (r0 + i) * t.w_stride + c * src_bytes;
      if (i >= nrows) {
        std::memset(q[i], 0, D::kChunk);
        d[i] = m[i] = 0.0f;
        if constexpr (D::kSuper) ss[i] = SuperScales{}, p.wc[c * P + i] = 0;
      } else if constexpr (D::kSuper) {
        if constexpr (D::kZero != 0) {  // Q6_K: signed q - 32, and its weight-only correction
          int32_t wsum;
          D::decode_signed(src, q[i], &ss[i], &wsum);
          p.wc[c * P + i] = 128 * wsum;
        } else {
          D::decode(src, q[i], &ss[i]);
        }
      } else {
        D::decode(src, q[i], &d[i], &m[i]);
      }
    }
    for (int s32 = 0; s32 < kBlocks; ++s32) {
      __m256i rows[P];
      for (int i = 0; i < P; ++i) rows[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(q[i] + 32 * s32));
      store_transposed(rows, p.q + (c * kBlocks + s32) * 32 * P);
    }
    for (int i = 0; i < P; ++i) {
      if constexpr (D::kSuper) {
        p.d[c * P + i] = ss[i].d;
        p.m[c * P + i] = ss[i].dmin;
        for (int s = 0; s < D::kSubs; ++s) p.sc[(c * 16 + s) * P + i] = i16_pair(ss[i].sc[s], ss[i].sc[s]);
        if constexpr (D::kHasMin)
          for (int k = 0; k < 4; ++k) p.mp[(c * 4 + k) * P + i] = i16_pair(ss[i].mn[2 * k], ss[i].mn[2 * k + 1]);
      } else {
        p.d[c * P + i] = d[i];
        if constexpr (D::kHasMin) p.m[c * P + i] = m[i];
      }
    }
  }
}

inline void store_rows(float* y, __m256 v, int nrows) {
  if (nrows >= P) {
    _mm256_storeu_ps(y, v);
  } else {  // lanes past the weight's last row are not written
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    _mm256_maskstore_ps(y, _mm256_cmpgt_epi32(_mm256_set1_epi32(nrows), lanes), v);
  }
}

// Keeps GCC from reassociating the i16 accumulation into a tree of temporaries (which spills).
#define TESSERA_PIN(v) asm("" : "+x"(v))

// f32 accumulators [panel][input row][weight row], in L1 (touched once per block).
template <int NP, int RN>
struct PanelAcc {
  alignas(32) float v[NP][RN][P] = {};

  void store(const MatmulTask& t, float* y, int nrows) const {
    for (int p = 0; p < NP; ++p)
      for (int j = 0; j < RN; ++j) store_rows(y + j * t.ldy + p * P, _mm256_load_ps(v[p][j]), nrows - p * P);
  }
};

// 32-value blocks: RN input rows against NP panels of 8 weight rows. Per 4-column group: one
// load per panel, one broadcast per input row, NP * RN maddubs; i16 partial sums go to i32
// every kSteps groups.
template <typename D, int NP, int RN>
void micro_q(const Panel* panels, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  constexpr int G = 8, kSteps = D::kSteps;
  const __m256i ones = _mm256_set1_epi16(1);
  ActRow a[RN];
  for (int j = 0; j < RN; ++j) a[j] = act_row(t.act, *t.act_layout, j0 + j);
  PanelAcc<NP, RN> facc;
  const int64_t n_blocks = t.cols / 32;
  for (int64_t c = 0; c < n_blocks; ++c) {
    __m256i isum[NP][RN], acc16[NP][RN];
    for (int p = 0; p < NP; ++p)
      for (int j = 0; j < RN; ++j) isum[p][j] = _mm256_setzero_si256(), acc16[p][j] = _mm256_setzero_si256();
    for (int g = 0; g < G; ++g) {
      __m256i w[NP], wu[NP];
      for (int p = 0; p < NP; ++p) {
        w[p] = _mm256_load_si256(reinterpret_cast<const __m256i*>(panels[p].q + c * 32 * P + g * 32));
        wu[p] = D::kSigned ? _mm256_sign_epi8(w[p], w[p]) : w[p];
      }
      for (int j = 0; j < RN; ++j) {
        int32_t x4;
        std::memcpy(&x4, a[j].qs + c * 32 + g * 4, 4);
        const __m256i xb = _mm256_set1_epi32(x4);
        for (int p = 0; p < NP; ++p) {
          const __m256i prod = _mm256_maddubs_epi16(wu[p], D::kSigned ? _mm256_sign_epi8(xb, w[p]) : xb);
          if constexpr (kSteps == 1) {
            isum[p][j] = _mm256_add_epi32(isum[p][j], _mm256_madd_epi16(prod, ones));
          } else {
            acc16[p][j] = _mm256_add_epi16(acc16[p][j], prod);
            TESSERA_PIN(acc16[p][j]);
          }
        }
      }
      if constexpr (kSteps != 1 && kSteps != G) {
        if ((g + 1) % kSteps == 0) {
          for (int p = 0; p < NP; ++p)
            for (int j = 0; j < RN; ++j) {
              isum[p][j] = _mm256_add_epi32(isum[p][j], _mm256_madd_epi16(acc16[p][j], ones));
              acc16[p][j] = _mm256_setzero_si256();
            }
        }
      }
    }
    for (int p = 0; p < NP; ++p) {
      const __m256 dw = _mm256_load_ps(panels[p].d + c * P);
      for (int j = 0; j < RN; ++j) {
        __m256i is = kSteps == G ? _mm256_madd_epi16(acc16[p][j], ones) : isum[p][j];
        if constexpr (D::kZero != 0) is = _mm256_sub_epi32(is, _mm256_set1_epi32(D::kZero * a[j].sum32[c]));
        float* lane = facc.v[p][j];
        __m256 acc = _mm256_load_ps(lane);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(a[j].d32[c])), _mm256_cvtepi32_ps(is), acc);
        if constexpr (D::kHasMin)
          acc = _mm256_fmadd_ps(_mm256_load_ps(panels[p].m + c * P), _mm256_set1_ps(a[j].s32[c]), acc);
        _mm256_store_ps(lane, acc);
      }
    }
  }
  facc.store(t, y, nrows);
}

// K-quants: per super-block, the i16 pair sums of kSteps groups are multiplied by their
// sub-block's scales and summed to i32 in one _mm256_madd_epi16, so isum holds the whole
// super-block's sum_j sc_j (q_j . x_j); Q6_K's zero point is the weight-only wc, Q4_K/Q5_K's
// mins meet the activation's sums of 32 through the i16 pairs of mp.
template <typename D, int NP, int RN>
void micro_qk(const Panel* panels, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  constexpr int B = D::kSub, G = B / 4, kSteps = D::kSteps;
  constexpr bool kOffsetX = D::kZero != 0;  // Q6_K: activation + 128 times signed weights
  ActRow a[RN];
  for (int j = 0; j < RN; ++j) a[j] = act_row(t.act, *t.act_layout, j0 + j);
  PanelAcc<NP, RN> facc;
  const int64_t n_super = t.cols / 256;
  for (int64_t c = 0; c < n_super; ++c) {
    __m256i isum[NP][RN], acc16[NP][RN];
    for (int p = 0; p < NP; ++p)
      for (int j = 0; j < RN; ++j) isum[p][j] = _mm256_setzero_si256(), acc16[p][j] = _mm256_setzero_si256();
#pragma GCC unroll 1
    for (int blk = 0; blk < 8; ++blk) {  // the super-block's blocks of 32
      const uint8_t* xblk[RN];
      for (int j = 0; j < RN; ++j)
        xblk[j] = (kOffsetX ? a[j].qsu : reinterpret_cast<const uint8_t*>(a[j].qs)) + c * 256 + blk * 32;
      for (int s2 = 0; s2 < 32 / B; ++s2) {  // its sub-blocks
        for (int g = 0; g < G; ++g) {
          const int grp = s2 * G + g;  // group of 4 within the block
          __m256i w[NP];
          for (int p = 0; p < NP; ++p)
            w[p] = _mm256_load_si256(reinterpret_cast<const __m256i*>(panels[p].q + (c * 8 + blk) * 32 * P + grp * 32));
          for (int j = 0; j < RN; ++j) {
            int32_t x4;
            std::memcpy(&x4, xblk[j] + grp * 4, 4);
            const __m256i xb = _mm256_set1_epi32(x4);
            for (int p = 0; p < NP; ++p) {
              const __m256i prod = kOffsetX ? _mm256_maddubs_epi16(xb, w[p]) : _mm256_maddubs_epi16(w[p], xb);
              acc16[p][j] = _mm256_add_epi16(acc16[p][j], prod);
              TESSERA_PIN(acc16[p][j]);
            }
          }
          if ((g + 1) % kSteps == 0) {
            const int64_t s = c * 16 + blk * (32 / B) + s2;  // sub-block
            for (int p = 0; p < NP; ++p) {
              const __m256i sc = _mm256_load_si256(reinterpret_cast<const __m256i*>(panels[p].sc + s * P));
              for (int j = 0; j < RN; ++j) {
                isum[p][j] = _mm256_add_epi32(isum[p][j], _mm256_madd_epi16(acc16[p][j], sc));
                acc16[p][j] = _mm256_setzero_si256();
              }
            }
          }
        }
      }
    }
    const int64_t sb = c * 8;  // first group of 32 of the super-block
    for (int p = 0; p < NP; ++p) {
      const __m256 dw = _mm256_load_ps(panels[p].d + c * P);
      const __m256 dmin = _mm256_load_ps(panels[p].m + c * P);
      for (int j = 0; j < RN; ++j) {
        __m256i is = isum[p][j], ms = _mm256_setzero_si256();
        if constexpr (kOffsetX) {
          is = _mm256_sub_epi32(is, _mm256_load_si256(reinterpret_cast<const __m256i*>(panels[p].wc + c * P)));
        }
        if constexpr (D::kHasMin) {  // sum_j m_j * sum32_j, two sub-blocks per madd
          for (int k = 0; k < 4; ++k) {
            const __m256i mp = _mm256_load_si256(reinterpret_cast<const __m256i*>(panels[p].mp + (c * 4 + k) * P));
            ms = _mm256_add_epi32(ms, _mm256_madd_epi16(mp, _mm256_set1_epi32(a[j].pair32[c * 4 + k])));
          }
        }
        const __m256 dx = _mm256_set1_ps(a[j].d32[sb]);
        float* lane = facc.v[p][j];
        __m256 acc = _mm256_load_ps(lane);
        acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(is), acc);
        if constexpr (D::kHasMin) acc = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(ms), acc);
        _mm256_store_ps(lane, acc);
      }
    }
  }
  facc.store(t, y, nrows);
}

template <typename D, int NP, int RN>
void micro(const Panel* panels, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  if constexpr (D::kSuper)
    micro_qk<D, NP, RN>(panels, t, j0, y, nrows);
  else
    micro_q<D, NP, RN>(panels, t, j0, y, nrows);
}

template <typename D, int NP>
void micro_rows(const Panel* panels, const MatmulTask& t, int64_t r0, int nrows) {
  // Input rows per pass: with two panels, 3 (12 registers of partial sums), or 2 where both
  // i16 and i32 partial sums are live; 4 with one.
  constexpr bool kOneStage = !D::kSuper && (D::kSteps == 1 || D::kSteps == 8);
  constexpr int RN = NP == 2 ? (kOneStage ? 3 : 2) : 4;
  int64_t j = 0;
  for (; j + RN <= t.n_x; j += RN) micro<D, NP, RN>(panels, t, j, t.y + j * t.ldy + r0, nrows);
  for (; j < t.n_x; ++j) micro<D, NP, 1>(panels, t, j, t.y + j * t.ldy + r0, nrows);
}

template <typename D>
void panel_q(const MatmulTask& t) {
  // Two panels of 8 rows side by side in the scratch.
  const int64_t half = panel_scratch_bytes(avx2_kernel_set(), t.cols) / 2 / 64 * 64;
  const Panel panels[2] = {panel_in(t.scratch, t.cols, P), panel_in(t.scratch + half, t.cols, P)};
  for (int64_t r0 = 0; r0 < t.n_w; r0 += 2 * P) {
    const int nrows = static_cast<int>(t.n_w - r0 < 2 * P ? t.n_w - r0 : 2 * P);
    repack<D>(t, r0, nrows < P ? nrows : P, panels[0]);
    if (nrows > P) {
      repack<D>(t, r0 + P, nrows - P, panels[1]);
      micro_rows<D, 2>(panels, t, r0, nrows);
    } else {
      micro_rows<D, 1>(panels, t, r0, nrows);
    }
  }
}

// ---- float panels ----------------------------------------------------------------------------
// Eight weight rows decoded to f32 ([8 rows][cols rounded up to 8], zero-padded), then NW
// weight rows x RN input rows per pass with one column-lane accumulator each: the direct
// kernels' arithmetic, without converting F16/BF16 again for every input row.

template <typename S>
void repack_float(const MatmulTask& t, int64_t r0, int nrows, float* panel, int64_t cols8) {
  for (int i = 0; i < nrows; ++i) {
    const uint8_t* w = t.w + (r0 + i) * t.w_stride;
    for (int64_t k = 0; k < t.cols; k += 8) {
      const int64_t n = t.cols - k < 8 ? t.cols - k : 8;
      _mm256_store_ps(panel + i * cols8 + k, n == 8 ? S::load8(w + k * S::kBytes) : load_tail<S>(w + k * S::kBytes, n));
    }
  }
}

template <int NW, int RN>
void micro_f(const float* panel, int64_t cols8, const MatmulTask& t, int64_t j0, float* y) {
  __m256 acc[NW][RN];
  const float* x[RN];
  for (int j = 0; j < RN; ++j) x[j] = t.x + (j0 + j) * t.ldx;
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < RN; ++j) acc[i][j] = _mm256_setzero_ps();
  const int64_t k8 = t.cols / 8 * 8;
  auto step = [&](int64_t k, const __m256* xv) {
    for (int i = 0; i < NW; ++i) {
      const __m256 w = _mm256_load_ps(panel + i * cols8 + k);
      for (int j = 0; j < RN; ++j) acc[i][j] = _mm256_fmadd_ps(w, xv[j], acc[i][j]);
    }
  };
  for (int64_t k = 0; k < k8; k += 8) {
    __m256 xv[RN];
    for (int j = 0; j < RN; ++j) xv[j] = _mm256_loadu_ps(x[j] + k);
    step(k, xv);
  }
  if (k8 < t.cols) {  // padded weight columns are zero; x beyond cols is not read
    __m256 xv[RN];
    for (int j = 0; j < RN; ++j) xv[j] = load_first_ps(x[j] + k8, static_cast<int>(t.cols - k8));
    step(k8, xv);
  }
  for (int i = 0; i < NW; ++i)
    for (int j = 0; j < RN; ++j) y[j * t.ldy + i] = hsum8_canonical(acc[i][j]);
}

template <int NW>
void micro_f_rows(const float* panel, int64_t cols8, const MatmulTask& t, int64_t r0) {
  int64_t j = 0;
  for (; j + 3 <= t.n_x; j += 3) micro_f<NW, 3>(panel, cols8, t, j, t.y + j * t.ldy + r0);
  for (; j < t.n_x; ++j) micro_f<NW, 1>(panel, cols8, t, j, t.y + j * t.ldy + r0);
}

template <typename S>
void panel_float(const MatmulTask& t) {
  float* panel = reinterpret_cast<float*>(t.scratch);
  const int64_t cols8 = (t.cols + 7) / 8 * 8;
  for (int64_t r0 = 0; r0 < t.n_w; r0 += P) {
    const int nrows = static_cast<int>(t.n_w - r0 < P ? t.n_w - r0 : P);
    repack_float<S>(t, r0, nrows, panel, cols8);
    for (int i = 0; i < nrows; i += 4) {
      const float* rows = panel + i * cols8;
      switch (nrows - i < 4 ? nrows - i : 4) {
        case 4:
          micro_f_rows<4>(rows, cols8, t, r0 + i);
          break;
        case 3:
          micro_f_rows<3>(rows, cols8, t, r0 + i);
          break;
        case 2:
          micro_f_rows<2>(rows, cols8, t, r0 + i);
          break;
        default:
          micro_f_rows<1>(rows, cols8, t, r0 + i);
          break;
      }
    }
  }
}

}  // namespace

const MatmulKernel avx2_panel_kernels[kNumWKinds] = {
    panel_float<F32Src>,   panel_float<F16Src>,  panel_float<BF16Src>, panel_q<DQ4_0>,
    panel_q<DQ4_1>,        panel_q<DQ5_0>,       panel_q<DQ5_1>,       panel_q<DQ8_0>,
    panel_q<DQK45<false>>, panel_q<DQK45<true>>, panel_q<DQ6K>,
};

}  // namespace tessera::mm
