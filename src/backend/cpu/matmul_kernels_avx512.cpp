// AVX-512 (F/BW/VL/DQ + VNNI + BF16) prefill kernels: the AVX2 panel scheme with one zmm
// lane per weight row (16 rows per panel) and _mm512_dpbusd_epi32, which multiplies u8
// weights by s8 activations and accumulates straight into i32, so no i16 stage can overflow
// and signed Q8_0 weights simply carry a +128 offset that the activation sums take back out.
// The f32 arithmetic is the canonical order of matmul_kernels.h, as on every path, so the
// results are bitwise those of the AVX2 and scalar kernels.
// The activation quantizers are the AVX2 ones; the direct kernels (decode, small batches) are
// matmul_direct_impl.h compiled here with VNNI block dots: a speculative verification's few
// rows are bound by those instructions, not by the weights' bytes (docs/benchmarks/cpu.md).
#include <immintrin.h>

#include <cstring>

// GCC 12's _mm512_cvtepi32_ps and _mm512_castps512_ps256 seed their results with
// _mm512_undefined_ps() / _mm256_undefined_pd(), which -W(maybe-)uninitialized misreads;
// nothing here reads an undefined value.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The direct kernels with their integer block dots on AVX-512 VNNI (_mm256_dpbusd_epi32).
#define TESSERA_MM_VNNI 1
#include "backend/cpu/matmul_direct_impl.h"
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

// Panel layout as on AVX2 (matmul_kernels.h), 16 rows, except K-quant sub-block scales: sc
// [16][16 rows] plain i32 (they multiply i32 sub-block sums with _mm512_mullo_epi32).
template <typename D>
void repack16(const MatmulTask& t, int64_t r0, int nrows, const Panel& p) {
  constexpr int kBlocks = D::kChunk / 32;
  const int64_t n_chunks = t.cols / D::kChunk;
  const int64_t src_bytes = t.w_stride / n_chunks;
  alignas(32) uint8_t q[P][D::kChunk];
  float d[P], m[P];
  SuperScales ss[P];
  for (int64_t c = 0; c < n_chunks; ++c) {
    for (int i = 0; i < P; ++i) {
      const uint8_t* src = t.w + (r0 + i) * t.w_stride + c * src_bytes;
      if (i >= nrows) {
        std::memset(q[i], 0, D::kChunk);
        d[i] = m[i] = 0.0f;
        if constexpr (D::kSuper) ss[i] = SuperScales{};
      } else if constexpr (D::kSuper) {
        D::decode(src, q[i], &ss[i]);
      } else {
        D::decode(src, q[i], &d[i], &m[i]);
      }
    }
    for (int s32 = 0; s32 < kBlocks; ++s32) {
      __m256i rows[P];
      for (int i = 0; i < P; ++i) rows[i] = _mm256_load_si256(reinterpret_cast<const __m256i*>(q[i] + 32 * s32));
      store_transposed16(rows, p.q + (c * kBlocks + s32) * 32 * P, D::kSigned);
    }
    for (int i = 0; i < P; ++i) {
      if constexpr (D::kSuper) {
        p.d[c * P + i] = ss[i].d;
        p.m[c * P + i] = ss[i].dmin;
        for (int s = 0; s < D::kSubs; ++s) p.sc[(c * 16 + s) * P + i] = ss[i].sc[s];
        if constexpr (D::kHasMin)
          for (int k = 0; k < 4; ++k) p.mp[(c * 4 + k) * P + i] = i16_pair(ss[i].mn[2 * k], ss[i].mn[2 * k + 1]);
      } else {
        p.d[c * P + i] = d[i];
        if constexpr (D::kHasMin) p.m[c * P + i] = m[i];
      }
    }
  }
}

inline void store_rows16(float* y, __m512 v, int nrows) {
  _mm512_mask_storeu_ps(y, static_cast<__mmask16>((1u << nrows) - 1), v);
}

// The exact block sums of 4-byte groups [g0, g0 + n) of one chunk, for RN input rows.
template <int RN>
inline void dot_groups(const uint8_t* q, const ActRow* a, int64_t x_off, int n, __m512i is[RN]) {
  for (int j = 0; j < RN; ++j) is[j] = _mm512_setzero_si512();
  for (int g = 0; g < n; ++g) {
    const __m512i w = _mm512_load_si512(q + g * 64);
    for (int j = 0; j < RN; ++j) {
      int32_t x4;
      std::memcpy(&x4, a[j].qs + x_off + 4 * g, 4);
      is[j] = _mm512_dpbusd_epi32(is[j], w, _mm512_set1_epi32(x4));
    }
  }
}

// 32-value blocks.
template <typename D, int RN>
void micro_q16(const Panel& p, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  constexpr int kZero = D::kZero + (D::kSigned ? 128 : 0);
  ActRow a[RN];
  for (int j = 0; j < RN; ++j) a[j] = act_row(t.act, *t.act_layout, j0 + j);
  __m512 acc[RN];
  for (int j = 0; j < RN; ++j) acc[j] = _mm512_setzero_ps();
  const int64_t n_blocks = t.cols / 32;
  for (int64_t c = 0; c < n_blocks; ++c) {
    __m512i isum[RN];
    dot_groups<RN>(p.q + c * 32 * P, a, c * 32, 8, isum);
    const __m512 dw = _mm512_load_ps(p.d + c * P);
    for (int j = 0; j < RN; ++j) {
      __m512i is = isum[j];
      if constexpr (kZero != 0) is = _mm512_sub_epi32(is, _mm512_set1_epi32(kZero * a[j].sum32[c]));
      acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(a[j].d32[c])), _mm512_cvtepi32_ps(is), acc[j]);
      if constexpr (D::kHasMin)
        acc[j] = _mm512_fmadd_ps(_mm512_load_ps(p.m + c * P), _mm512_set1_ps(a[j].s32[c]), acc[j]);
    }
  }
  for (int j = 0; j < RN; ++j) store_rows16(y + j * t.ldy, acc[j], nrows);
}

// K-quants: i32 sums per sub-block (Q6_K: minus 32 * its activation sum) times the sub-block
// scales, summed over the super-block; Q4_K/Q5_K mins through i16 pairs and VNNI dpwssd.
template <typename D, int RN>
void micro_qk16(const Panel& p, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  constexpr int B = D::kSub, G = B / 4, kSubs = D::kSubs;
  ActRow a[RN];
  for (int j = 0; j < RN; ++j) a[j] = act_row(t.act, *t.act_layout, j0 + j);
  __m512 acc[RN];
  for (int j = 0; j < RN; ++j) acc[j] = _mm512_setzero_ps();
  const int64_t n_super = t.cols / 256;
  for (int64_t c = 0; c < n_super; ++c) {
    const int64_t sb = c * 8;  // first group of 32 of the super-block
    __m512i isum[RN], msum[RN];
    for (int j = 0; j < RN; ++j) isum[j] = _mm512_setzero_si512(), msum[j] = _mm512_setzero_si512();
    for (int s = 0; s < kSubs; ++s) {
      const int e = s * B;  // first element of the sub-block
      __m512i is[RN];
      dot_groups<RN>(p.q + (c * 8 + e / 32) * 32 * P + (e % 32) / 4 * 64, a, c * 256 + e, G, is);
      const __m512i sc = _mm512_load_si512(p.sc + (c * 16 + s) * P);
      for (int j = 0; j < RN; ++j) {
        if constexpr (D::kZero != 0)
          is[j] = _mm512_sub_epi32(is[j], _mm512_set1_epi32(D::kZero * a[j].sum16[2 * sb + s]));
        isum[j] = _mm512_add_epi32(isum[j], _mm512_mullo_epi32(is[j], sc));
      }
    }
    if constexpr (D::kHasMin) {
      for (int k = 0; k < 4; ++k) {
        const __m512i pair = _mm512_load_si512(p.mp + (c * 4 + k) * P);
        for (int j = 0; j < RN; ++j)
          msum[j] = _mm512_dpwssd_epi32(msum[j], pair, _mm512_set1_epi32(a[j].pair32[c * 4 + k]));
      }
    }
    const __m512 dw = _mm512_load_ps(p.d + c * P), dmin = _mm512_load_ps(p.m + c * P);
    for (int j = 0; j < RN; ++j) {
      const __m512 dx = _mm512_set1_ps(a[j].d32[sb]);
      acc[j] = _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[j]), acc[j]);
      if constexpr (D::kHasMin) acc[j] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(msum[j]), acc[j]);
    }
  }
  for (int j = 0; j < RN; ++j) store_rows16(y + j * t.ldy, acc[j], nrows);
}

template <typename D, int RN>
void micro16(const Panel& p, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  if constexpr (D::kSuper)
    micro_qk16<D, RN>(p, t, j0, y, nrows);
  else
    micro_q16<D, RN>(p, t, j0, y, nrows);
}

template <typename D>
void panel_q16(const MatmulTask& t) {
  const Panel p = panel_in(t.scratch, t.cols, P);
  for (int64_t r0 = 0; r0 < t.n_w; r0 += P) {
    const int nrows = static_cast<int>(t.n_w - r0 < P ? t.n_w - r0 : P);
    repack16<D>(t, r0, nrows, p);
    int64_t j = 0;
    for (; j + 6 <= t.n_x; j += 6) micro16<D, 6>(p, t, j, t.y + j * t.ldy + r0, nrows);
    for (; j + 2 <= t.n_x; j += 2) micro16<D, 2>(p, t, j, t.y + j * t.ldy + r0, nrows);
    if (j < t.n_x) micro16<D, 1>(p, t, j, t.y + j * t.ldy + r0, nrows);
  }
}

// ---- float panels ----------------------------------------------------------------------------
// Column lanes as in every kernel, two weight rows per zmm: pair q of the panel holds row 2q
// in lanes 0-7 and row 2q+1 in lanes 8-15, each half an 8-lane canonical accumulator, reduced
// with the same tree as the AVX2 kernels (hsum8x8_canonical).
// Layout: f32 [cols rounded up to 8 / 8][8 pairs][16], zero-padded.

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
    float* dst = panel + k * P;  // (k / 8) * 8 pairs * 16
    for (int i = 0; i < P; ++i) {
      const uint8_t* w = t.w + (r0 + i) * t.w_stride + k * S::kBytes;
      const __m256 v = i >= nrows ? _mm256_setzero_ps() : n == 8 ? S::load8(w) : load_tail<S>(w, n);
      _mm256_store_ps(dst + (i / 2) * 16 + (i % 2) * 8, v);
    }
  }
}

// Pairs [q0, q0 + 4) of the panel (rows 2 q0 .. 2 q0 + 7) against RN input rows: 4 * RN
// accumulators; the 8 rows' f32 (48 KB at 1536 columns) are read once per RN input rows.
template <int RN>
void micro_f16(const float* panel, int q0, const MatmulTask& t, int64_t j0, float* y, int nrows) {
  constexpr int kPairs = 4;
  __m512 acc[kPairs][RN];
  const float* x[RN];
  for (int j = 0; j < RN; ++j) x[j] = t.x + (j0 + j) * t.ldx;
  for (int q = 0; q < kPairs; ++q)
    for (int j = 0; j < RN; ++j) acc[q][j] = _mm512_setzero_ps();
  const int64_t k8 = t.cols / 8 * 8;
  auto step = [&](int64_t k, const __m512* xv) {
    const float* w = panel + k * P + 16 * q0;
    for (int q = 0; q < kPairs; ++q) {
      const __m512 wq = _mm512_load_ps(w + 16 * q);
      for (int j = 0; j < RN; ++j) acc[q][j] = _mm512_fmadd_ps(wq, xv[j], acc[q][j]);
    }
  };
  for (int64_t k = 0; k < k8; k += 8) {
    __m512 xv[RN];
    for (int j = 0; j < RN; ++j) xv[j] = _mm512_broadcast_f32x8(_mm256_loadu_ps(x[j] + k));
    step(k, xv);
  }
  if (k8 < t.cols) {  // padded weight columns are zero; x beyond cols is not read
    const __mmask8 mask = static_cast<__mmask8>((1u << (t.cols - k8)) - 1);
    __m512 xv[RN];
    for (int j = 0; j < RN; ++j) xv[j] = _mm512_broadcast_f32x8(_mm256_maskz_loadu_ps(mask, x[j] + k8));
    step(k8, xv);
  }
  const int n_out = nrows - 2 * q0 < 8 ? nrows - 2 * q0 : 8;
  const __mmask8 out_mask = static_cast<__mmask8>((1u << n_out) - 1);
  for (int j = 0; j < RN; ++j) {
    __m256 halves[8];  // rows 2 q0 .. 2 q0 + 7
    for (int q = 0; q < kPairs; ++q) {
      halves[2 * q] = _mm512_castps512_ps256(acc[q][j]);
      halves[2 * q + 1] = _mm512_extractf32x8_ps(acc[q][j], 1);
    }
    _mm256_mask_storeu_ps(y + j * t.ldy + 2 * q0, out_mask, hsum8x8_canonical(halves));
  }
}

template <typename S>
void panel_float16(const MatmulTask& t) {
  float* panel = reinterpret_cast<float*>(t.scratch);
  for (int64_t r0 = 0; r0 < t.n_w; r0 += P) {
    const int nrows = static_cast<int>(t.n_w - r0 < P ? t.n_w - r0 : P);
    repack_float16<S>(t, r0, nrows, panel);
    for (int q0 = 0; 2 * q0 < nrows; q0 += 4) {
      int64_t j = 0;
      for (; j + 6 <= t.n_x; j += 6) micro_f16<6>(panel, q0, t, j, t.y + j * t.ldy + r0, nrows);
      for (; j < t.n_x; ++j) micro_f16<1>(panel, q0, t, j, t.y + j * t.ldy + r0, nrows);
    }
  }
}

}  // namespace

const KernelSet& avx512_kernel_set() {
  static const KernelSet set = [] {
    KernelSet s{};
    s.name = "avx512";
    s.quantize_q8 = avx2_quantize_q8;
    s.quantize_q8k = avx2_quantize_q8k;
    for (int k = 0; k < kNumWKinds; ++k) s.direct[k] = kDirectKernels[k];
    const MatmulKernel panels[kNumWKinds] = {
        panel_float16<F32Src>,   panel_float16<F16Src>,  panel_float16<BF16Src512>, panel_q16<DQ4_0>,
        panel_q16<DQ4_1>,        panel_q16<DQ5_0>,       panel_q16<DQ5_1>,          panel_q16<DQ8_0>,
        panel_q16<DQK45<false>>, panel_q16<DQK45<true>>, panel_q16<DQ6K>,
    };
    for (int k = 0; k < kNumWKinds; ++k) s.panel[k] = panels[k];
    s.panel_rows = kAvx512PanelRows;
    return s;
  }();
  return set;
}

}  // namespace tessera::mm
