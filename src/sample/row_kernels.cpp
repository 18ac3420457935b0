// Portable scalar row kernels, the reference the AVX2 ones must match bit for bit.
//
// No floating-point contraction: a*b+c fused into one rounding would change the bits on
// targets with FMA (GCC contracts by default even in ISO C++ mode; clang contracts within an
// expression).
#include "sample/row_kernels.h"

#include <atomic>
#include <bit>
#include <limits>

// After the includes, so that only this file's functions are affected.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace tessera {

namespace {

constexpr uint32_t kMinus87Bits = 0xC2AE0000u;     // -87.0f
constexpr uint32_t kBucketEdgeBits = 0xC2800000u;  // -64.0f = -kTopPBucketRange
static_assert(kTopPBucketRange == 64.0f);

// Written branch-free, in the operation order the AVX2 kernel uses. For x <= 0, comparing
// the bits as unsigned orders by magnitude: bits(x) > bits(-87) is x < -87.
inline float exp_nonpositive_inline(float x) {
  const uint32_t x_bits = std::bit_cast<uint32_t>(x);
  const float xc = std::bit_cast<float>(x_bits < kMinus87Bits ? x_bits : kMinus87Bits);
  const uint32_t keep_mask = 0u - static_cast<uint32_t>(x_bits <= kMinus87Bits);
  // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer (ties to even).
  const float kRound = 12582912.0f;
  const float n = (xc * 1.44269504088896341f + kRound) - kRound;
  // ln2 split into a part with few significant bits (n * ln2_hi is exact) and the rest.
  float r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float er = ((p * r) * r + r) + 1.0f;
  // n is in [-126, 0]: 2^n is a normal float built from its exponent field.
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(er * two_n) & keep_mask);
}

inline int32_t top_p_bucket(float t) {
  const uint32_t bits = std::bit_cast<uint32_t>(t);
  const float clamped = std::bit_cast<float>(bits < kBucketEdgeBits ? bits : kBucketEdgeBits);
  const int32_t b = static_cast<int32_t>(-clamped * kTopPBucketsPerUnit);
  return b < kTopPBuckets - 1 ? b : kTopPBuckets - 1;
}

float max_scalar(const float* x, int64_t n, bool* has_nan) {
  float max = -std::numeric_limits<float>::infinity();
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    max = x[i] > max ? x[i] : max;
    nan |= x[i] != x[i];
  }
  *has_nan = nan;
  return max;
}

int64_t find_greater_scalar(const float* x, int64_t n, float threshold) {
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > threshold) return i;
  return n;
}

int64_t collect_greater_scalar(const float* x, int64_t n, float threshold, int32_t base, int32_t* out) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (x[i] > threshold) out[count++] = base + static_cast<int32_t>(i);
  return count;
}

int64_t collect_at_most_scalar(const int32_t* v, int64_t n, int32_t limit, int32_t base, int32_t* out) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i)
    if (v[i] <= limit) out[count++] = base + static_cast<int32_t>(i);
  return count;
}

void weights_scalar(const float* x, int64_t n, float max, float inv_temperature, float* w) {
  for (int64_t i = 0; i < n; ++i) w[i] = exp_nonpositive_inline((x[i] - max) * inv_temperature);
}

double combine(const double* p) { return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7])); }

double weight_sum_scalar(const float* x, int64_t n, float max, float inv_temperature) {
  double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) partial[j] += exp_nonpositive_inline((x[i + j] - max) * inv_temperature);
  for (int j = 0; i < n; ++i, ++j) partial[j] += exp_nonpositive_inline((x[i] - max) * inv_temperature);
  return combine(partial);
}

void weights_and_buckets_scalar(const float* x, int64_t n, float max, float inv_temperature, float* w,
                                int32_t* bucket) {
  for (int64_t i = 0; i < n; ++i) {
    const float t = (x[i] - max) * inv_temperature;
    w[i] = exp_nonpositive_inline(t);
    bucket[i] = top_p_bucket(t);
  }
}

double sum_f64_scalar(const float* x, int64_t n) {
  double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) partial[j] += x[i + j];
  for (int j = 0; i < n; ++i, ++j) partial[j] += x[i];
  return combine(partial);
}

}  // namespace

float exp_nonpositive(float x) { return exp_nonpositive_inline(x); }

const RowKernels& scalar_row_kernels() {
  static const RowKernels kernels = {
      "scalar",       max_scalar,        find_greater_scalar,        collect_greater_scalar, collect_at_most_scalar,
      weights_scalar, weight_sum_scalar, weights_and_buckets_scalar, sum_f64_scalar};
  return kernels;
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

namespace {
std::atomic<const RowKernels*> g_forced_kernels{nullptr};
}  // namespace

const RowKernels& row_kernels() {
  static const RowKernels& best = cpu_has_avx2() ? avx2_row_kernels() : scalar_row_kernels();
  const RowKernels* forced = g_forced_kernels.load(std::memory_order_relaxed);
  return forced != nullptr ? *forced : best;
}

void force_row_kernels(const RowKernels* kernels) { g_forced_kernels.store(kernels, std::memory_order_relaxed); }

}  // namespace tessera
