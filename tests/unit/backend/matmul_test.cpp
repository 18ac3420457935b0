// CpuMatmul against float64 references of its own: every weight type, every kernel family
// this CPU runs, awkward shapes, strides, several targets per call, poisoned outputs; and
// bitwise reproducibility: an output must not depend on the batch, its targets, the thread
// count or the instruction set.
// The references decode the GGUF block layouts here (from GGML's formulas) and quantize the
// activations as GGML's quantize_row_q8_0/q8_1/q8_K do, so the comparison can be tight.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/error.h"
#include "core/fp16.h"
#include "quant/blocks.h"

using namespace tessera;

namespace {

const DType kAllTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                           DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

bool is_k(DType t) { return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K; }
bool is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16; }
bool pairs_with_q8_1(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }

// Forces a kernel family for the CpuMatmul objects built while it lives.
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

std::vector<const char*> isas() {
  std::vector<const char*> out;
  for (const char* name : {"scalar", "avx2", "avx512"})
    if (CpuMatmul::isa_supported(name)) out.push_back(name);
  return out;
}

// ---- random weights ------------------------------------------------------------------------

struct Rng {
  std::mt19937 gen;
  explicit Rng(uint32_t seed) : gen(seed) {}
  double uniform(double a, double b) { return std::uniform_real_distribution<double>(a, b)(gen); }
  uint8_t byte() { return static_cast<uint8_t>(gen() & 0xFF); }
  uint16_t half(double a, double b) { return f32_to_fp16(static_cast<float>(uniform(a, b))); }
  uint16_t signed_half(double a, double b) {
    return f32_to_fp16(static_cast<float>((gen() & 1 ? 1 : -1) * uniform(a, b)));
  }
};

void random_bytes(Rng& rng, uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) p[i] = rng.byte();
}

// Random block bytes (every bit pattern of the quants) with sane scales.
std::vector<uint8_t> random_weights(DType t, int64_t rows, int64_t cols, Rng& rng) {
  const int64_t row_bytes = dtype_row_bytes(t, cols);
  std::vector<uint8_t> data(rows * row_bytes);
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = data.data() + r * row_bytes;
    const int64_t nb = cols / dtype_traits(t).block_elems;
    for (int64_t b = 0; b < nb; ++b) {
      switch (t) {
        case DType::F32: {
          const float v = static_cast<float>(rng.uniform(-1, 1));
          std::memcpy(row + 4 * b, &v, 4);
          break;
        }
        case DType::F16: {
          const uint16_t v = f32_to_fp16(static_cast<float>(rng.uniform(-1, 1)));
          std::memcpy(row + 2 * b, &v, 2);
          break;
        }
        case DType::BF16: {
          const uint16_t v = f32_to_bf16(static_cast<float>(rng.uniform(-1, 1)));
          std::memcpy(row + 2 * b, &v, 2);
          break;
        }
        case DType::Q4_0: {
          auto& k = reinterpret_cast<BlockQ4_0*>(row)[b];
          random_bytes(rng, k.qs, sizeof k.qs);
          k.d = rng.signed_half(0.01, 0.05);
          break;
        }
        case DType::Q4_1: {
          auto& k = reinterpret_cast<BlockQ4_1*>(row)[b];
          random_bytes(rng, k.qs, sizeof k.qs);
          k.d = rng.half(0.005, 0.02);
          k.m = rng.half(-0.15, -0.02);
          break;
        }
        case DType::Q5_0: {
          auto& k = reinterpret_cast<BlockQ5_0*>(row)[b];
          random_bytes(rng, k.qs, sizeof k.qs);
          random_bytes(rng, k.qh, sizeof k.qh);
          k.d = rng.signed_half(0.005, 0.03);
          break;
        }
        case DType::Q5_1: {
          auto& k = reinterpret_cast<BlockQ5_1*>(row)[b];
          random_bytes(rng, k.qs, sizeof k.qs);
          random_bytes(rng, k.qh, sizeof k.qh);
          k.d = rng.half(0.002, 0.01);
          k.m = rng.half(-0.15, -0.02);
          break;
        }
        case DType::Q8_0: {
          auto& k = reinterpret_cast<BlockQ8_0*>(row)[b];
          random_bytes(rng, reinterpret_cast<uint8_t*>(k.qs), sizeof k.qs);
          k.d = rng.signed_half(0.001, 0.01);
          break;
        }
        case DType::Q4_K: {
          auto& k = reinterpret_cast<BlockQ4_K*>(row)[b];
          random_bytes(rng, k.qs, sizeof k.qs);
          random_bytes(rng, k.scales, sizeof k.scales);
          k.d = rng.half(0.0005, 0.002);
          k.dmin = rng.half(0.0005, 0.002);
          break;
        }
        case DType::Q5_K: {
          auto& k = reinterpret_cast<BlockQ5_K*>(row)[b];
          random_bytes(rng, k.qs, sizeof k.qs);
          random_bytes(rng, k.qh, sizeof k.qh);
          random_bytes(rng, k.scales, sizeof k.scales);
          k.d = rng.half(0.0003, 0.001);
          k.dmin = rng.half(0.0005, 0.002);
          break;
        }
        case DType::Q6_K: {
          auto& k = reinterpret_cast<BlockQ6_K*>(row)[b];
          random_bytes(rng, k.ql, sizeof k.ql);
          random_bytes(rng, k.qh, sizeof k.qh);
          random_bytes(rng, reinterpret_cast<uint8_t*>(k.scales), sizeof k.scales);
          k.d = rng.signed_half(0.0001, 0.0005);
          break;
        }
        default:
          ADD_FAILURE() << "no generator for " << dtype_name(t);
      }
    }
  }
  return data;
}

// ---- float64 decoders (GGML's dequantize_row_* formulas) ---------------------------------------
// A row as a[k] + m[k / 32]: `a` is the part that multiplies the activation's d*q, `m` the
// per-block offset of Q4_1/Q5_1, which GGML dots against the Q8_1 block's s.
struct RefRow {
  std::vector<double> a;
  std::vector<double> m;
};

double h(uint16_t v) { return fp16_to_f32(v); }

void k4_scale_min(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

RefRow decode_row(DType t, const uint8_t* row, int64_t cols) {
  RefRow out;
  out.a.assign(cols, 0.0);
  out.m.assign((cols + 31) / 32, 0.0);
  auto qbit = [](const uint8_t* qh, int j) {
    uint32_t v;
    std::memcpy(&v, qh, 4);
    return static_cast<int>((v >> j) & 1);
  };
  switch (t) {
    case DType::F32:
      for (int64_t k = 0; k < cols; ++k) {
        float v;
        std::memcpy(&v, row + 4 * k, 4);
        out.a[k] = v;
      }
      break;
    case DType::F16:
    case DType::BF16:
      for (int64_t k = 0; k < cols; ++k) {
        uint16_t v;
        std::memcpy(&v, row + 2 * k, 2);
        out.a[k] = t == DType::F16 ? fp16_to_f32(v) : bf16_to_f32(v);
      }
      break;
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
      for (int64_t b = 0; b < cols / 32; ++b) {
        const uint8_t *qs, *qh = nullptr;
        double d, m = 0;
        int zero = 0;
        if (t == DType::Q4_0) {
          auto& k = reinterpret_cast<const BlockQ4_0*>(row)[b];
          qs = k.qs;
          d = h(k.d);
          zero = 8;
        } else if (t == DType::Q4_1) {
          auto& k = reinterpret_cast<const BlockQ4_1*>(row)[b];
          qs = k.qs;
          d = h(k.d);
          m = h(k.m);
        } else if (t == DType::Q5_0) {
          auto& k = reinterpret_cast<const BlockQ5_0*>(row)[b];
          qs = k.qs;
          qh = k.qh;
          d = h(k.d);
          zero = 16;
        } else {
          auto& k = reinterpret_cast<const BlockQ5_1*>(row)[b];
          qs = k.qs;
          qh = k.qh;
          d = h(k.d);
          m = h(k.m);
        }
        for (int j = 0; j < 16; ++j) {
          const int lo = (qs[j] & 0xF) | (qh ? qbit(qh, j) << 4 : 0);
          const int hi = (qs[j] >> 4) | (qh ? qbit(qh, j + 16) << 4 : 0);
          out.a[b * 32 + j] = d * (lo - zero);
          out.a[b * 32 + j + 16] = d * (hi - zero);
        }
        out.m[b] = m;
      }
      break;
    case DType::Q8_0:
      for (int64_t b = 0; b < cols / 32; ++b) {
        auto& k = reinterpret_cast<const BlockQ8_0*>(row)[b];
        for (int j = 0; j < 32; ++j) out.a[b * 32 + j] = h(k.d) * k.qs[j];
      }
      break;
    case DType::Q4_K:
    case DType::Q5_K:
      for (int64_t b = 0; b < cols / 256; ++b) {
        const uint8_t *qs, *qh = nullptr, *scales;
        double d, dmin;
        if (t == DType::Q4_K) {
          auto& k = reinterpret_cast<const BlockQ4_K*>(row)[b];
          qs = k.qs;
          scales = k.scales;
          d = h(k.d);
          dmin = h(k.dmin);
        } else {
          auto& k = reinterpret_cast<const BlockQ5_K*>(row)[b];
          qs = k.qs;
          qh = k.qh;
          scales = k.scales;
          d = h(k.d);
          dmin = h(k.dmin);
        }
        double* y = out.a.data() + b * 256;
        for (int c = 0; c < 4; ++c) {  // 64 values per step: low nibbles, then high nibbles
          int sc1, m1, sc2, m2;
          k4_scale_min(2 * c, scales, &sc1, &m1);
          k4_scale_min(2 * c + 1, scales, &sc2, &m2);
          for (int l = 0; l < 32; ++l) {
            const int lo = (qs[32 * c + l] & 0xF) + (qh && (qh[l] >> (2 * c)) & 1 ? 16 : 0);
            const int hi = (qs[32 * c + l] >> 4) + (qh && (qh[l] >> (2 * c + 1)) & 1 ? 16 : 0);
            y[64 * c + l] = d * sc1 * lo - dmin * m1;
            y[64 * c + 32 + l] = d * sc2 * hi - dmin * m2;
          }
        }
      }
      break;
    case DType::Q6_K:
      for (int64_t b = 0; b < cols / 256; ++b) {
        auto& k = reinterpret_cast<const BlockQ6_K*>(row)[b];
        const double d = h(k.d);
        for (int half = 0; half < 2; ++half) {
          const uint8_t* ql = k.ql + 64 * half;
          const uint8_t* qh = k.qh + 32 * half;
          const int8_t* sc = k.scales + 8 * half;
          double* y = out.a.data() + b * 256 + 128 * half;
          for (int l = 0; l < 32; ++l) {
            const int is = l / 16;
            y[l] = d * sc[is + 0] * (((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            y[l + 32] = d * sc[is + 2] * (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = d * sc[is + 4] * (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = d * sc[is + 6] * (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
          }
        }
      }
      break;
    default:
      ADD_FAILURE() << "no decoder for " << dtype_name(t);
  }
  return out;
}

// ---- activations quantized as GGML does (f32 arithmetic is the definition) --------------------
struct RefAct {
  std::vector<double> xq;  // d * q per element
  std::vector<double> s;   // Q8_1's s per 32-block (fp16 of d * sum)
};

RefAct quantize_act(DType weight_type, const float* x, int64_t cols) {
  RefAct out;
  out.xq.assign(cols, 0.0);
  out.s.assign((cols + 31) / 32, 0.0);
  if (is_float(weight_type)) {
    for (int64_t k = 0; k < cols; ++k) out.xq[k] = x[k];
  } else if (!is_k(weight_type)) {  // quantize_row_q8_0 / q8_1 (x86 build)
    for (int64_t b = 0; b < cols / 32; ++b) {
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
      const float d = amax / 127.f;
      const float id = amax != 0 ? 127.f / amax : 0.f;
      const double dh = fp16_to_f32(f32_to_fp16(d));
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        const int q = static_cast<int>(std::nearbyint(x[b * 32 + j] * id));
        out.xq[b * 32 + j] = dh * q;
        sum += q;
      }
      out.s[b] = fp16_to_f32(f32_to_fp16(d * static_cast<float>(sum)));
    }
  } else {  // quantize_row_q8_K
    for (int64_t b = 0; b < cols / 256; ++b) {
      const float* xb = x + b * 256;
      float amax = 0, max = 0;
      for (int j = 0; j < 256; ++j)
        if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), max = xb[j];
      if (amax == 0) continue;
      const float iscale = -127.f / max;
      const double d = 1.0f / iscale;
      for (int j = 0; j < 256; ++j)
        out.xq[b * 256 + j] = d * std::min(127, static_cast<int>(std::nearbyint(iscale * xb[j])));
    }
  }
  return out;
}

// The dot as GGML computes it, and the sum of the magnitudes of its terms (the scale of the
// rounding error of any summation order).
double ref_dot(DType t, const RefRow& w, const RefAct& a, int64_t cols, double* magnitude) {
  double acc = 0, mag = 0;
  for (int64_t k = 0; k < cols; ++k) acc += w.a[k] * a.xq[k], mag += std::fabs(w.a[k] * a.xq[k]);
  if (pairs_with_q8_1(t))
    for (int64_t b = 0; b < cols / 32; ++b) acc += w.m[b] * a.s[b], mag += std::fabs(w.m[b] * a.s[b]);
  *magnitude = mag;
  return acc;
}

double exact_dot(const RefRow& w, const float* x, int64_t cols) {
  double acc = 0;
  for (int64_t k = 0; k < cols; ++k) acc += (w.a[k] + w.m[k / 32]) * x[k];
  return acc;
}

std::vector<float> random_input(int64_t n_rows, int64_t ldx, int64_t cols, Rng& rng) {
  std::vector<float> x(n_rows * ldx, std::nanf(""));  // padding must never be read
  for (int64_t t = 0; t < n_rows; ++t)
    for (int64_t k = 0; k < cols; ++k) x[t * ldx + k] = static_cast<float>(rng.uniform(-1, 1));
  if (n_rows > 1)  // an all-zero first group: scales of zero must not divide by zero
    for (int64_t k = 0; k < std::min<int64_t>(cols, 256); ++k) x[ldx + k] = 0.0f;
  return x;
}

struct Weight {
  DType type;
  int64_t rows, cols;
  std::vector<uint8_t> data;
  std::vector<RefRow> ref;
};

Weight make_weight(DType t, int64_t rows, int64_t cols, Rng& rng) {
  Weight w{t, rows, cols, random_weights(t, rows, cols, rng), {}};
  for (int64_t r = 0; r < rows; ++r) w.ref.push_back(decode_row(t, w.data.data() + r * dtype_row_bytes(t, cols), cols));
  return w;
}

// Runs all weights as targets of one call. Over all outputs of the call:
// ||y - ref|| / ||ref|| < 1e-5 against GGML's arithmetic in float64 and < 1e-2 against the
// exact product (the activation quantization is sane). Per target, where a single output can
// cancel to near zero: the error is within 1e-6 of the summed magnitudes of the terms.
void check_call(CpuMatmul& mm, const std::vector<Weight>& weights, int64_t n_rows, Rng& rng, const std::string& what) {
  const int64_t cols = weights[0].cols;
  const int64_t ldx = cols + 5;
  const std::vector<float> x = random_input(n_rows, ldx, cols, rng);
  std::vector<std::vector<float>> ys;
  std::vector<MatmulTarget> targets;
  for (const Weight& w : weights) {
    const int64_t ldy = w.rows + 3;
    ys.emplace_back(n_rows * ldy, std::nanf(""));
    targets.push_back({{w.data.data(), w.type, w.rows, w.cols}, ys.back().data(), ldy});
  }
  mm.run(x.data(), n_rows, ldx, targets);
  const std::string ctx = what + " cols=" + std::to_string(cols) + " n_rows=" + std::to_string(n_rows);
  double err = 0, norm = 0, err_exact = 0, norm_exact = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const Weight& w = weights[i];
    const int64_t ldy = targets[i].ldy;
    double err_t = 0, mag_t = 0;
    bool written = true, untouched = true;
    for (int64_t t = 0; t < n_rows; ++t) {
      const RefAct a = quantize_act(w.type, x.data() + t * ldx, cols);
      for (int64_t r = 0; r < ldy; ++r) {
        const float y = ys[i][t * ldy + r];
        if (r >= w.rows) {
          untouched &= std::isnan(y);
          continue;
        }
        written &= std::isfinite(y);
        double mag;
        const double ref = ref_dot(w.type, w.ref[r], a, cols, &mag);
        const double exact = exact_dot(w.ref[r], x.data() + t * ldx, cols);
        err += (y - ref) * (y - ref), norm += ref * ref;
        err_t += (y - ref) * (y - ref), mag_t += mag * mag;
        err_exact += (y - exact) * (y - exact), norm_exact += exact * exact;
      }
    }
    const std::string tctx = ctx + " " + std::string(dtype_name(w.type)) + " rows=" + std::to_string(w.rows);
    EXPECT_TRUE(written) << tctx << ": an output was not written (still NaN) or is not finite";
    EXPECT_TRUE(untouched) << tctx << ": wrote past the rows of the weight";
    EXPECT_LT(std::sqrt(err_t / mag_t), 1e-6) << tctx << " vs the quantized-activation reference";
  }
  EXPECT_LT(std::sqrt(err / norm), 1e-5) << ctx << " vs the quantized-activation reference";
  EXPECT_LT(std::sqrt(err_exact / norm_exact), 1e-2) << ctx << " vs the exact product";
}

std::vector<int64_t> col_counts(DType t) {
  if (is_float(t)) return {3, 8, 37, 64, 161};
  if (is_k(t)) return {256, 512, 768};
  return {32, 64, 96, 128, 160};
}

class MatmulAllTypes : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulAllTypes, MatchesFloat64ReferenceOnEveryPath) {
  const DType type = GetParam();
  ThreadPool pool(2);
  for (const char* isa : isas()) {
    IsaScope scope(isa);
    CpuMatmul mm(pool);
    ASSERT_STREQ(CpuMatmul::isa(), isa);
    Rng rng(1234 + static_cast<uint32_t>(type));
    for (int64_t cols : col_counts(type)) {
      std::vector<Weight> weights;
      for (int64_t rows : {1, 3, 17, 65, 257}) weights.push_back(make_weight(type, rows, cols, rng));
      for (int64_t n_rows : {1, 2, 5, 33}) check_call(mm, weights, n_rows, rng, isa);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulAllTypes, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Matmul, MixedFormatsShareOneCall) {
  // Q, K, V of different formats against one input: both activation formats get built.
  ThreadPool pool(2);
  for (const char* isa : isas()) {
    IsaScope scope(isa);
    CpuMatmul mm(pool);
    Rng rng(7);
    std::vector<Weight> weights;
    for (DType t : kAllTypes) weights.push_back(make_weight(t, 40, 512, rng));
    for (int64_t n_rows : {1, 9, 20}) check_call(mm, weights, n_rows, rng, isa);
  }
}

// Runs one weight of each type on `isa` with `threads` threads; outputs concatenated.
std::vector<float> run_all_types(const char* isa, int threads, int64_t n_rows) {
  IsaScope scope(isa);
  ThreadPool pool(threads);
  CpuMatmul mm(pool);
  Rng rng(99);
  const int64_t cols = 512, rows = 300;
  std::vector<float> out;
  for (DType t : kAllTypes) {
    const Weight w = make_weight(t, rows, cols, rng);
    const std::vector<float> x = random_input(n_rows, cols, cols, rng);
    std::vector<float> y(n_rows * rows);
    const MatmulTarget target{{w.data.data(), t, rows, cols}, y.data(), rows};
    mm.run(x.data(), n_rows, cols, std::span(&target, 1));
    out.insert(out.end(), y.begin(), y.end());
  }
  return out;
}

TEST(Matmul, OneAndTwoThreadsGiveIdenticalResults) {
  for (const char* isa : isas()) {
    for (int64_t n_rows : {1, 3, 40}) {
      const std::vector<float> one = run_all_types(isa, 1, n_rows);
      const std::vector<float> two = run_all_types(isa, 2, n_rows);
      ASSERT_EQ(one.size(), two.size());
      EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float))) << isa << " n_rows=" << n_rows;
    }
  }
}

TEST(Matmul, EveryPathGivesTheSameBits) {
  // The kernels of every family follow one order of f32 operations (matmul_kernels.h): one
  // row, 5 to 7 (the direct kernels' passes of 4, 2 and 1 input rows; AVX-512: VNNI dots, and
  // Q4_x/Q8_0 in one pass of 5-7 rows), 40 (panels).
  for (int64_t n_rows : {1, 5, 6, 7, 40}) {
    const std::vector<float> ref = run_all_types("scalar", 2, n_rows);
    for (const char* isa : isas()) {
      const std::vector<float> y = run_all_types(isa, 2, n_rows);
      ASSERT_EQ(y.size(), ref.size());
      EXPECT_EQ(0, std::memcmp(y.data(), ref.data(), y.size() * sizeof(float)))
          << isa << " vs scalar, n_rows=" << n_rows;
    }
  }
}

// ---- batch invariance: an output depends only on its weight row and its input row -------------
// (the engine relies on it: a request's tokens must not depend on what it was batched with).

// Widths with fewer than 8 blocks and with a partial last group of 8 blocks (float types:
// a partial last group of 8 columns).
std::vector<int64_t> invariance_cols(DType t) {
  if (is_float(t)) return {37, 203};
  if (is_k(t)) return {768, 2560};  // 3 and 10 super-blocks
  return {96, 608};                 // 3 and 19 blocks
}

// y[t, r] for input rows [t0, t0 + n) of x, the weight being target 0 of a call alone or
// target 1 of three (an F32 weight before it, another of its own type after it, so both
// activation formats and other work items share the call).
std::vector<float> outputs_for_rows(CpuMatmul& mm, const Weight& w, const std::vector<float>& x, int64_t ldx,
                                    int64_t t0, int64_t n, bool shared, Rng& rng) {
  const int64_t cols = w.cols, ldy = w.rows + 2;
  std::vector<float> y(n * ldy, std::nanf(""));
  std::vector<MatmulTarget> targets;
  Weight before, after;
  std::vector<float> y_before, y_after;
  if (shared) {
    before = make_weight(DType::F32, 11, cols, rng);
    after = make_weight(w.type, 29, cols, rng);
    y_before.resize(n * 11);
    y_after.resize(n * 29);
    targets.push_back({{before.data.data(), before.type, before.rows, cols}, y_before.data(), 11});
  }
  targets.push_back({{w.data.data(), w.type, w.rows, cols}, y.data(), ldy});
  if (shared) targets.push_back({{after.data.data(), after.type, after.rows, cols}, y_after.data(), 29});
  mm.run(x.data() + t0 * ldx, n, ldx, targets);
  std::vector<float> out(n * w.rows);
  for (int64_t t = 0; t < n; ++t) std::memcpy(&out[t * w.rows], &y[t * ldy], w.rows * sizeof(float));
  return out;
}

class MatmulBatchInvariance : public ::testing::TestWithParam<DType> {};

TEST_P(MatmulBatchInvariance, RowCountPositionTargetsAndThreadsChangeNoBit) {
  const DType type = GetParam();
  ThreadPool pool1(1), pool2(2);
  for (int64_t cols : invariance_cols(type)) {
    Rng rng(777 + static_cast<uint32_t>(type) + static_cast<uint32_t>(cols));
    const Weight w = make_weight(type, 37, cols, rng);
    const int64_t kInputs = 67, ldx = cols + 3;
    std::vector<float> x = random_input(kInputs, ldx, cols, rng);
    for (int64_t k = 0; k < cols; ++k) x[5 * ldx + k] *= (k % 7 == 0) ? 1e4f : 1e-3f;  // a wide dynamic range
    // Every input row alone, one thread: per family, and the scalar one (all must agree).
    auto rows_one_at_a_time = [&](const char* isa) {
      IsaScope scope(isa);
      CpuMatmul mm(pool1);
      std::vector<float> out(kInputs * w.rows);
      for (int64_t t = 0; t < kInputs; ++t) {
        const std::vector<float> y = outputs_for_rows(mm, w, x, ldx, t, 1, false, rng);
        std::memcpy(&out[t * w.rows], y.data(), y.size() * sizeof(float));
      }
      return out;
    };
    const std::vector<float> scalar_ref = rows_one_at_a_time("scalar");
    for (const char* isa : isas()) {
      const std::vector<float> ref = rows_one_at_a_time(isa);
      EXPECT_EQ(0, std::memcmp(ref.data(), scalar_ref.data(), ref.size() * sizeof(float)))
          << isa << " " << dtype_name(type) << " cols=" << cols << ": single rows differ from the scalar path's";
      IsaScope scope(isa);
      CpuMatmul mm1(pool1), mm2(pool2);
      for (int64_t n : {1, 3, 7, 8, 9, 17, 64}) {
        const int64_t t0 = (n * 5) % (kInputs - n + 1);  // the rows sit at different positions
        for (const bool shared : {false, true}) {
          CpuMatmul& mm = shared ? mm2 : mm1;  // shared targets with 2 threads, alone with 1
          const std::vector<float> y = outputs_for_rows(mm, w, x, ldx, t0, n, shared, rng);
          EXPECT_EQ(0, std::memcmp(y.data(), &ref[t0 * w.rows], y.size() * sizeof(float)))
              << isa << " " << dtype_name(type) << " cols=" << cols << ": rows [" << t0 << ", " << t0 + n << ")"
              << (shared ? " among 3 targets, 2 threads" : " alone, 1 thread")
              << " differ from the same rows computed one at a time";
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, MatmulBatchInvariance, ::testing::ValuesIn(kAllTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// ---- activation quantization is GGML's, to the bit --------------------------------------------

// One-hot Q8_0 rows with d = 1 read the quantized activation back: y[k] = d_x * q_k.
TEST(Matmul, Q8ActivationsRoundHalfToEvenLikeGgml) {
  std::vector<float> x(32, 0.0f);
  x[0] = 127.0f;  // amax 127: d = 1 and id = 1, so q = nearbyint(x)
  x[1] = 2.5f, x[2] = 3.5f, x[3] = -2.5f, x[4] = 0.5f, x[5] = -0.5f, x[6] = 1.49f, x[7] = -126.5f;
  const int expect[8] = {127, 2, 4, -2, 0, 0, 1, -126};
  std::vector<BlockQ8_0> w(8);
  for (int r = 0; r < 8; ++r) {
    w[r].d = f32_to_fp16(1.0f);
    std::memset(w[r].qs, 0, 32);
    w[r].qs[r] = 1;
  }
  ThreadPool pool(1);
  for (const char* isa : isas()) {
    IsaScope scope(isa);
    CpuMatmul mm(pool);
    std::vector<float> y(8);
    const MatmulTarget target{{w.data(), DType::Q8_0, 8, 32}, y.data(), 8};
    mm.run(x.data(), 1, 32, std::span(&target, 1));
    for (int r = 0; r < 8; ++r) EXPECT_EQ(y[r], static_cast<float>(expect[r])) << isa << " element " << r;
  }
}

// Q8_K: iscale = -127/max (max: the first element of largest magnitude), nearest-even.
TEST(Matmul, Q8KActivationsRoundLikeGgml) {
  std::vector<float> x(256, 0.0f);
  x[0] = 10.0f, x[1] = -127.0f, x[2] = 127.0f, x[3] = 2.5f, x[4] = -3.5f, x[5] = 64.0f;
  // max = -127 (first of largest magnitude): iscale = 1, d = 1; q = nearest(x), then
  // MIN(127, q); so y = q for every element.
  const int expect[6] = {10, -127, 127, 2, -4, 64};
  std::vector<BlockQ6_K> w(6);
  for (int r = 0; r < 6; ++r) {
    std::memset(&w[r], 0, sizeof(BlockQ6_K));
    // q = 33 at element r (ql low nibble 1, qh bits 2 = 32), 32 elsewhere; scale 1, d 1.
    for (int l = 0; l < 32; ++l) w[r].qh[l] = 0xAA, w[r].qh[32 + l] = 0xAA;  // every 2-bit high part = 2
    w[r].ql[r] = 0x01;
    for (int g = 0; g < 16; ++g) w[r].scales[g] = 1;
    w[r].d = f32_to_fp16(1.0f);
  }
  ThreadPool pool(1);
  for (const char* isa : isas()) {
    IsaScope scope(isa);
    CpuMatmul mm(pool);
    std::vector<float> y(6);
    const MatmulTarget target{{w.data(), DType::Q6_K, 6, 256}, y.data(), 6};
    mm.run(x.data(), 1, 256, std::span(&target, 1));
    for (int r = 0; r < 6; ++r) EXPECT_EQ(y[r], static_cast<float>(expect[r])) << isa << " element " << r;
  }
}

// ---- llama.cpp's own dot products -------------------------------------------------------------
// tests/fixtures/matmul_ggml_dots.bin (tools/fixtures/gen_matmul_ggml_dots.py): ggml's CPU
// kernels quantized the inputs with its from_float and dotted them with its vec_dot. Matching
// them to float rounding requires bit-identical activation quantization.
TEST(Matmul, AgreesWithLlamaCppDotProducts) {
  const std::string path = std::string(TESSERA_FIXTURES_DIR) + "/matmul_ggml_dots.bin";
  FILE* f = std::fopen(path.c_str(), "rb");
  ASSERT_NE(f, nullptr) << "missing fixture " << path;
  std::vector<uint8_t> file;
  for (int c; (c = std::fgetc(f)) != EOF;) file.push_back(static_cast<uint8_t>(c));
  std::fclose(f);
  ASSERT_GE(file.size(), 12u);
  ASSERT_EQ(std::memcmp(file.data(), "TMGD", 4), 0);
  size_t at = 4;
  auto u32 = [&] {
    uint32_t v;
    std::memcpy(&v, file.data() + at, 4);
    at += 4;
    return v;
  };
  ASSERT_EQ(u32(), 1u);
  const uint32_t n_cases = u32();
  ThreadPool pool(2);
  int checked = 0;
  for (uint32_t c = 0; c < n_cases; ++c) {
    const DType type = static_cast<DType>(u32());
    const int64_t rows = u32(), cols = u32(), n_x = u32();
    const int64_t wbytes = rows * dtype_row_bytes(type, cols);
    ASSERT_LE(at + wbytes + (n_x * cols + n_x * rows) * 4, file.size());
    const uint8_t* w = file.data() + at;
    std::vector<float> x(n_x * cols), expect(n_x * rows);
    std::memcpy(x.data(), w + wbytes, x.size() * 4);
    std::memcpy(expect.data(), w + wbytes + x.size() * 4, expect.size() * 4);
    at += wbytes + (x.size() + expect.size()) * 4;
    for (const char* isa : isas()) {
      IsaScope scope(isa);
      CpuMatmul mm(pool);
      // One row, the batch, and the batch three times over (panel kernels from 8 rows up).
      for (int64_t n : {int64_t{1}, n_x, 3 * n_x}) {
        std::vector<float> xs(n * cols), y(n * rows, std::nanf(""));
        for (int64_t i = 0; i < n; ++i) std::memcpy(&xs[i * cols], &x[(i % n_x) * cols], cols * 4);
        const MatmulTarget target{{w, type, rows, cols}, y.data(), rows};
        mm.run(xs.data(), n, cols, std::span(&target, 1));
        double err = 0, norm = 0;
        for (int64_t i = 0; i < n * rows; ++i) {
          const double e = expect[(i / rows) % n_x * rows + i % rows];
          err += (y[i] - e) * (y[i] - e), norm += e * e;
        }
        EXPECT_LT(std::sqrt(err / norm), 1e-6) << isa << " " << dtype_name(type) << " n=" << n;
      }
    }
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}

// ---- embedding lookup, API checks ------------------------------------------------------------

TEST(Matmul, GetRowsDecodesEveryType) {
  Rng rng(5);
  for (DType t : kAllTypes) {
    const int64_t cols = is_k(t) ? 512 : 96;
    const Weight w = make_weight(t, 10, cols, rng);
    const int32_t ids[4] = {7, 0, 9, 7};
    std::vector<float> out(4 * cols);
    cpu_get_rows({w.data.data(), t, 10, cols}, ids, 4, out.data());
    for (int i = 0; i < 4; ++i)
      for (int64_t k = 0; k < cols; ++k) {
        const double ref = w.ref[ids[i]].a[k] + w.ref[ids[i]].m[k / 32];
        ASSERT_NEAR(out[i * cols + k], ref, 1e-6 * (std::fabs(ref) + 1e-3))
            << dtype_name(t) << " row " << ids[i] << " col " << k;
      }
  }
}

TEST(Matmul, IsaCanBeForcedAndIsChecked) {
  EXPECT_TRUE(CpuMatmul::isa_supported("scalar"));
  EXPECT_FALSE(CpuMatmul::isa_supported("neon"));
  {
    IsaScope scope("scalar");
    EXPECT_STREQ(CpuMatmul::isa(), "scalar");
  }
  {
    IsaScope scope("sse9");
    ThreadPool pool(1);
    EXPECT_THROW(CpuMatmul mm(pool), Error);
  }
  if (!CpuMatmul::isa_supported("avx512")) {
    IsaScope scope("avx512");
    ThreadPool pool(1);
    EXPECT_THROW(CpuMatmul mm(pool), Error);
  }
}

TEST(Matmul, RejectsTargetsOfDifferentWidthsAndUnknownTypes) {
  ThreadPool pool(1);
  CpuMatmul mm(pool);
  std::vector<float> w(64 * 4, 0.0f), x(64, 1.0f), y(8);
  const MatmulTarget mismatched[2] = {{{w.data(), DType::F32, 2, 64}, y.data(), 2},
                                      {{w.data(), DType::F32, 2, 32}, y.data() + 2, 2}};
  EXPECT_THROW(mm.run(x.data(), 1, 64, mismatched), Error);
  const MatmulTarget unknown{{w.data(), DType::I32, 2, 64}, y.data(), 2};
  EXPECT_THROW(mm.run(x.data(), 1, 64, std::span(&unknown, 1)), Error);
  const MatmulTarget ragged{{w.data(), DType::Q8_0, 2, 48}, y.data(), 2};
  EXPECT_THROW(mm.run(x.data(), 1, 48, std::span(&ragged, 1)), Error);
}

}  // namespace
