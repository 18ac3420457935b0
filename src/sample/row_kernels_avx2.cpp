// AVX2 row kernels. Each one performs exactly the operations of its scalar twin in
// row_kernels.cpp, lane by lane, so the results are the same bits. Contraction is off here
// too: this file is built with -mfma, and GCC would otherwise fuse the intrinsics' mul+add.
//
// Only intrinsics and plain loops here, no inline functions from shared headers: an inline
// function compiled in this file with AVX2 could be the copy the linker keeps for everyone.
#include <immintrin.h>

#include "sample/row_kernels.h"

// After the includes, so that only this file's functions are affected.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tessera {

namespace {

struct ExpConstants {
  __m256i minus87_bits = _mm256_set1_epi32(static_cast<int32_t>(0xC2AE0000u));
  __m256 log2e = _mm256_set1_ps(1.44269504088896341f);
  __m256 round = _mm256_set1_ps(12582912.0f);
  __m256 ln2_hi = _mm256_set1_ps(0.693359375f);
  __m256 ln2_lo = _mm256_set1_ps(2.12194440e-4f);
  __m256 c0 = _mm256_set1_ps(1.9875691500e-4f);
  __m256 c1 = _mm256_set1_ps(1.3981999507e-3f);
  __m256 c2 = _mm256_set1_ps(8.3334519073e-3f);
  __m256 c3 = _mm256_set1_ps(4.1665795894e-2f);
  __m256 c4 = _mm256_set1_ps(1.6666665459e-1f);
  __m256 c5 = _mm256_set1_ps(5.0000001201e-1f);
  __m256 one = _mm256_set1_ps(1.0f);
  __m256i bias = _mm256_set1_epi32(127);
  __m256i bucket_edge_bits = _mm256_set1_epi32(static_cast<int32_t>(0xC2800000u));
  __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 buckets_per_unit = _mm256_set1_ps(kTopPBucketsPerUnit);
  __m256i last_bucket = _mm256_set1_epi32(kTopPBuckets - 1);
};

__attribute__((always_inline)) inline __m256 exp8(__m256 x, const ExpConstants& k) {
  const __m256i x_bits = _mm256_castps_si256(x);
  const __m256i clamped = _mm256_min_epu32(x_bits, k.minus87_bits);
  const __m256i keep_mask = _mm256_cmpeq_epi32(clamped, x_bits);  // x_bits <= bits(-87)
  const __m256 xc = _mm256_castsi256_ps(clamped);
  const __m256 n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, k.log2e), k.round), k.round);
  __m256 r = _mm256_sub_ps(xc, _mm256_mul_ps(n, k.ln2_hi));
  r = _mm256_add_ps(r, _mm256_mul_ps(n, k.ln2_lo));
  __m256 p = k.c0;
  p = _mm256_add_ps(_mm256_mul_ps(p, r), k.c1);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), k.c2);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), k.c3);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), k.c4);
  p = _mm256_add_ps(_mm256_mul_ps(p, r), k.c5);
  const __m256 er = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r), k.one);
  const __m256i n_int = _mm256_cvttps_epi32(n);
  const __m256 two_n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n_int, k.bias), 23));
  return _mm256_and_ps(_mm256_mul_ps(er, two_n), _mm256_castsi256_ps(keep_mask));
}

// (x - max) * inv_temperature for 8 logits.
__attribute__((always_inline)) inline __m256 scaled8(const float* x, __m256 max, __m256 inv_t) {
  return _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x), max), inv_t);
}

float max_avx2(const float* x, int64_t n, bool* has_nan) {
  __m256 m = _mm256_set1_ps(-__builtin_inff());
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    m = _mm256_max_ps(v, m);  // v > m ? v : m, so a NaN v leaves m alone, as in the scalar
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float max = lanes[0];
  for (int j = 1; j < 8; ++j) max = lanes[j] > max ? lanes[j] : max;
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  for (; i < n; ++i) {
    max = x[i] > max ? x[i] : max;
    any_nan |= x[i] != x[i];
  }
  *has_nan = any_nan;
  return max;
}

int64_t find_greater_avx2(const float* x, int64_t n, float threshold) {
  const __m256 t = _mm256_set1_ps(threshold);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {  // four vectors per test: most rows have few hits
    const __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_GT_OQ);
    const __m256 b = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), t, _CMP_GT_OQ);
    const __m256 c = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 16), t, _CMP_GT_OQ);
    const __m256 d = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 24), t, _CMP_GT_OQ);
    if (_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(a, b), _mm256_or_ps(c, d))) == 0) continue;
    const uint32_t mask =
        static_cast<uint32_t>(_mm256_movemask_ps(a)) | static_cast<uint32_t>(_mm256_movemask_ps(b)) << 8 |
        static_cast<uint32_t>(_mm256_movemask_ps(c)) << 16 | static_cast<uint32_t>(_mm256_movemask_ps(d)) << 24;
    return i + __builtin_ctz(mask);
  }
  for (; i < n; ++i)
    if (x[i] > threshold) return i;
  return n;
}

// kLeftPack[mask] lists the set bits of an 8-bit mask, lowest first, as bytes (rest 0):
// the permutation that packs the selected lanes of a vector to its front.
struct LeftPackTable {
  uint64_t lanes[256];
  constexpr LeftPackTable() : lanes() {
    for (uint32_t mask = 0; mask < 256; ++mask) {
      uint64_t packed = 0;
      int count = 0;
      for (uint32_t lane = 0; lane < 8; ++lane)
        if (mask & (1u << lane)) packed |= static_cast<uint64_t>(lane) << (8 * count++);
      lanes[mask] = packed;
    }
  }
};
constexpr LeftPackTable kLeftPack;

// Packs the indices base + at + lane of the selected lanes to out + count without branches:
// an 8-wide store (up to 8 entries past the result), then count advances by their number.
__attribute__((always_inline)) inline void pack8(__m256 selected, int32_t first_id, int32_t* out, int64_t& count) {
  const uint32_t mask = static_cast<uint32_t>(_mm256_movemask_ps(selected));
  const __m256i order = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(kLeftPack.lanes[mask])));
  const __m256i ids = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(first_id));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + count), _mm256_permutevar8x32_epi32(ids, order));
  count += __builtin_popcount(mask);
}

int64_t collect_at_most_avx2(const int32_t* v, int64_t n, int32_t limit, int32_t base, int32_t* out) {
  const __m256i above = _mm256_set1_epi32(limit);
  int64_t count = 0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i));
    // v <= limit is !(v > limit): flip the greater-than mask.
    const __m256i greater = _mm256_cmpgt_epi32(x, above);
    const __m256 selected = _mm256_castsi256_ps(_mm256_xor_si256(greater, _mm256_set1_epi32(-1)));
    pack8(selected, base + static_cast<int32_t>(i), out, count);
  }
  for (; i < n; ++i)
    if (v[i] <= limit) out[count++] = base + static_cast<int32_t>(i);
  return count;
}

int64_t collect_greater_avx2(const float* x, int64_t n, float threshold, int32_t base, int32_t* out) {
  const __m256 t = _mm256_set1_ps(threshold);
  int64_t count = 0;
  int64_t i = 0;
  auto pack = [&](int64_t at, __m256 selected) { pack8(selected, base + static_cast<int32_t>(at), out, count); };
  for (; i + 32 <= n; i += 32) {
    const __m256 a = _mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_GT_OQ);
    const __m256 b = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 8), t, _CMP_GT_OQ);
    const __m256 c = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 16), t, _CMP_GT_OQ);
    const __m256 d = _mm256_cmp_ps(_mm256_loadu_ps(x + i + 24), t, _CMP_GT_OQ);
    // Sparse rows skip 32 logits per test.
    if (_mm256_movemask_ps(_mm256_or_ps(_mm256_or_ps(a, b), _mm256_or_ps(c, d))) == 0) continue;
    pack(i, a);
    pack(i + 8, b);
    pack(i + 16, c);
    pack(i + 24, d);
  }
  for (; i + 8 <= n; i += 8) pack(i, _mm256_cmp_ps(_mm256_loadu_ps(x + i), t, _CMP_GT_OQ));
  for (; i < n; ++i)
    if (x[i] > threshold) out[count++] = base + static_cast<int32_t>(i);
  return count;
}

// The tail (fewer than 8 elements) goes through a padded vector: padding with `max` gives
// weight 1 in unused lanes, which are then ignored.
void tail_weights(const float* x, int64_t len, __m256 max, __m256 t, const ExpConstants& k, float* out) {
  alignas(32) float buf[8];
  _mm256_store_ps(buf, max);
  for (int64_t j = 0; j < len; ++j) buf[j] = x[j];
  _mm256_store_ps(buf, exp8(scaled8(buf, max, t), k));
  for (int64_t j = 0; j < len; ++j) out[j] = buf[j];
}

void weights_avx2(const float* x, int64_t n, float max, float inv_temperature, float* w) {
  const ExpConstants k;
  const __m256 m = _mm256_set1_ps(max);
  const __m256 t = _mm256_set1_ps(inv_temperature);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(w + i, exp8(scaled8(x + i, m, t), k));
  if (i < n) tail_weights(x + i, n - i, m, t, k, w + i);
}

double combine(const double* p) { return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])); }

double weight_sum_avx2(const float* x, int64_t n, float max, float inv_temperature) {
  const ExpConstants k;
  const __m256 m = _mm256_set1_ps(max);
  const __m256 t = _mm256_set1_ps(inv_temperature);
  __m256d lo = _mm256_setzero_pd();  // partials 0..3
  __m256d hi = _mm256_setzero_pd();  // partials 4..7
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 w = exp8(scaled8(x + i, m, t), k);
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(w)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1)));
  }
  alignas(32) double partial[8];
  _mm256_store_pd(partial, lo);
  _mm256_store_pd(partial + 4, hi);
  if (i < n) {
    float tail[8];
    tail_weights(x + i, n - i, m, t, k, tail);
    for (int64_t j = 0; j < n - i; ++j) partial[j] += tail[j];
  }
  return combine(partial);
}

__attribute__((always_inline)) inline __m256i bucket8(__m256 scaled, const ExpConstants& k) {
  const __m256i clamped = _mm256_min_epu32(_mm256_castps_si256(scaled), k.bucket_edge_bits);
  const __m256 negated = _mm256_xor_ps(_mm256_castsi256_ps(clamped), k.sign);
  const __m256i b = _mm256_cvttps_epi32(_mm256_mul_ps(negated, k.buckets_per_unit));
  return _mm256_min_epi32(b, k.last_bucket);
}

void weights_and_buckets_avx2(const float* x, int64_t n, float max, float inv_temperature, float* w, int32_t* bucket) {
  const ExpConstants k;
  const __m256 m = _mm256_set1_ps(max);
  const __m256 t = _mm256_set1_ps(inv_temperature);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 s = scaled8(x + i, m, t);
    _mm256_storeu_ps(w + i, exp8(s, k));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(bucket + i), bucket8(s, k));
  }
  if (i < n) {
    alignas(32) float buf[8];
    alignas(32) int32_t b[8];
    _mm256_store_ps(buf, m);
    for (int64_t j = 0; j < n - i; ++j) buf[j] = x[i + j];
    const __m256 s = scaled8(buf, m, t);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b), bucket8(s, k));
    _mm256_store_ps(buf, exp8(s, k));
    for (int64_t j = 0; j < n - i; ++j) {
      w[i + j] = buf[j];
      bucket[i + j] = b[j];
    }
  }
}

double sum_f64_avx2(const float* x, int64_t n) {
  __m256d lo = _mm256_setzero_pd();
  __m256d hi = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm_loadu_ps(x + i)));
    hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4)));
  }
  alignas(32) double partial[8];
  _mm256_store_pd(partial, lo);
  _mm256_store_pd(partial + 4, hi);
  for (int j = 0; i < n; ++i, ++j) partial[j] += x[i];
  return combine(partial);
}

}  // namespace

const RowKernels& avx2_row_kernels() {
  static const RowKernels kernels = {
      "avx2",       max_avx2,        find_greater_avx2,        collect_greater_avx2, collect_at_most_avx2,
      weights_avx2, weight_sum_avx2, weights_and_buckets_avx2, sum_f64_avx2};
  return kernels;
}

}  // namespace tessera
