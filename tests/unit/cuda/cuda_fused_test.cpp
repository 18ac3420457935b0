// The CUDA backend's fused paths against float64: matmul targets that sit back to back
// (weights in one allocation, outputs side by side in one row — the model's Q|K|V and
// gate|up layout, run as one product), the bulk matrix-vector kernel at one row (widths
// that are not a multiple of its 2,048-column sweep, several targets), and swiglu_matmul
// (SwiGLU fed into the product: the bulk kernel at one row, the default path at 2..8 rows,
// 16-bit activations straight into cuBLASLt beyond). Outputs are poisoned (NaN) first.
#include <algorithm>
#include <cstring>

#include "cuda_test_util.h"
#include "quant/quant.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

// Several [rows_i, cols] weights of one type stored back to back (as make_resident places
// Q|K|V on a device), with their decoded values.
struct JoinedWeights {
  std::vector<uint8_t> bytes;
  std::vector<std::vector<float>> decoded;
  std::shared_ptr<const void> dev;
  std::vector<WeightMatrix> parts;  // device views
};

JoinedWeights make_joined(Backend& gpu, DType type, const std::vector<int64_t>& rows, int64_t cols,
                          std::mt19937& rng) {
  JoinedWeights j;
  const int64_t rb = dtype_row_bytes(type, cols);
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  j.bytes.resize(total * rb);
  int64_t at = 0;
  for (int64_t r : rows) {
    auto vals = randn(r * cols, rng, 0.5f);
    std::vector<float> dec(r * cols);
    for (int64_t i = 0; i < r; ++i) {
      quantize_row(type, vals.data() + i * cols, j.bytes.data() + (at + i) * rb, cols);
      dequantize_row(type, j.bytes.data() + (at + i) * rb, dec.data() + i * cols, cols);
    }
    j.decoded.push_back(std::move(dec));
    at += r;
  }
  j.dev = gpu.upload(j.bytes.data(), j.bytes.size());
  at = 0;
  for (int64_t r : rows) {
    j.parts.push_back(WeightMatrix{static_cast<const uint8_t*>(j.dev.get()) + at * rb, type, r, cols});
    at += r;
  }
  return j;
}

// Tolerance by path: f32 sums on the stored weights up to 8 rows, tensor cores beyond.
double tolerance(DType type, int n) {
  if (n <= 8) return 2e-5;
  return type == DType::F16 ? 2e-3 : 1e-2;
}

}  // namespace

TEST(CudaFused, BackToBackTargetsMatchFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(21);
  for (DType type : {DType::BF16, DType::F16, DType::Q4_0}) {
    // 2,056 columns: one full sweep of the bulk kernel and a partial one.
    const int64_t cols = type == DType::Q4_0 ? 2048 : 2056;
    const std::vector<int64_t> rows = {40, 24, 24};
    JoinedWeights w = make_joined(*gpu, type, rows, cols, rng);
    const int64_t ldy = 40 + 24 + 24 + 3;  // outputs side by side, then a gap
    for (int n : {1, 3, 33}) {
      auto x = randn(n * cols, rng);
      DeviceVec<float> dx(*gpu, x), dy(*gpu, std::vector<float>(n * ldy, NAN));
      std::vector<MatmulTarget> targets;
      int64_t off = 0;
      for (size_t t = 0; t < rows.size(); ++t) {
        targets.push_back({w.parts[t], dy.get() + off, ldy});
        off += rows[t];
      }
      gpu->matmul(dx.get(), n, cols, targets);
      const auto y = dy.read();
      std::vector<double> ref;
      std::vector<float> got;
      for (int i = 0; i < n; ++i) {
        off = 0;
        for (size_t t = 0; t < rows.size(); ++t) {
          for (int64_t r = 0; r < rows[t]; ++r) {
            double acc = 0;
            for (int64_t k = 0; k < cols; ++k) acc += double(x[i * cols + k]) * w.decoded[t][r * cols + k];
            ref.push_back(acc);
            got.push_back(y[i * ldy + off + r]);
          }
          off += rows[t];
        }
        for (int64_t r = off; r < ldy; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + r])) << "gap written";
      }
      EXPECT_LT(rel_err(got, ref), tolerance(type, n)) << dtype_name(type) << " n=" << n;
    }
  }
}

TEST(CudaFused, BulkMatrixVectorWideRowsMatchFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(22);
  // Widths of the 8B shapes and past them; row counts that do and do not split into chunks
  // of 2 and 4 rows; many rows, so every block of the persistent grid takes several chunks.
  struct Shape {
    int64_t rows, cols;
  };
  for (DType type : {DType::BF16, DType::F16})
    for (Shape s : {Shape{4096, 4096}, Shape{1030, 14336}, Shape{3001, 576}, Shape{300, 16384}}) {
      JoinedWeights w = make_joined(*gpu, type, {s.rows}, s.cols, rng);
      auto x = randn(s.cols, rng);
      DeviceVec<float> dx(*gpu, x), dy(*gpu, std::vector<float>(s.rows, NAN));
      const MatmulTarget t[] = {{w.parts[0], dy.get(), s.rows}};
      gpu->matmul(dx.get(), 1, s.cols, t);
      const auto y = dy.read();
      std::vector<double> ref(s.rows);
      for (int64_t r = 0; r < s.rows; ++r) {
        double acc = 0;
        for (int64_t k = 0; k < s.cols; ++k) acc += double(x[k]) * w.decoded[0][r * s.cols + k];
        ref[r] = acc;
      }
      EXPECT_LT(rel_err(y, ref), 2e-5) << dtype_name(type) << " " << s.rows << "x" << s.cols;
    }
}

TEST(CudaFused, SwigluMatmulMatchesFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(23);
  for (DType type : {DType::BF16, DType::F16, DType::Q8_0, DType::F32}) {
    const int64_t dim = 2592, rows = 72;  // dim: a multiple of 32, not of the 2,048-column sweep
    JoinedWeights w = make_joined(*gpu, type, {rows}, dim, rng);
    for (int n : {1, 3, 33}) {
      const int64_t ld_in = 2 * dim;  // gate | up side by side, as the model lays them out
      auto gu = randn(n * ld_in, rng, 2.0f);
      DeviceVec<float> dgu(*gpu, gu), dh(*gpu, n * dim), dy(*gpu, std::vector<float>(n * rows, NAN));
      const MatmulTarget t[] = {{w.parts[0], dy.get(), rows}};
      gpu->swiglu_matmul(dgu.get(), dgu.get() + dim, ld_in, dh.get(), n, static_cast<int>(dim), t);
      const auto y = dy.read();
      std::vector<double> ref(n * rows);
      for (int i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          double acc = 0;
          for (int64_t k = 0; k < dim; ++k) {
            const double g = gu[i * ld_in + k], u = gu[i * ld_in + dim + k];
            acc += g / (1 + std::exp(-g)) * u * w.decoded[0][r * dim + k];
          }
          ref[i * rows + r] = acc;
        }
      const double tol = type == DType::F32 ? 2e-5 : tolerance(type, n);
      EXPECT_LT(rel_err(y, ref), tol) << dtype_name(type) << " n=" << n;
    }
  }
}
