#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "sample/row_kernels.h"
#include "unit/sample/reference.h"

using namespace tessera;
using tessera::test::TestRng;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Kernel tables to test: the scalar one always, AVX2 where this CPU has it.
std::vector<const RowKernels*> tables() {
  std::vector<const RowKernels*> out = {&scalar_row_kernels()};
  if (cpu_has_avx2()) out.push_back(&avx2_row_kernels());
  return out;
}

// Rows of awkward lengths (tails of 0..7) with ties, -inf and a wide range of values.
std::vector<std::vector<float>> test_rows() {
  TestRng rng(41);
  std::vector<std::vector<float>> rows;
  for (int64_t n : {1, 2, 7, 8, 9, 15, 31, 33, 100, 257, 1000, 4099, 20001}) {
    rows.push_back(rng.logits(n, 3.0));
    std::vector<float> r = rng.logits(n, 30.0, 0.5);
    for (int64_t i = 0; i < n; i += 5) r[i] = -kInf;
    r[static_cast<size_t>(rng.below(n))] = 12.0f;  // at least one finite value
    rows.push_back(r);
  }
  return rows;
}

float row_max(const std::vector<float>& r) {
  float m = -kInf;
  for (float v : r) m = std::max(m, v);
  return m;
}

}  // namespace

TEST(RowKernels, ExpMatchesFloat64ExpAcrossTheRange) {
  double worst = 0;
  float worst_x = 0;
  auto check = [&](float x) {
    const double want = std::exp(static_cast<double>(x));
    const double rel = std::abs(exp_nonpositive(x) - want) / want;
    if (rel > worst) {
      worst = rel;
      worst_x = x;
    }
  };
  for (int i = 0; i <= 870000; ++i) check(-static_cast<float>(i) * 1e-4f);
  TestRng rng(7);
  for (int i = 0; i < 200000; ++i) check(static_cast<float>(-rng.uniform() * 87.0));
  for (float x : {-0.0f, -1e-30f, -1e-7f, -0.34657359f, -0.34657360f, -86.999f, -87.0f}) check(x);
  EXPECT_LT(worst, 2.5e-7) << "at x = " << worst_x;
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
  EXPECT_GT(exp_nonpositive(-87.0f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-87.00001f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-1e30f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-kInf), 0.0f);
}

TEST(RowKernels, ExpReproducesPinnedBits) {
  // Built from IEEE-754 basic operations only, so these bits must come out the same on every
  // platform and compiler. They are also the correctly rounded floats of exp(x).
  const float xs[] = {-0.5f, -1.0f, -2.302585f, -10.25f, -50.0f, -86.5f};
  const uint32_t bits[] = {0x3f1b4598u, 0x3ebc5ab2u, 0x3dccccd0u, 0x38144cd4u, 0x1b692bebu, 0x0113bc74u};
  for (size_t i = 0; i < std::size(xs); ++i) {
    const float y = exp_nonpositive(xs[i]);
    EXPECT_EQ(std::bit_cast<uint32_t>(y), bits[i]) << "exp(" << xs[i] << ") = " << y;
    EXPECT_EQ(y, static_cast<float>(std::exp(static_cast<double>(xs[i]))));
  }
}

TEST(RowKernels, EachTableMatchesItsDefinition) {
  for (const RowKernels* k : tables()) {
    SCOPED_TRACE(k->name);
    for (const std::vector<float>& r : test_rows()) {
      const int64_t n = static_cast<int64_t>(r.size());
      bool nan = true;
      EXPECT_EQ(k->max(r.data(), n, &nan), row_max(r));
      EXPECT_FALSE(nan);
      for (float threshold : {-kInf, -3.0f, 0.0f, 2.5f, 11.99f, 12.0f, 1e30f}) {
        int64_t want = n;
        for (int64_t i = 0; i < n; ++i)
          if (r[i] > threshold) {
            want = i;
            break;
          }
        EXPECT_EQ(k->find_greater(r.data(), n, threshold), want) << "n=" << n;
        std::vector<int32_t> want_ids;
        for (int64_t i = 0; i < n; ++i)
          if (r[i] > threshold) want_ids.push_back(static_cast<int32_t>(1000 + i));
        std::vector<int32_t> got(r.size() + 8, -1);
        got.resize(static_cast<size_t>(k->collect_greater(r.data(), n, threshold, 1000, got.data())));
        EXPECT_EQ(got, want_ids) << "n=" << n << " threshold " << threshold;
      }
      const float max = row_max(r);
      std::vector<int32_t> ints(r.size());
      for (int64_t i = 0; i < n; ++i) ints[i] = static_cast<int32_t>(r[i] == -kInf ? -1000 : r[i] * 3);
      for (int32_t limit : {-2000, -1, 0, 5, 2000}) {
        std::vector<int32_t> want_ids;
        for (int64_t i = 0; i < n; ++i)
          if (ints[i] <= limit) want_ids.push_back(static_cast<int32_t>(7 + i));
        std::vector<int32_t> got(r.size() + 8, -1);
        got.resize(static_cast<size_t>(k->collect_at_most(ints.data(), n, limit, 7, got.data())));
        EXPECT_EQ(got, want_ids) << "n=" << n << " limit " << limit;
      }
      for (float inv_t : {1.0f, 2.7f, 0.25f}) {
        std::vector<float> w(r.size());
        std::vector<int32_t> b(r.size());
        k->weights(r.data(), n, max, inv_t, w.data());
        for (int64_t i = 0; i < n; ++i) EXPECT_EQ(w[i], exp_nonpositive((r[i] - max) * inv_t));
        std::vector<float> w2(r.size());
        k->weights_and_buckets(r.data(), n, max, inv_t, w2.data(), b.data());
        EXPECT_EQ(w2, w);
        for (int64_t i = 0; i < n; ++i) {
          // The bucket is floor(-t * 16) capped at the last; t is the float the kernel uses.
          const double t = (r[i] - max) * inv_t;
          const double key = std::floor(-t * kTopPBucketsPerUnit);
          const int32_t want = key >= kTopPBuckets - 1 ? kTopPBuckets - 1 : static_cast<int32_t>(key);
          ASSERT_EQ(b[i], want) << "t=" << t;
        }
        double exact = 0;
        for (float v : w) exact += v;
        EXPECT_NEAR(k->weight_sum(r.data(), n, max, inv_t), exact, 1e-12 * exact);
        EXPECT_EQ(k->weight_sum(r.data(), n, max, inv_t), k->sum_f64(w.data(), n));
      }
    }
    for (size_t at : {size_t{1}, size_t{9}}) {
      std::vector<float> r = {1.0f, 2.0f, 3.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
      r[at] = std::numeric_limits<float>::quiet_NaN();
      bool nan = false;
      EXPECT_EQ(k->max(r.data(), 10, &nan), 3.0f);
      EXPECT_TRUE(nan) << "NaN at " << at;
    }
    bool nan = true;
    EXPECT_EQ(k->max(nullptr, 0, &nan), -kInf);
    EXPECT_FALSE(nan);
  }
}

TEST(RowKernels, Avx2GivesTheSameBitsAsScalar) {
  if (!cpu_has_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  const RowKernels& s = scalar_row_kernels();
  const RowKernels& v = avx2_row_kernels();
  for (const std::vector<float>& r : test_rows()) {
    const int64_t n = static_cast<int64_t>(r.size());
    const float max = row_max(r);
    for (float inv_t : {1.0f, 1.0f / 0.7f, std::numeric_limits<float>::max(), 0.01f}) {
      std::vector<float> ws(r.size()), wv(r.size());
      std::vector<int32_t> bs(r.size()), bv(r.size());
      s.weights_and_buckets(r.data(), n, max, inv_t, ws.data(), bs.data());
      v.weights_and_buckets(r.data(), n, max, inv_t, wv.data(), bv.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(std::bit_cast<uint32_t>(ws[i]), std::bit_cast<uint32_t>(wv[i])) << i;
        ASSERT_EQ(bs[i], bv[i]) << i;
      }
      v.weights(r.data(), n, max, inv_t, wv.data());
      ASSERT_EQ(ws, wv);
      const double sum_s = s.weight_sum(r.data(), n, max, inv_t);
      const double sum_v = v.weight_sum(r.data(), n, max, inv_t);
      ASSERT_EQ(std::bit_cast<uint64_t>(sum_s), std::bit_cast<uint64_t>(sum_v)) << "n=" << n;
      ASSERT_EQ(s.sum_f64(ws.data(), n), v.sum_f64(ws.data(), n));
    }
  }
  // Every float in [-88, 0] at a stride, through both exps.
  std::vector<float> x;
  for (uint32_t bits = 0x80000000u; bits <= 0xC2B00000u; bits += 97) x.push_back(std::bit_cast<float>(bits));
  std::vector<float> ws(x.size()), wv(x.size());
  s.weights(x.data(), static_cast<int64_t>(x.size()), 0.0f, 1.0f, ws.data());
  v.weights(x.data(), static_cast<int64_t>(x.size()), 0.0f, 1.0f, wv.data());
  for (size_t i = 0; i < x.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(ws[i]), std::bit_cast<uint32_t>(wv[i])) << x[i];
}

TEST(RowKernels, SumF64EqualsTheExactSumOfSmallIntegers) {
  std::vector<float> v(100003);
  double want = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(i % 97);
    want += v[i];
  }
  for (const RowKernels* k : tables()) {
    EXPECT_EQ(k->sum_f64(v.data(), static_cast<int64_t>(v.size())), want) << k->name;
    EXPECT_EQ(k->sum_f64(v.data(), 0), 0.0);
  }
}
