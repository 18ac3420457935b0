#pragma once
// The loops of the sampler that touch a whole logit row (vocabulary size, up to ~256k), in
// two implementations chosen at run time: portable scalar code (row_kernels.cpp) and AVX2
// (row_kernels_avx2.cpp). Both return the SAME BITS for the same input — same IEEE-754
// operations in the same order, floating-point contraction disabled in both files, float64
// sums in the same fixed association — so a seeded run samples the same tokens on machines
// with and without AVX2. tests/unit/sample/row_kernels_test.cpp checks this bit for bit.
#include <cstdint>

namespace tessera {

// exp(x) for x <= 0 (x = -inf allowed), in float: Cephes' expf (x = n ln2 + r with
// |r| <= ln2/2, a degree-6 polynomial for e^r, 2^n assembled from its exponent bits). Only
// +, -, *, and conversion of exact integers, so the result is the same on every IEEE-754
// machine, unlike std::exp whose last bit depends on the C library. Relative error below
// 2.5e-7; returns 0 for x < -87 (e^-87 ≈ 1.6e-38, far below anything that can be drawn).
float exp_nonpositive(float x);

// Top-p buckets: bucket b holds scaled logits t = (logit - max) / T in
// (-(b+1)/kTopPBucketsPerUnit, -b/kTopPBucketsPerUnit]; the last one also holds everything
// below -kTopPBucketRange (weights under e^-64 of the max).
constexpr int32_t kTopPBuckets = 1024;
constexpr float kTopPBucketRange = 64.0f;
constexpr float kTopPBucketsPerUnit = kTopPBuckets / kTopPBucketRange;

struct RowKernels {
  const char* name;
  // Largest of x[0, n) ignoring NaN (-inf for n = 0); *has_nan tells whether any is NaN.
  float (*max)(const float* x, int64_t n, bool* has_nan);
  // Index of the first x[i] > threshold, or n.
  int64_t (*find_greater)(const float* x, int64_t n, float threshold);
  // Writes base + i for every x[i] > threshold to out, in order; returns the count. out
  // needs room for n + 8 entries: whole vectors are stored, past the result too.
  int64_t (*collect_greater)(const float* x, int64_t n, float threshold, int32_t base, int32_t* out);
  // The same for integers: base + i for every v[i] <= limit (room for n + 8).
  int64_t (*collect_at_most)(const int32_t* v, int64_t n, int32_t limit, int32_t base, int32_t* out);
  // w[i] = exp_nonpositive((x[i] - max) * inv_temperature). Requires x[i] <= max. The
  // caller passes 1 / T (see Sampler): a multiply, not a divide, per token.
  void (*weights)(const float* x, int64_t n, float max, float inv_temperature, float* w);
  // The same weights, summed in float64 like sum_f64, without storing them.
  double (*weight_sum)(const float* x, int64_t n, float max, float inv_temperature);
  // weights, plus each token's top-p bucket.
  void (*weights_and_buckets)(const float* x, int64_t n, float max, float inv_temperature, float* w, int32_t* bucket);
  // Sum in float64 with 8 partial sums (element i goes to partial i % 8 for the full groups
  // of 8, the tail to partials 0, 1, ...), combined as ((p0+p1)+(p2+p3))+((p4+p5)+(p6+p7)).
  double (*sum_f64)(const float* x, int64_t n);
};

const RowKernels& scalar_row_kernels();
// The AVX2 table; call only when the CPU supports AVX2 (cpu_has_avx2()).
const RowKernels& avx2_row_kernels();
bool cpu_has_avx2();
// The table the sampler uses: the fastest for this CPU, unless forced.
const RowKernels& row_kernels();
// Makes row_kernels() return `kernels` (nullptr: back to the automatic choice). For tests
// and benchmarks that compare implementations; not to be called while sampling runs.
void force_row_kernels(const RowKernels* kernels);

}  // namespace tessera
