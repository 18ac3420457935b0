// The tensor-core product of a few rows with 16-bit weights (gemv_mma16.cu: 2-8 rows of a
// decode batch or a speculative verification) against float64, on the activations rounded
// to the weights' 16-bit type as the backend does. Shapes that exercise every edge of its
// layout: widths below one 64-column chunk, not a multiple of it, and wide enough for every
// warp to loop; weight rows not a multiple of its 32-row tiles; 2, 5, 8 rows of x; three
// targets in one launch. FP8W weights (E4M3 codes, f32 scale per row) at 2-16 rows (one and
// two n8 tiles), against float64 on the f16-rounded activations. Skips without a GPU.
#include "core/fp16.h"
#include "core/fp8_weight.h"
#include "cuda_test_util.h"
#include "quant/fp8_weight.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

struct HalfWeight {
  std::vector<uint16_t> bits;
  std::vector<double> value;  // exact
};

HalfWeight make_half_weight(bool bf16, int64_t rows, int64_t cols, std::mt19937& rng) {
  HalfWeight w;
  const auto v = randn(rows * cols, rng, 0.5f);
  for (float f : v) {
    const uint16_t b = bf16 ? f32_to_bf16(f) : f32_to_fp16(f);
    w.bits.push_back(b);
    w.value.push_back(bf16 ? bf16_to_f32(b) : fp16_to_f32(b));
  }
  return w;
}

}  // namespace

TEST(CudaSkinny, FewRowsOfHalfWeightsMatchFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(21);
  for (bool bf16 : {true, false})
    for (int64_t cols : {8, 72, 4104}) {
      const int64_t rows[3] = {31, 100, 33};  // three targets sharing the input (Q, K, V)
      std::vector<HalfWeight> ws;
      std::vector<std::shared_ptr<const void>> devs;
      for (int64_t r : rows) {
        ws.push_back(make_half_weight(bf16, r, cols, rng));
        devs.push_back(gpu->upload(ws.back().bits.data(), ws.back().bits.size() * 2));
      }
      for (int n : {2, 5, 8}) {
        const int64_t ldx = cols + 3;
        auto x = randn(n * ldx, rng);
        DeviceVec<float> dx(*gpu, x);
        std::vector<std::unique_ptr<DeviceVec<float>>> ys;
        std::vector<MatmulTarget> targets;
        for (int t = 0; t < 3; ++t) {
          const int64_t ldy = rows[t] + 1;
          ys.push_back(std::make_unique<DeviceVec<float>>(*gpu, std::vector<float>(n * ldy, NAN)));
          targets.push_back(
              {WeightMatrix{devs[t].get(), bf16 ? DType::BF16 : DType::F16, rows[t], cols}, ys.back()->get(), ldy});
        }
        gpu->matmul(dx.get(), n, ldx, targets);
        for (int t = 0; t < 3; ++t) {
          const auto y = ys[t]->read();
          const int64_t ldy = rows[t] + 1;
          std::vector<double> ref;
          std::vector<float> got;
          for (int i = 0; i < n; ++i)
            for (int64_t r = 0; r < rows[t]; ++r) {
              double acc = 0;
              for (int64_t k = 0; k < cols; ++k) {
                const float xv = x[i * ldx + k];
                const double xr = bf16 ? bf16_to_f32(f32_to_bf16(xv)) : fp16_to_f32(f32_to_fp16(xv));
                acc += xr * ws[t].value[r * cols + k];
              }
              ref.push_back(acc);
              got.push_back(y[i * ldy + r]);
            }
          // Exact 16-bit operands, f32 sums: only the summation order differs.
          EXPECT_LT(rel_err(got, ref), 1e-5)
              << (bf16 ? "bf16" : "f16") << " cols=" << cols << " n=" << n << " target " << t;
          for (int i = 0; i < n; ++i) EXPECT_TRUE(std::isnan(y[i * ldy + rows[t]])) << "the gap of y was written";
        }
      }
    }
}

TEST(CudaSkinny, FewRowsOfFp8WeightsMatchFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(22);
  for (int64_t cols : {16, 80, 4112}) {
    const int64_t rows = 45;
    const Fp8WeightLayout l = Fp8WeightLayout::make(rows, cols);
    std::vector<uint8_t> buf(static_cast<size_t>(l.total_bytes), 0);
    std::vector<double> value(rows * cols);
    auto* scale = reinterpret_cast<float*>(buf.data() + l.off_scales);
    for (int64_t r = 0; r < rows; ++r) {
      scale[r] = 0.01f * (1 + r % 7);
      for (int64_t k = 0; k < cols; ++k) {
        const uint8_t code = static_cast<uint8_t>(rng() & 0xFF);
        buf[r * l.row_bytes + k] = (code & 0x7F) == 0x7F ? 0 : code;  // no NaN codes
        value[r * cols + k] = double(e4m3_to_float(buf[r * l.row_bytes + k])) * scale[r];
      }
    }
    auto dev = gpu->upload(buf.data(), buf.size());
    for (int n : {2, 8, 9, 16}) {
      const int64_t ldx = cols + 1, ldy = rows + 2;
      auto x = randn(n * ldx, rng, 0.1f);
      DeviceVec<float> dx(*gpu, x);
      DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
      const MatmulTarget tg{WeightMatrix{dev.get(), DType::FP8W, rows, cols}, dy.get(), ldy};
      gpu->matmul(dx.get(), n, ldx, std::span(&tg, 1));
      const auto y = dy.read();
      std::vector<double> ref;
      std::vector<float> got;
      for (int i = 0; i < n; ++i)
        for (int64_t r = 0; r < rows; ++r) {
          double acc = 0;
          for (int64_t k = 0; k < cols; ++k)
            acc += double(fp16_to_f32(f32_to_fp16(x[i * ldx + k]))) * value[r * cols + k];
          ref.push_back(acc);
          got.push_back(y[i * ldy + r]);
        }
      EXPECT_LT(rel_err(got, ref), 1e-5) << "cols=" << cols << " n=" << n;
      for (int i = 0; i < n; ++i) EXPECT_TRUE(std::isnan(y[i * ldy + rows])) << "the gap of y was written";
    }
  }
}
