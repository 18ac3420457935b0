// CpuMatmul on group-quantized weights (W4G/W8G) against float64 references written here:
// random codes, scales and zero points, with and without act-order permutations, group sizes
// 32/64/128 and per channel, widths that are not multiples of the group (partial last group)
// nor of 32, 1 to 300 input rows; every kernel family this CPU runs, bitwise equal to the
// scalar one and independent of the batch it runs in.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/fp16.h"
#include "quant/group_quant.h"

using namespace tessera;

namespace {

class IsaScope {
 public:
  explicit IsaScope(const char* isa) {
    const char* old = std::getenv("TESSERA_ISA");
    had_ = old != nullptr;
    if (had_) old_ = old;
    setenv("TESSERA_ISA", isa, 1);
  }
  ~IsaScope() {
    if (had_)
      setenv("TESSERA_ISA", old_.c_str(), 1);
    else
      unsetenv("TESSERA_ISA");
  }

 private:
  bool had_ = false;
  std::string old_;
};

std::vector<const char*> families() {
  std::vector<const char*> out;
  for (const char* name : {"scalar", "avx2", "avx512"})
    if (CpuMatmul::isa_supported(name)) out.push_back(name);
  return out;
}

struct Spec {
  int bits;
  int64_t rows, cols, group;  // group == cols: per channel
  bool asym, act_order;
};

std::string describe(const Spec& s) {
  std::ostringstream o;  // (not string concatenation: GCC 12 warns falsely on it at -O3)
  o << "W" << s.bits << " " << s.rows << "x" << s.cols << " g" << s.group << (s.asym ? " asym" : " sym")
    << (s.act_order ? " act-order" : "");
  return o.str();
}

// A random matrix with its intended values (value[r][k] in input-column order, float64).
struct TestMatrix {
  GroupQuantMatrix m;
  WeightMatrix w;
  std::vector<double> value;  // [rows][cols]
};

TestMatrix make_matrix(const Spec& s, std::mt19937& rng) {
  const int64_t n_groups = (s.cols + s.group - 1) / s.group;
  const int max_code = (1 << s.bits) - 1;
  std::uniform_int_distribution<int> code(0, max_code);
  std::uniform_real_distribution<float> scale(0.005f, 0.05f);
  std::vector<uint8_t> codes(s.rows * s.cols), zeros(s.asym ? n_groups * s.rows : 0);
  std::vector<uint16_t> scales(n_groups * s.rows);
  std::vector<int32_t> g_idx;
  for (auto& c : codes) c = static_cast<uint8_t>(code(rng));
  for (auto& z : zeros) z = static_cast<uint8_t>(code(rng));
  for (auto& h : scales) h = f32_to_fp16(scale(rng));
  if (s.act_order) {
    std::vector<int32_t> order(s.cols);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    g_idx.resize(s.cols);
    for (int64_t i = 0; i < s.cols; ++i) g_idx[order[i]] = static_cast<int32_t>(i / s.group);
  }
  GroupQuantSource src{s.bits, s.rows, s.cols, s.group, codes, scales, zeros, g_idx};
  TestMatrix t;
  t.m = build_group_quant(src, describe(s));
  t.w = WeightMatrix{t.m.data.get(), s.bits == 8 ? DType::W8G : DType::W4G, s.rows, s.cols};
  t.w.group_size = t.m.layout.group_size;
  t.w.gq_zeros = t.m.layout.has_zeros;
  t.w.gq_perm = t.m.layout.has_perm;
  t.value.resize(s.rows * s.cols);
  for (int64_t r = 0; r < s.rows; ++r)
    for (int64_t k = 0; k < s.cols; ++k) {
      const int64_t g = s.act_order ? g_idx[k] : k / s.group;
      const int z = s.asym ? zeros[g * s.rows + r] : 1 << (s.bits - 1);
      t.value[r * s.cols + k] = double(int(codes[r * s.cols + k]) - z) * double(fp16_to_f32(scales[g * s.rows + r]));
    }
  return t;
}

std::vector<float> randn(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

const Spec kSpecs[] = {
    {4, 37, 96, 32, false, false},  {4, 37, 200, 64, true, false},   {4, 37, 320, 128, true, true},
    {4, 9, 257, 257, true, false},  {4, 8, 40, 40, false, false},    {8, 37, 96, 32, true, false},
    {8, 37, 200, 64, false, true},  {8, 17, 257, 257, false, false}, {8, 3, 130, 128, true, true},
    {4, 65, 1100, 128, true, true},
};

}  // namespace

// Every family against float64: the exact product (within the error of the 8-bit activation
// quantization), outputs outside the written rows untouched.
TEST(MatmulGroupQuant, MatchesFloat64AtEveryRowCount) {
  std::mt19937 rng(31);
  for (const char* isa : families()) {
    IsaScope scope(isa);
    ThreadPool pool(2);
    CpuMatmul mm(pool);
    for (const Spec& s : kSpecs) {
      TestMatrix t = make_matrix(s, rng);
      for (int64_t n_x : {1, 2, 7, 8, 33, 300}) {
        const int64_t ldx = s.cols + 3, ldy = s.rows + 5;
        std::vector<float> x = randn(n_x * ldx, rng);
        std::vector<float> y(n_x * ldy, NAN);
        const MatmulTarget tg{t.w, y.data(), ldy};
        mm.run(x.data(), n_x, ldx, std::span(&tg, 1));
        double num = 0, den = 0;
        for (int64_t i = 0; i < n_x; ++i)
          for (int64_t r = 0; r < ldy; ++r) {
            if (r >= s.rows) {
              ASSERT_TRUE(std::isnan(y[i * ldy + r])) << isa << " " << describe(s) << ": wrote past the rows";
              continue;
            }
            double ref = 0;
            for (int64_t k = 0; k < s.cols; ++k) ref += double(x[i * ldx + k]) * t.value[r * s.cols + k];
            const double d = y[i * ldy + r] - ref;
            num += d * d;
            den += ref * ref;
          }
        EXPECT_LT(std::sqrt(num / den), 3e-2) << isa << " " << describe(s) << " rows " << n_x;
      }
    }
  }
}

// The activation quantization reproduced here (Q8 per 32 over the permuted, zero-padded row;
// d = fp16(amax / 127), q = nearbyint(x * 127 / amax)) makes the reference tight: a wrong zero
// point, scale or permutation shows far above 1e-5.
TEST(MatmulGroupQuant, MatchesQuantizedActivationReferenceTightly) {
  std::mt19937 rng(32);
  IsaScope scope(families().back());
  ThreadPool pool(1);
  CpuMatmul mm(pool);
  for (const Spec& s : kSpecs) {
    TestMatrix t = make_matrix(s, rng);
    const int64_t n_x = 5, cols_p = (s.cols + 31) / 32 * 32;
    std::vector<float> x = randn(n_x * s.cols, rng);
    std::vector<float> y(n_x * s.rows, NAN);
    const MatmulTarget tg{t.w, y.data(), s.rows};
    mm.run(x.data(), n_x, s.cols, std::span(&tg, 1));
    const int32_t* perm = gq_perm(t.m.layout, t.m.data.get());
    for (int64_t i = 0; i < n_x; ++i) {
      std::vector<float> xp(cols_p, 0.0f);
      for (int64_t j = 0; j < s.cols; ++j) xp[j] = x[i * s.cols + (perm ? perm[j] : j)];
      std::vector<double> xq(cols_p);  // dequantized activation, stored-column order
      for (int64_t b = 0; b < cols_p / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xp[b * 32 + j]));
        const float id = amax != 0 ? 127.f / amax : 0.f;
        const double d = fp16_to_f32(f32_to_fp16(amax / 127.f));
        for (int j = 0; j < 32; ++j) xq[b * 32 + j] = d * std::nearbyint(xp[b * 32 + j] * id);
      }
      for (int64_t r = 0; r < s.rows; ++r) {
        double ref = 0, mag = 0;
        for (int64_t j = 0; j < s.cols; ++j) {
          const double w = t.value[r * s.cols + (perm ? perm[j] : j)];
          ref += w * xq[j];
          mag += std::fabs(w * xq[j]);
        }
        EXPECT_NEAR(y[i * s.rows + r], ref, 1e-5 * mag + 1e-6) << describe(s) << " row " << i << "," << r;
      }
    }
  }
}

// Bitwise: every family equals the scalar kernels, and a row's output does not depend on how
// many rows share its call, nor on the targets beside it (one with another permutation, one
// of a GGUF type), nor on the thread count.
TEST(MatmulGroupQuant, BitwiseAcrossFamiliesBatchesAndTargets) {
  std::mt19937 rng(33);
  for (const Spec& s : kSpecs) {
    TestMatrix t = make_matrix(s, rng);
    Spec other_spec = s;
    other_spec.act_order = true;
    TestMatrix other = make_matrix(other_spec, rng);
    const int64_t n_x = 67;
    std::vector<float> x = randn(n_x * s.cols, rng);
    std::vector<float> alone(n_x * s.rows);
    {
      IsaScope scope("scalar");
      ThreadPool pool(1);
      CpuMatmul mm(pool);
      for (int64_t i = 0; i < n_x; ++i) {
        const MatmulTarget tg{t.w, alone.data() + i * s.rows, s.rows};
        mm.run(x.data() + i * s.cols, 1, s.cols, std::span(&tg, 1));
      }
    }
    std::vector<float> f32w(13 * s.cols);
    for (auto& v : f32w) v = static_cast<float>(rng() % 7) - 3.0f;
    const WeightMatrix plain{f32w.data(), DType::F32, 13, s.cols};
    for (const char* isa : families()) {
      IsaScope scope(isa);
      ThreadPool pool(2);
      CpuMatmul mm(pool);
      for (int64_t n : {1, 3, 8, 9, 67}) {
        const int64_t t0 = (n_x - n) / 2;
        std::vector<float> y(n * s.rows), y_other(n * s.rows), y_plain(n * 13);
        const MatmulTarget tgs[] = {
            {plain, y_plain.data(), 13}, {other.w, y_other.data(), s.rows}, {t.w, y.data(), s.rows}};
        mm.run(x.data() + t0 * s.cols, n, s.cols, tgs);
        EXPECT_EQ(std::memcmp(y.data(), alone.data() + t0 * s.rows, y.size() * 4), 0)
            << isa << " " << describe(s) << " n=" << n;
      }
    }
  }
}

TEST(MatmulGroupQuant, GetRowsDecodesInInputOrder) {
  std::mt19937 rng(34);
  for (const Spec& s : kSpecs) {
    TestMatrix t = make_matrix(s, rng);
    const int32_t ids[] = {0, static_cast<int32_t>(s.rows - 1), 1 % static_cast<int32_t>(s.rows)};
    std::vector<float> out(3 * s.cols, NAN);
    cpu_get_rows(t.w, ids, 3, out.data());
    for (int i = 0; i < 3; ++i)
      for (int64_t k = 0; k < s.cols; ++k)
        ASSERT_EQ(out[i * s.cols + k], static_cast<float>(t.value[ids[i] * s.cols + k])) << describe(s);
  }
}

TEST(MatmulGroupQuant, RejectsABadGroupSize) {
  std::vector<uint8_t> buf(4096);
  WeightMatrix w{buf.data(), DType::W4G, 8, 96};
  w.group_size = 48;  // neither a multiple of 32 nor the row length
  std::vector<float> x(96, 1.0f), y(8);
  ThreadPool pool(1);
  CpuMatmul mm(pool);
  const MatmulTarget tg{w, y.data(), 8};
  try {
    mm.run(x.data(), 1, 96, std::span(&tg, 1));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("group size"), std::string::npos) << e.what();
  }
}
