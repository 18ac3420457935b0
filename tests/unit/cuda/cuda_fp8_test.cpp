// FP8W weights (E4M3, f32 scale per row) on the CUDA backend against float64: the decode
// kernels at 1-8 rows (gemv_fp8.cu at any width; the bulk kernel at batch 1 and widths of
// 16k) with f32 activations, and the W8A8 path past 8 rows (activations quantized per row to
// E4M3, cuBLASLt FP8) against a float64 reference of the same quantized operands, or the bf16
// GEMM on the shapes cuBLASLt's FP8 kernels refuse; NaN sentinels past every output row;
// several targets in one call; bad input refused.
#include <cstdio>

#include "cuda_test_util.h"
#include "quant/fp8_weight.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

struct Fp8W {
  Fp8Matrix m;
  std::vector<float> decoded;  // [rows][cols]
  WeightMatrix host() const { return WeightMatrix{m.data.get(), DType::FP8W, m.layout.rows, m.layout.cols}; }
};

Fp8W make_fp8(int64_t rows, int64_t cols, std::mt19937& rng) {
  auto w = randn(rows * cols, rng, 0.05f);
  Fp8W f{quantize_fp8_rtn(w.data(), rows, cols), std::vector<float>(rows * cols)};
  for (int64_t r = 0; r < rows; ++r) fp8_dequantize_row(f.m.layout, f.m.data.get(), r, f.decoded.data() + r * cols);
  return f;
}

// The activations as the W8A8 path quantizes them (per row, amax / 448), in float64 terms.
std::vector<float> quantize_like_gemm(const std::vector<float>& x, int n, int64_t ldx, int64_t cols) {
  std::vector<float> q(x);
  for (int i = 0; i < n; ++i) {
    float amax = 0;
    for (int64_t k = 0; k < cols; ++k) amax = std::max(amax, std::fabs(x[i * ldx + k]));
    const float s = amax > 0 ? amax / 448.0f : 1.0f;
    for (int64_t k = 0; k < cols; ++k) q[i * ldx + k] = e4m3_to_float(e4m3_from_float(x[i * ldx + k] / s)) * s;
  }
  return q;
}

std::vector<double> reference(const Fp8W& w, const std::vector<float>& x, int n, int64_t ldx) {
  const int64_t rows = w.m.layout.rows, cols = w.m.layout.cols;
  std::vector<double> ref(static_cast<size_t>(n) * rows);
  for (int i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      double acc = 0;
      for (int64_t k = 0; k < cols; ++k) acc += double(x[i * ldx + k]) * w.decoded[r * cols + k];
      ref[i * rows + r] = acc;
    }
  return ref;
}

// The backend's rule (cuda_backend.cpp): W8A8 on cuBLASLt's FP8 kernels for output rows in
// multiples of 16 into a 16-byte aligned output (the tests' outputs start 256-byte aligned).
bool lt_fp8_takes(int64_t rows, int64_t ldy, int64_t offset = 0) {
  return rows % 16 == 0 && ldy % 4 == 0 && offset % 4 == 0;
}

}  // namespace

TEST(CudaFp8, MatmulMatchesFloat64OnAwkwardShapes) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(23);
  double worst_decode = 0, worst_gemm = 0, worst_bf16 = 0, worst_mma = 0;
  struct Case {
    int64_t rows, cols;
  };
  for (const Case& c : {Case{37, 96}, Case{131, 200}, Case{45, 77}, Case{19, 333}, Case{64, 1024}, Case{7, 4096},
                        Case{256, 2048}, Case{5, 1}, Case{48, 200}}) {
    Fp8W w = make_fp8(c.rows, c.cols, rng);
    auto dev = gpu->upload(w.m.data.get(), static_cast<size_t>(w.m.layout.total_bytes));
    WeightMatrix wm = w.host();
    wm.data = dev.get();
    for (int n : {1, 2, 3, 5, 8, 9, 33, 77, 300})
      for (bool aligned : {true, false}) {
        const int64_t ldx = aligned ? (c.cols + 3) / 4 * 4 + 4 : c.cols + 5;
        const int64_t ldy = aligned ? (c.rows + 6) / 4 * 4 : c.rows + 3;
        auto x = randn(n * ldx, rng);
        DeviceVec<float> dx(*gpu, x);
        DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
        const MatmulTarget tg{wm, dy.get(), ldy};
        gpu->matmul(dx.get(), n, ldx, std::span(&tg, 1));
        const auto y = dy.read();
        // 2-16 rows at widths of whole 16-byte rows: the skinny tensor-core kernel (gemv_mma16.cu,
        // x rounded to f16); more rows: W8A8 where cuBLASLt's FP8 GEMM takes the shape.
        const bool mma = n >= 2 && n <= 16 && c.cols % 16 == 0;
        const bool gemm = n > 8 && !mma, w8a8 = gemm && lt_fp8_takes(c.rows, ldy);
        const std::vector<double> ref = reference(w, w8a8 ? quantize_like_gemm(x, n, ldx, c.cols) : x, n, ldx);
        std::vector<float> got;
        for (int i = 0; i < n; ++i)
          for (int64_t r = 0; r < c.rows; ++r) got.push_back(y[i * ldy + r]);
        const double e = rel_err(got, ref);
        double& worst = mma ? worst_mma : w8a8 ? worst_gemm : gemm ? worst_bf16 : worst_decode;
        worst = std::max(worst, e);
        // Decode: f32 arithmetic on exact weights. W8A8: the same quantized operands, f32
        // accumulation on the tensor cores. Skinny: exact weights, x rounded to f16. The bf16
        // GEMM: weights and x rounded to bf16.
        EXPECT_LT(e, mma    ? 2e-3
                     : w8a8 ? 2e-3
                     : gemm ? 1e-2
                            : 1e-5)
            << c.rows << "x" << c.cols << " n=" << n << " aligned=" << aligned;
        for (int i = 0; i < n; ++i)
          for (int64_t r = c.rows; r < ldy; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + r])) << "n=" << n << " r=" << r;
      }
  }
  std::printf(
      "[fp8] worst relative error: decode (1-8 rows) %.3g, skinny (2-16) %.3g, W8A8 GEMM %.3g, bf16 GEMM %.3g\n",
      worst_decode, worst_mma, worst_gemm, worst_bf16);
  EXPECT_GT(worst_mma, 0.0);  // every path ran
  EXPECT_GT(worst_gemm, 0.0);
  EXPECT_GT(worst_bf16, 0.0);
}

// Q/K/V-like: three FP8 weights into column blocks of one output row, one call; gaps stay NaN.
TEST(CudaFp8, SeveralTargetsInOneCall) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(29);
  const int64_t cols = 512;
  std::vector<Fp8W> ws;
  for (int64_t rows : {64, 16, 16}) ws.push_back(make_fp8(rows, cols, rng));
  std::vector<std::shared_ptr<const void>> devs;
  std::vector<int64_t> offs;
  int64_t ldy = 0;
  for (const Fp8W& w : ws) {
    devs.push_back(gpu->upload(w.m.data.get(), static_cast<size_t>(w.m.layout.total_bytes)));
    offs.push_back(ldy);
    ldy += w.m.layout.rows + 4;  // 16-byte aligned blocks: W8A8 past 8 rows
  }
  for (int n : {1, 6, 40}) {
    auto x = randn(n * cols, rng);
    DeviceVec<float> dx(*gpu, x);
    DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
    std::vector<MatmulTarget> tgs;
    for (size_t i = 0; i < ws.size(); ++i) {
      WeightMatrix wm = ws[i].host();
      wm.data = devs[i].get();
      tgs.push_back({wm, dy.get() + offs[i], ldy});
    }
    gpu->matmul(dx.get(), n, cols, tgs);
    const auto y = dy.read();
    // 6 rows: the skinny kernel (f16 x); 40: W8A8 (E4M3 x).
    const auto xr = n > 16 ? quantize_like_gemm(x, n, cols, cols) : x;
    for (size_t t = 0; t < ws.size(); ++t) {
      const std::vector<double> ref = reference(ws[t], xr, n, cols);
      std::vector<float> got;
      const int64_t rows = ws[t].m.layout.rows;
      for (int i = 0; i < n; ++i) {
        for (int64_t r = 0; r < rows; ++r) got.push_back(y[i * ldy + offs[t] + r]);
        for (int64_t r = rows; r < rows + 4; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + offs[t] + r]));
      }
      ASSERT_TRUE(n <= 8 || lt_fp8_takes(rows, ldy, offs[t]));
      EXPECT_LT(rel_err(got, ref), n > 1 ? 2e-3 : 1e-5) << "target " << t << " n=" << n;
    }
  }
}

// A weight buffer the kernels cannot read 16 bytes wide is refused before anything runs.
TEST(CudaFp8, RefusesMisalignedWeights) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(31);
  Fp8W w = make_fp8(8, 64, rng);
  std::vector<uint8_t> host(static_cast<size_t>(w.m.layout.total_bytes) + 1);
  std::memcpy(host.data() + 1, w.m.data.get(), static_cast<size_t>(w.m.layout.total_bytes));
  auto dev = gpu->upload(host.data(), host.size());
  auto x = randn(64, rng);
  DeviceVec<float> dx(*gpu, x);
  DeviceVec<float> dy(*gpu, std::vector<float>(8, NAN));
  WeightMatrix wm = w.host();
  wm.data = static_cast<const uint8_t*>(dev.get()) + 1;
  const MatmulTarget tg{wm, dy.get(), 8};
  EXPECT_THROW(gpu->matmul(dx.get(), 1, 64, std::span(&tg, 1)), Error);
  gpu->synchronize();
  for (float v : dy.read()) EXPECT_TRUE(std::isnan(v));
}
