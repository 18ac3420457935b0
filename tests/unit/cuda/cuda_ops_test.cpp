// CUDA backend conformance, op by op: every op on random inputs of awkward sizes against
// float64 references (row ops, matmul on every weight format) or the CPU backend (paged
// KV store and attention, whose CPU version is itself checked against float64 in
// tests/unit/backend). Outputs are poisoned (NaN) before each run. Skips without a GPU.
#include <algorithm>
#include <numeric>

#include "core/fp16.h"
#include "cuda_test_util.h"
#include "quant/quant.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

const DType kAllWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                                 DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K};

// A random [rows, cols] weight in `type`, with its exact decoded values (CPU reference codec).
struct TestWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> decoded;
  WeightMatrix host;
};

TestWeight make_weight(DType type, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestWeight w;
  const int64_t rb = dtype_row_bytes(type, cols);
  w.bytes.resize(rows * rb);
  w.decoded.resize(rows * cols);
  auto vals = randn(rows * cols, rng, 0.5f);
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(type, vals.data() + r * cols, w.bytes.data() + r * rb, cols);
    dequantize_row(type, w.bytes.data() + r * rb, w.decoded.data() + r * cols, cols);
  }
  w.host = WeightMatrix{w.bytes.data(), type, rows, cols};
  return w;
}

}  // namespace

TEST(CudaOps, EmbedDecodesEveryFormatLikeTheCpuCodec) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(11);
  for (DType type : kAllWeightTypes) {
    const int64_t cols = dtype_traits(type).block_elems == 256 ? 512 : 96, rows = 37;
    TestWeight w = make_weight(type, rows, cols, rng);
    auto dev = gpu->upload(w.bytes.data(), w.bytes.size());
    WeightMatrix table = w.host;
    table.data = dev.get();
    std::vector<int32_t> ids = {0, 36, 5, 5, 17, 36, 1};
    DeviceVec<float> out(*gpu, std::vector<float>(ids.size() * cols, NAN));
    DeviceVec<int32_t> dids(*gpu, ids);  // ops take device index arrays
    gpu->embed(table, dids.get(), static_cast<int>(ids.size()), out.get());
    const auto got = out.read();
    double max_err = 0, max_ref = 0;
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t c = 0; c < cols; ++c) {
        const double ref = w.decoded[ids[i] * cols + c];
        max_err = std::max(max_err, std::fabs(got[i * cols + c] - ref));
        max_ref = std::max(max_ref, std::fabs(ref));
        ASSERT_TRUE(std::isfinite(got[i * cols + c])) << dtype_name(type);
      }
    // Same products as the CPU codec; a fused multiply-add may move the last bit.
    EXPECT_LE(max_err, 1e-6 * max_ref) << dtype_name(type);
  }
}

TEST(CudaOps, MatmulEveryFormatSmallAndLargeBatchesMatchFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(12);
  for (DType type : kAllWeightTypes) {
    const int64_t cols = dtype_traits(type).block_elems == 256 ? 768 : 224;
    const int64_t rows[3] = {37, 8, 131};  // three targets sharing the input (Q, K, V)
    std::vector<TestWeight> ws;
    std::vector<std::shared_ptr<const void>> devs;
    for (int64_t r : rows) {
      ws.push_back(make_weight(type, r, cols, rng));
      devs.push_back(gpu->upload(ws.back().bytes.data(), ws.back().bytes.size()));
    }
    for (int n : {1, 3, 8, 9, 33}) {
      const int64_t ldx = cols + 5;  // rows of x not packed
      auto x = randn(n * ldx, rng);
      DeviceVec<float> dx(*gpu, x);
      // Up to 8 rows Q4_0/Q4_1/Q8_0/Q4_K take integer dot products on x quantized per 32
      // columns (gemv_blocks_q8.cu): the reference takes the same rounding of x.
      const bool int_dot =
          n <= 8 && (type == DType::Q4_0 || type == DType::Q4_1 || type == DType::Q8_0 || type == DType::Q4_K);
      const std::vector<float> xr = int_dot ? q8_round_trip(x, n, ldx, cols) : x;
      std::vector<std::unique_ptr<DeviceVec<float>>> ys;
      std::vector<MatmulTarget> targets;
      for (int t = 0; t < 3; ++t) {
        const int64_t ldy = rows[t] + 3;
        ys.push_back(std::make_unique<DeviceVec<float>>(*gpu, std::vector<float>(n * ldy, NAN)));
        WeightMatrix wm = ws[t].host;
        wm.data = devs[t].get();
        targets.push_back({wm, ys.back()->get(), ldy});
      }
      gpu->matmul(dx.get(), n, ldx, targets);
      for (int t = 0; t < 3; ++t) {
        const auto y = ys[t]->read();
        const int64_t ldy = rows[t] + 3;
        std::vector<double> ref;
        std::vector<float> got;
        for (int i = 0; i < n; ++i)
          for (int64_t r = 0; r < rows[t]; ++r) {
            double acc = 0;
            for (int64_t k = 0; k < cols; ++k) acc += double(xr[i * ldx + k]) * ws[t].decoded[r * cols + k];
            ref.push_back(acc);
            got.push_back(y[i * ldy + r]);
          }
        // One row (and up to 8 rows of the non-16-bit formats): f32 products on the stored
        // weights (integer ones on quantized x). Otherwise tensor cores with the activations
        // (and decoded quantized weights) rounded to bf16 (f16 for f16 weights; f32 weights
        // stay f32): 16-bit weights take the GEMM from 2 rows.
        const bool plain16 = type == DType::F16 || type == DType::BF16;
        const bool small = n == 1 || (n <= 8 && !plain16);
        const double tol = small || type == DType::F32 ? 2e-5 : (type == DType::F16 ? 2e-3 : 1e-2);
        EXPECT_LT(rel_err(got, ref), tol) << dtype_name(type) << " n=" << n << " target " << t;
        for (int i = 0; i < n; ++i)  // the gap between rows of y is not written
          for (int64_t r = rows[t]; r < ldy; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + r]));
      }
    }
  }
}

TEST(CudaOps, RmsNormAndFusedResidualMatchFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(13);
  for (int dim : {7, 64, 577, 4096}) {
    const int rows = 5;
    auto x = randn(rows * dim, rng), res = randn(rows * dim, rng), w = randn(dim, rng);
    DeviceVec<float> dx(*gpu, x), dres(*gpu, res), dw(*gpu, w), out(*gpu, std::vector<float>(rows * dim, NAN));
    gpu->rms_norm(dx.get(), dw.get(), out.get(), rows, dim, 1e-5f);
    auto ref_norm = [&](const std::vector<double>& xv) {
      std::vector<double> ref(rows * dim);
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += xv[r * dim + i] * xv[r * dim + i];
        const double inv = 1 / std::sqrt(ss / dim + 1e-5);
        for (int i = 0; i < dim; ++i) ref[r * dim + i] = xv[r * dim + i] * inv * w[i];
      }
      return ref;
    };
    std::vector<double> xd(x.begin(), x.end());
    EXPECT_LT(rel_err(out.read(), ref_norm(xd)), 1e-6) << "dim " << dim;
    // in place (out == x), as the model does for the final norm
    DeviceVec<float> inplace(*gpu, x);
    gpu->rms_norm(inplace.get(), dw.get(), inplace.get(), rows, dim, 1e-5f);
    EXPECT_LT(rel_err(inplace.read(), ref_norm(xd)), 1e-6) << "in place, dim " << dim;
    // fused: x += res, then norm
    out.put(std::vector<float>(rows * dim, NAN));
    gpu->add_rms_norm(dx.get(), dres.get(), dw.get(), out.get(), rows, dim, 1e-5f);
    std::vector<double> sum(rows * dim);
    for (int i = 0; i < rows * dim; ++i) sum[i] = double(x[i]) + res[i];
    EXPECT_LT(rel_err(dx.read(), sum), 1e-7) << "residual, dim " << dim;
    EXPECT_LT(rel_err(out.read(), ref_norm(sum)), 1e-6) << "fused, dim " << dim;
  }
}

TEST(CudaOps, RopeNormalNeoxLlama3AndFreqFactorsMatchFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(14);
  const int head_dim = 64, n_heads = 3, rows = 9;
  const int64_t ld = n_heads * head_dim + 4;
  std::vector<float> factors(24);
  for (auto& f : factors) f = 1.0f + std::uniform_real_distribution<float>(0, 3)(rng);
  DeviceVec<float> dfactors(*gpu, factors);
  for (int variant = 0; variant < 4; ++variant) {
    RopeConfig cfg;
    cfg.head_dim = head_dim;
    cfg.rot_dim = variant == 3 ? 48 : head_dim;  // partial rotation
    cfg.freq_base = 500000.0f;
    cfg.neox = variant % 2 == 1;
    if (variant >= 2) {
      cfg.llama3_factor = 8;
      cfg.llama3_original_ctx = 8192;
    }
    if (variant == 3) cfg.freq_factors = dfactors.get();
    std::vector<int32_t> pos = {0, 1, 7, 100, 4095, 8191, 8192, 65000, 131071};
    auto x = randn(rows * ld, rng);
    DeviceVec<float> dx(*gpu, x);
    DeviceVec<int32_t> dpos(*gpu, pos);
    gpu->rope(dx.get(), rows, ld, n_heads, dpos.get(), cfg);
    const auto got = dx.read();
    // float64 reference, written out independently of the backends' shared helper
    std::vector<double> ref(x.begin(), x.end());
    const int half = cfg.rot_dim / 2;
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < half; ++i) {
        double inv = std::pow(500000.0, -2.0 * i / cfg.rot_dim);
        if (cfg.llama3_factor > 0) {
          const double wl = 2 * M_PI / inv, lo = 8192.0 / 1.0, hi = 8192.0 / 4.0;
          if (wl > lo)
            inv /= 8;
          else if (wl >= hi) {
            const double sm = (8192.0 / wl - 1.0) / (4.0 - 1.0);
            inv = (1 - sm) * inv / 8 + sm * inv;
          }
        }
        if (variant == 3) inv /= factors[i];
        const double th = pos[r] * inv, c = std::cos(th), s = std::sin(th);
        for (int h = 0; h < n_heads; ++h) {
          const int64_t o = r * ld + h * head_dim;
          const int ia = cfg.neox ? i : 2 * i, ib = cfg.neox ? i + half : 2 * i + 1;
          const double a = x[o + ia], b = x[o + ib];
          ref[o + ia] = a * c - b * s;
          ref[o + ib] = a * s + b * c;
        }
      }
    EXPECT_LT(rel_err(got, ref), 1e-6) << "variant " << variant;
  }
}

TEST(CudaOps, ElementwiseOpsMatchFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(15);
  const int rows = 7, dim = 333;
  const int64_t ld = dim + 11;
  // SwiGLU
  auto gate = randn(rows * ld, rng, 3.0f), up = randn(rows * ld, rng);
  DeviceVec<float> dg(*gpu, gate), du(*gpu, up), out(*gpu, std::vector<float>(rows * dim, NAN));
  gpu->swiglu(dg.get(), du.get(), ld, out.get(), rows, dim);
  std::vector<double> ref(rows * dim);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < dim; ++i) {
      const double g = gate[r * ld + i];
      ref[r * dim + i] = g / (1 + std::exp(-g)) * up[r * ld + i];
    }
  EXPECT_LT(rel_err(out.read(), ref), 1e-6);
  {
    // SwiGLU's 16-byte path: width and stride multiples of 4.
    const int dim4 = 256;
    const int64_t ld4 = dim4 + 12;
    auto g4 = randn(rows * ld4, rng, 3.0f), u4 = randn(rows * ld4, rng);
    DeviceVec<float> dg4(*gpu, g4), du4(*gpu, u4), out4(*gpu, std::vector<float>(rows * dim4, NAN));
    gpu->swiglu(dg4.get(), du4.get(), ld4, out4.get(), rows, dim4);
    std::vector<double> ref4(rows * dim4);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < dim4; ++i) {
        const double g = g4[r * ld4 + i];
        ref4[r * dim4 + i] = g / (1 + std::exp(-g)) * u4[r * ld4 + i];
      }
    EXPECT_LT(rel_err(out4.read(), ref4), 1e-6);
  }
  // bias on a strided matrix; the gap stays untouched
  auto x = randn(rows * ld, rng), bias = randn(dim, rng);
  DeviceVec<float> dx(*gpu, x), db(*gpu, bias);
  gpu->add_bias(dx.get(), ld, db.get(), rows, dim);
  const auto xb = dx.read();
  for (int r = 0; r < rows; ++r)
    for (int64_t i = 0; i < ld; ++i) ASSERT_EQ(xb[r * ld + i], i < dim ? x[r * ld + i] + bias[i] : x[r * ld + i]);
  // add
  auto y = randn(rows * ld, rng);
  DeviceVec<float> dy(*gpu, y);
  gpu->add(dx.get(), dy.get(), rows * ld);
  const auto xs = dx.read();
  for (int64_t i = 0; i < rows * ld; ++i) ASSERT_EQ(xs[i], xb[i] + y[i]);
  // gather_rows
  std::vector<int32_t> pick = {6, 0, 3, 3};
  DeviceVec<float> dst(*gpu, std::vector<float>(pick.size() * dim, NAN));
  DeviceVec<int32_t> dpick(*gpu, pick);
  gpu->gather_rows(dx.get(), ld, dpick.get(), static_cast<int>(pick.size()), dim, dst.get());
  const auto gathered = dst.read();
  for (size_t i = 0; i < pick.size(); ++i)
    for (int c = 0; c < dim; ++c) ASSERT_EQ(gathered[i * dim + c], xs[pick[i] * ld + c]);
}

TEST(CudaOps, GemmaOpsMatchTheCpu) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  auto cpu = make_cpu();
  std::mt19937 rng(31);
  const int rows = 5, dim = 2048;
  const int64_t ld = 2 * dim;  // gate | up in one row, as the model lays them out
  auto gu = randn(rows * ld, rng, 3.0f);
  gu[7] = 60.0f;  // saturating gates stay finite
  gu[8] = -60.0f;
  DeviceVec<float> dgu(*gpu, gu), out(*gpu, std::vector<float>(rows * dim, NAN));
  std::vector<float> cout(rows * dim, NAN);
  gpu->geglu(dgu.get(), dgu.get() + dim, ld, out.get(), rows, dim);
  cpu->geglu(gu.data(), gu.data() + dim, ld, cout.data(), rows, dim);
  EXPECT_LT(rel_err(out.read(), cout), 1e-6);
  // QK-norm on Q|K|V rows: 4 query heads then 1 key head of 256, each its own weights; V untouched.
  const int hd = 256, nq = 4, nk = 1;
  const int64_t qkv_ld = (nq + 2 * nk) * hd;
  auto x = randn(rows * qkv_ld, rng, 2.0f), wq = randn(hd, rng), wk = randn(hd, rng);
  DeviceVec<float> dx(*gpu, x), dwq(*gpu, wq), dwk(*gpu, wk);
  auto cx = x;
  gpu->rms_norm_heads(dx.get(), qkv_ld, rows, nq, hd, dwq.get(), 1e-6f);
  gpu->rms_norm_heads(dx.get() + nq * hd, qkv_ld, rows, nk, hd, dwk.get(), 1e-6f);
  cpu->rms_norm_heads(cx.data(), qkv_ld, rows, nq, hd, wq.data(), 1e-6f);
  cpu->rms_norm_heads(cx.data() + nq * hd, qkv_ld, rows, nk, hd, wk.data(), 1e-6f);
  const auto gx = dx.read();
  EXPECT_LT(rel_err(gx, cx), 1e-6);
  for (int r = 0; r < rows; ++r)
    for (int64_t i = (nq + nk) * hd; i < qkv_ld; ++i) ASSERT_EQ(gx[r * qkv_ld + i], x[r * qkv_ld + i]);
  // scale
  gpu->scale(dx.get(), 25.298221f, rows * qkv_ld);
  cpu->scale(cx.data(), 25.298221f, rows * qkv_ld);
  EXPECT_LT(rel_err(dx.read(), cx), 1e-6);
}
