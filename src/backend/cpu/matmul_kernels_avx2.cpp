// AVX2 + FMA + F16C: the activation quantizers and the direct kernels, which read weights in
// their GGUF layout (decode and small batches; their body is matmul_direct_impl.h, shared with
// the AVX-512 set). Prefill panels: matmul_panel_avx2.cpp.
//
// Block dots follow GGML's integer arithmetic: unsigned weight bytes times signed activation
// bytes with _mm256_maddubs_epi16, pairs summed to i32 with _mm256_madd_epi16; signed weights
// go through the sign trick (|w| times x carrying w's sign). The f32 arithmetic follows the
// canonical order of matmul_kernels.h.
#include <immintrin.h>

#include <cstddef>
#include <cstring>
#include <type_traits>

#include "backend/cpu/matmul_direct_impl.h"  // the direct kernels (kDirectKernels)
#include "backend/cpu/matmul_kernels.h"
#include "quant/blocks.h"

namespace tessera::mm {

namespace {

inline float fp16_round(float f) { return _cvtsh_ss(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)); }

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
        const __m256 ax = _mm256_andnot_ps(sign, _mm256_loadu_ps(xb + k));
        const int mask = _mm256_movemask_ps(_mm256_cmp_ps(ax, va, _CMP_EQ_OQ));
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
        const __m256i w32 = _mm256_madd_epi16(w16, _mm256_set1_epi16(1));       // 8 quad sums
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
  finish_q8k_row(row, l);
}

const KernelSet& avx2_kernel_set() {
  static const KernelSet set = [] {
    KernelSet s{};
    s.name = "avx2";
    s.quantize_q8 = avx2_quantize_q8;
    s.quantize_q8k = avx2_quantize_q8k;
    for (int k = 0; k < kNumWKinds; ++k) s.direct[k] = kDirectKernels[k], s.panel[k] = avx2_panel_kernels[k];
    s.panel_rows = 2 * kAvx2PanelRows;
    return s;
  }();
  return set;
}

}  // namespace tessera::mm
