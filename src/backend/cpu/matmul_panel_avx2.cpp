// AVX2 prefill kernels. Eight weight rows at a time are repacked into a panel in the
// thread's scratch (L1-sized) so that one 32-byte load holds 4 consecutive quants of each of
// the 8 rows; a broadcast of 4 activation bytes times that register, through
// _mm256_maddubs_epi16, advances all 8 dot products at once, one register lane per weight
// row. Per block the lanes need no horizontal sums: the i16 pair sums of up to 8 steps are
// added in i16 where they cannot overflow, turned to i32 once, and scaled with one FMA by the
// 8 rows' scales times the activation's scale. Each panel then meets every input row of the
// task, 4 rows per pass, so the repacking is paid once per many rows.
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
// Layout: q [cols/32][8 groups of 4][8 rows][4 bytes]; d, m [cols/B][8 rows] f32.

template <typename D>
void repack(const MatmulTask& t, int64_t r0, int nrows, const Panel& p) {
  constexpr int kSubsPerChunk = D::kChunk / D::kSub;
  const int64_t n_chunks = t.cols / D::kChunk;
  const int64_t src_bytes = t.w_stride / n_chunks;  // bytes of one block of the row
  alignas(32) uint8_t q[P][D::kChunk];
  float d[P][kSubsPerChunk], m[P][kSubsPerChunk];
  for (int64_t c = 0; c < n_chunks; ++c) {
    for (int i = 0; i < P; ++i) {
      if (i < nrows) {
        D::decode(t.w + (r0 + i) * t.w_stride + c * src_bytes, q[i], d[i], m[i]);
      } else {
        std::memset(q[i], 0, D::kChunk);
        for (int s = 0; s < kSubsPerChunk; ++s) d[i][s] = 0.0f, m[i][s] = 0.0f;
      }
    }
    for (int s32 = 0; s32 < D::kChunk / 32; ++s32) {
      __m256i rows[P];
      for (int i = 0; i < P; ++i) rows[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(q[i] + 32 * s32));
      store_transposed(rows, p.q + (c * (D::kChunk / 32) + s32) * 32 * P);
    }
    for (int s = 0; s < kSubsPerChunk; ++s) {
      for (int i = 0; i < P; ++i) {
        p.d[(c * kSubsPerChunk + s) * P + i] = d[i][s];
        if constexpr (D::kHasMin) p.m[(c * kSubsPerChunk + s) * P + i] = m[i][s];
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

// RN input rows against NP panels of 8 weight rows. Per 4-column group: one load per panel,
// one broadcast per input row, NP * RN maddubs; i16 partial sums go to i32 every kSteps
// groups; f32 accumulators live in L1 (touched once per sub-block).
template <typename D, int NP, int RN>
void micro_q(const Panel* panels, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  constexpr int B = D::kSub, G = B / 4, kSubs = 32 / B, kSteps = D::kSteps;
  const __m256i ones = _mm256_set1_epi16(1);
  const int8_t* xq[RN];
  ActRow a[RN];
  for (int j = 0; j < RN; ++j) a[j] = act_row(t.act, *t.act_layout, j0 + j), xq[j] = a[j].qs;
  alignas(32) float facc[NP][RN][P] = {};
  const int64_t n_chunks = t.cols / 32;
  for (int64_t c = 0; c < n_chunks; ++c) {
    for (int s = 0; s < kSubs; ++s) {
      const int64_t sub = c * kSubs + s;
      __m256i isum[NP][RN], acc16[NP][RN];
      for (int p = 0; p < NP; ++p)
        for (int j = 0; j < RN; ++j) isum[p][j] = _mm256_setzero_si256(), acc16[p][j] = _mm256_setzero_si256();
      for (int g = 0; g < G; ++g) {
        const int grp = s * G + g;
        __m256i w[NP], wu[NP];
        for (int p = 0; p < NP; ++p) {
          w[p] = _mm256_load_si256(reinterpret_cast<const __m256i*>(panels[p].q + c * 32 * P + grp * 32));
          wu[p] = D::kSigned ? _mm256_sign_epi8(w[p], w[p]) : w[p];
        }
        for (int j = 0; j < RN; ++j) {
          int32_t x4;
          std::memcpy(&x4, xq[j] + c * 32 + grp * 4, 4);
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
        const __m256 dw = _mm256_load_ps(panels[p].d + sub * P);
        for (int j = 0; j < RN; ++j) {
          __m256i is = kSteps == G ? _mm256_madd_epi16(acc16[p][j], ones) : isum[p][j];
          if constexpr (D::kZero != 0) {
            const int32_t xs = B == 32 ? a[j].sum32[sub] : a[j].sum16[sub];
            is = _mm256_sub_epi32(is, _mm256_set1_epi32(D::kZero * xs));
          }
          const float dx = B == 32 ? a[j].d32[sub] : a[j].d32[sub / 2];
          __m256 acc = _mm256_load_ps(facc[p][j]);
          acc = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(dx)), _mm256_cvtepi32_ps(is), acc);
          if constexpr (D::kHasMin)
            acc = _mm256_fmadd_ps(_mm256_load_ps(panels[p].m + sub * P), _mm256_set1_ps(a[j].s32[sub]), acc);
          _mm256_store_ps(facc[p][j], acc);
        }
      }
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int j = 0; j < RN; ++j) store_rows(y + j * t.ldy + p * P, _mm256_load_ps(facc[p][j]), nrows - p * P);
}

template <typename D, int NP>
void micro_rows(const Panel* panels, const MatmulTask& t, int64_t r0, int nrows) {
  // Input rows per pass: with two panels, 3 (12 registers of partial sums), or 2 where both
  // i16 and i32 partial sums are live (formats with fewer than 8 i16 steps); 4 with one.
  constexpr bool kOneStage = D::kSteps == 1 || D::kSteps == D::kSub / 4;
  constexpr int RN = NP == 2 ? (kOneStage ? 3 : 2) : 4;
  int64_t j = 0;
  for (; j + RN <= t.n_x; j += RN) micro_q<D, NP, RN>(panels, t, j, t.y + j * t.ldy + r0, nrows);
  for (; j < t.n_x; ++j) micro_q<D, NP, 1>(panels, t, j, t.y + j * t.ldy + r0, nrows);
}

template <typename D>
void panel_q(const MatmulTask& t) {
  // Two panels of 8 rows side by side in the scratch.
  const int64_t half = panel_scratch_bytes(avx2_kernel_set(), t.cols) / 2 / 64 * 64;
  const Panel panels[2] = {panel_in(t.scratch, t.cols, D::kSub, P), panel_in(t.scratch + half, t.cols, D::kSub, P)};
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
// Layout: f32 [cols][8 rows]; one broadcast activation times one panel row per FMA.

template <typename S>
void repack_float(const MatmulTask& t, int64_t r0, int nrows, float* panel) {
  for (int64_t k = 0; k < t.cols; k += 8) {
    const int64_t n = t.cols - k < 8 ? t.cols - k : 8;
    __m256i rows[P];
    for (int i = 0; i < P; ++i) {
      const uint8_t* w = t.w + (r0 + i) * t.w_stride + k * S::kBytes;
      rows[i] = i >= nrows ? _mm256_setzero_si256()
                           : _mm256_castps_si256(n == 8 ? S::load8(w) : load_tail<S>(w, n));
    }
    // The panel has room for the padding of a last partial group (scratch is sized in 8s).
    store_transposed(rows, reinterpret_cast<uint8_t*>(panel + k * P));
  }
}

template <int RN>
void micro_f(const float* panel, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  __m256 acc[RN];
  const float* x[RN];
  for (int j = 0; j < RN; ++j) acc[j] = _mm256_setzero_ps(), x[j] = t.x + (j0 + j) * t.ldx;
  for (int64_t k = 0; k < t.cols; ++k) {
    const __m256 w = _mm256_load_ps(panel + k * P);
    for (int j = 0; j < RN; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_broadcast_ss(x[j] + k), acc[j]);
  }
  for (int j = 0; j < RN; ++j) store_rows(y + j * t.ldy, acc[j], nrows);
}

template <typename S>
void panel_float(const MatmulTask& t) {
  float* panel = reinterpret_cast<float*>(t.scratch);
  for (int64_t r0 = 0; r0 < t.n_w; r0 += P) {
    const int nrows = static_cast<int>(t.n_w - r0 < P ? t.n_w - r0 : P);
    repack_float<S>(t, r0, nrows, panel);
    int64_t j = 0;
    for (; j + 6 <= t.n_x; j += 6) micro_f<6>(panel, t, j, t.y + j * t.ldy + r0, nrows);
    for (; j < t.n_x; ++j) micro_f<1>(panel, t, j, t.y + j * t.ldy + r0, nrows);
  }
}

}  // namespace

const MatmulKernel avx2_panel_kernels[kNumWKinds] = {
    panel_float<F32Src>, panel_float<F16Src>, panel_float<BF16Src>, panel_q<DQ4_0>,
    panel_q<DQ4_1>,      panel_q<DQ5_0>,      panel_q<DQ5_1>,        panel_q<DQ8_0>,
    panel_q<DQK45<false>>, panel_q<DQK45<true>>, panel_q<DQ6K>,
};

}  // namespace tessera::mm
