// AVX-512 (F/BW/VL/DQ + VNNI + BF16) prefill kernels: the AVX2 panel scheme with one zmm
// lane per weight row (16 rows per panel) and _mm512_dpbusd_epi32, which multiplies u8
// weights by s8 activations and accumulates straight into i32, so no i16 stage can overflow
// and signed Q8_0 weights simply carry a +128 offset that the activation sums take back out.
// Decode is bound by memory bandwidth, not instructions: the direct kernels and the
// activation quantizers are the AVX2 ones (bit-identical quantization on every path).
#include <immintrin.h>

#include <cstring>

// GCC 12's _mm512_cvtepi32_ps seeds its result with _mm512_undefined_ps(), which
// -Wmaybe-uninitialized misreads; nothing here reads an undefined value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "backend/cpu/matmul_kernels.h"
#include "quant/blocks.h"

namespace tessera::mm {

namespace {

constexpr int P = kAvx512PanelRows;  // 16

// Rows 0..7 and 8..15 (32 bytes each) to 16 x 4-byte groups: group g = 64 bytes at dst + 64 g.
inline void store_transposed16(const __m256i rows[P], uint8_t* dst, bool flip_sign) {
  __m256i lo[8], hi[8];
  transpose_8x8(rows, lo);
  transpose_8x8(rows + 8, hi);
  const __m256i flip = _mm256_set1_epi8(flip_sign ? static_cast<char>(0x80) : 0);
  for (int g = 0; g < 8; ++g) {
    __m256i* o = reinterpret_cast<__m256i*>(dst + 64 * g);
    _mm256_store_si256(o, _mm256_xor_si256(lo[g], flip));
    _mm256_store_si256(o + 1, _mm256_xor_si256(hi[g], flip));
  }
}

template <typename D>
void repack16(const MatmulTask& t, int64_t r0, int nrows, const Panel& p) {
  constexpr int kSubsPerChunk = D::kChunk / D::kSub;
  const int64_t n_chunks = t.cols / D::kChunk;
  const int64_t src_bytes = t.w_stride / n_chunks;
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
      store_transposed16(rows, p.q + (c * (D::kChunk / 32) + s32) * 32 * P, D::kSigned);
    }
    for (int s = 0; s < kSubsPerChunk; ++s) {
      for (int i = 0; i < P; ++i) {
        p.d[(c * kSubsPerChunk + s) * P + i] = d[i][s];
        if constexpr (D::kHasMin) p.m[(c * kSubsPerChunk + s) * P + i] = m[i][s];
      }
    }
  }
}

inline void store_rows16(float* y, __m512 v, int nrows) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << nrows) - 1), v);
}

template <typename D, int RN>
void micro_q16(const Panel& p, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  constexpr int B = D::kSub, G = B / 4, kSubs = 32 / B;
  constexpr int kZero = D::kZero + (D::kSigned ? 128 : 0);
  ActRow a[RN];
  for (int j = 0; j < RN; ++j) a[j] = act_row(t.act, *t.act_layout, j0 + j);
  __m512 acc[RN];
  for (int j = 0; j < RN; ++j) acc[j] = _mm512_setzero_ps();
  const int64_t n_chunks = t.cols / 32;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const uint8_t* q = p.q + c * 32 * P;
    for (int s = 0; s < kSubs; ++s) {
      const int64_t sub = c * kSubs + s;
      __m512i isum[RN];
      for (int j = 0; j < RN; ++j) isum[j] = _mm512_setzero_si512();
      for (int g = 0; g < G; ++g) {
        const int grp = s * G + g;
        const __m512i w = _mm512_load_si512(q + grp * 64);
        for (int j = 0; j < RN; ++j) {
          int32_t x4;
          std::memcpy(&x4, a[j].qs + c * 32 + grp * 4, 4);
          isum[j] = _mm512_dpbusd_epi32(isum[j], w, _mm512_set1_epi32(x4));
        }
      }
      const __m512 dw = _mm512_load_ps(p.d + sub * P);
      for (int j = 0; j < RN; ++j) {
        __m512i is = isum[j];
        if constexpr (kZero != 0) {
          const int32_t xs = B == 32 ? a[j].sum32[sub] : a[j].sum16[sub];
          is = _mm512_sub_epi32(is, _mm512_set1_epi32(kZero * xs));
        }
        const float dx = B == 32 ? a[j].d32[sub] : a[j].d32[sub / 2];
        acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(dx)), _mm512_cvtepi32_ps(is), acc[j]);
        if constexpr (D::kHasMin)
          acc[j] = _mm512_fmadd_ps(_mm512_load_ps(p.m + sub * P), _mm512_set1_ps(a[j].s32[sub]), acc[j]);
      }
    }
  }
  for (int j = 0; j < RN; ++j) store_rows16(y + j * t.ldy, acc[j], nrows);
}

template <typename D>
void panel_q16(const MatmulTask& t) {
  const Panel p = panel_in(t.scratch, t.cols, D::kSub, P);
  for (int64_t r0 = 0; r0 < t.n_w; r0 += P) {
    const int nrows = static_cast<int>(t.n_w - r0 < P ? t.n_w - r0 : P);
    repack16<D>(t, r0, nrows, p);
    int64_t j = 0;
    for (; j + 6 <= t.n_x; j += 6) micro_q16<D, 6>(p, t, j, t.y + j * t.ldy + r0, nrows);
    for (; j + 2 <= t.n_x; j += 2) micro_q16<D, 2>(p, t, j, t.y + j * t.ldy + r0, nrows);
    if (j < t.n_x) micro_q16<D, 1>(p, t, j, t.y + j * t.ldy + r0, nrows);
  }
}

// ---- float panels: f32 [cols][16 rows] -------------------------------------------------------

// BF16 rows through the AVX512-BF16 conversion (exact: bf16 is the top half of an f32).
struct BF16Src512 {
  static constexpr int kBytes = 2;
  static __m256 load8(const uint8_t* w) {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    return _mm256_cvtpbh_ps((__m128bh)raw);
  }
};

template <typename S>
void repack_float16(const MatmulTask& t, int64_t r0, int nrows, float* panel) {
  for (int64_t k = 0; k < t.cols; k += 8) {
    const int64_t n = t.cols - k < 8 ? t.cols - k : 8;
    __m256i rows[P];
    for (int i = 0; i < P; ++i) {
      const uint8_t* w = t.w + (r0 + i) * t.w_stride + k * S::kBytes;
      rows[i] = i >= nrows ? _mm256_setzero_si256()
                           : _mm256_castps_si256(n == 8 ? S::load8(w) : load_tail<S>(w, n));
    }
    store_transposed16(rows, reinterpret_cast<uint8_t*>(panel + k * P), false);
  }
}

template <int RN>
void micro_f16(const float* panel, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  __m512 acc[RN];
  const float* x[RN];
  for (int j = 0; j < RN; ++j) acc[j] = _mm512_setzero_ps(), x[j] = t.x + (j0 + j) * t.ldx;
  for (int64_t k = 0; k < t.cols; ++k) {
    const __m512 w = _mm512_load_ps(panel + k * P);
    for (int j = 0; j < RN; ++j) acc[j] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[j][k]), acc[j]);
  }
  for (int j = 0; j < RN; ++j) store_rows16(y + j * t.ldy, acc[j], nrows);
}

template <typename S>
void panel_float16(const MatmulTask& t) {
  float* panel = reinterpret_cast<float*>(t.scratch);
  for (int64_t r0 = 0; r0 < t.n_w; r0 += P) {
    const int nrows = static_cast<int>(t.n_w - r0 < P ? t.n_w - r0 : P);
    repack_float16<S>(t, r0, nrows, panel);
    int64_t j = 0;
    for (; j + 8 <= t.n_x; j += 8) micro_f16<8>(panel, t, j, t.y + j * t.ldy + r0, nrows);
    for (; j < t.n_x; ++j) micro_f16<1>(panel, t, j, t.y + j * t.ldy + r0, nrows);
  }
}

}  // namespace

const KernelSet& avx512_kernel_set() {
  static const KernelSet set = [] {
    KernelSet s{};
    s.name = "avx512";
    s.quantize_q8 = avx2_quantize_q8;
    s.quantize_q8k = avx2_quantize_q8k;
    for (int k = 0; k < kNumWKinds; ++k) s.direct[k] = avx2_direct_kernels[k];
    const MatmulKernel panels[kNumWKinds] = {
        panel_float16<F32Src>, panel_float16<F16Src>, panel_float16<BF16Src512>, panel_q16<DQ4_0>,
        panel_q16<DQ4_1>,      panel_q16<DQ5_0>,      panel_q16<DQ5_1>,          panel_q16<DQ8_0>,
        panel_q16<DQK45<false>>, panel_q16<DQK45<true>>, panel_q16<DQ6K>,
    };
    for (int k = 0; k < kNumWKinds; ++k) s.panel[k] = panels[k];
    s.panel_rows = kAvx512PanelRows;
    return s;
  }();
  return set;
}

}  // namespace tessera::mm
