// Group-quantized weights (W4G/W8G) on the CUDA backend: matmul at decode and prefill row
// counts against float64 (the decode kernel reading the codes, gemv_gq.cu, at awkward shapes
// and several targets per call; the bf16 decode + cuBLASLt past 8 rows; the norm and SwiGLU
// kernels writing its Q8 input), bad input refused,
// and a quantized checkpoint (tests/fixtures/wquant) giving the logits of the CPU backend
// running the same model with its weights decoded to f32. Skips without a GPU. With
// TESSERA_CUDA_BENCH set, the decode kernel's bandwidth at Llama-3.1-8B shapes.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <numeric>

#include "core/fp16.h"
#include "core/fp8_weight.h"
#include "../model/dequantized_weights.h"
#include "cuda_test_util.h"
#include "engine/model_runner.h"
#include "model/model.h"
#include "quant/group_quant.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

struct GqWeight {
  GroupQuantMatrix m;
  WeightMatrix host;
  std::vector<float> decoded;  // [rows][cols], input order
};

GqWeight make_gq(int bits, int64_t rows, int64_t cols, int64_t group, bool asym, bool act_order, std::mt19937& rng) {
  const int64_t n_groups = (cols + group - 1) / group;
  std::vector<uint8_t> codes(rows * cols), zeros(asym ? n_groups * rows : 0);
  std::vector<uint16_t> scales(n_groups * rows);
  std::vector<int32_t> g_idx;
  for (auto& c : codes) c = static_cast<uint8_t>(rng() % (1u << bits));
  for (auto& z : zeros) z = static_cast<uint8_t>(rng() % (1u << bits));
  std::uniform_real_distribution<float> sd(0.005f, 0.05f);
  for (auto& h : scales) h = f32_to_fp16(sd(rng));
  if (act_order) {
    std::vector<int32_t> order(cols);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    g_idx.resize(cols);
    for (int64_t i = 0; i < cols; ++i) g_idx[order[i]] = static_cast<int32_t>(i / group);
  }
  GqWeight w;
  w.m = build_group_quant(GroupQuantSource{bits, rows, cols, group, codes, scales, zeros, g_idx}, "test weight");
  w.host = WeightMatrix{w.m.data.get(), bits == 8 ? DType::W8G : DType::W4G, rows, cols};
  w.host.group_size = w.m.layout.group_size;
  w.host.gq_zeros = w.m.layout.has_zeros;
  w.host.gq_perm = w.m.layout.has_perm;
  w.decoded.resize(rows * cols);
  for (int64_t r = 0; r < rows; ++r) gq_dequantize_row(w.m.layout, w.m.data.get(), r, w.decoded.data() + r * cols);
  return w;
}

// y[i * ldy + r] = sum_k x[i * ldx + k] * decoded[r][k], in float64.
std::vector<double> reference(const GqWeight& w, const std::vector<float>& x, int n, int64_t ldx) {
  std::vector<double> ref(static_cast<size_t>(n) * w.host.rows);
  for (int i = 0; i < n; ++i)
    for (int64_t r = 0; r < w.host.rows; ++r) {
      double acc = 0;
      for (int64_t k = 0; k < w.host.cols; ++k) acc += double(x[i * ldx + k]) * w.decoded[r * w.host.cols + k];
      ref[i * w.host.rows + r] = acc;
    }
  return ref;
}

// x as the decode kernel sees it: in the weight's stored column order, quantized per 32 columns.
std::vector<float> q8_round_trip(const GqWeight& w, const std::vector<float>& x, int n, int64_t ldx) {
  const GroupQuantLayout& l = w.m.layout;
  return cudatest::q8_round_trip(x, n, ldx, w.host.cols,
                                 l.has_perm ? reinterpret_cast<const int32_t*>(w.m.data.get() + l.off_perm) : nullptr);
}

// Relative error of outputs y (rows of stride ldy) against float64 over the activations x as
// the path rounds them: up to 8 rows quantized per 32 columns, past 8 as they are (the bf16
// GEMM's rounding is inside the tolerance).
double error_vs_float64(const GqWeight& w, const std::vector<float>& y, int64_t ldy, const std::vector<float>& x, int n,
                        int64_t ldx) {
  const int64_t rows = w.host.rows;
  const std::vector<double> all = reference(w, n <= 8 ? q8_round_trip(w, x, n, ldx) : x, n, ldx);
  std::vector<double> ref;
  std::vector<float> got;
  for (int i = 0; i < n; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      ref.push_back(all[i * rows + r]);
      got.push_back(y[i * ldy + r]);
    }
  return rel_err(got, ref);
}

}  // namespace

// The decode kernel at every row count it takes (1-8), with x rows 16-byte aligned and not
// (ldx odd: the scalar loads), widths that leave a partial group and a partial 32-column
// chunk, act-order, zero points, per-channel scales, one and several warps and steps over a
// row, every shape class of rows of x (1, 2, 3-4, 5-8) with both rows-per-block choices of
// each; then the GEMM path at 9 and 33 rows.
// Nothing past each output row is written (NaN sentinels in the stride's gap).
TEST(CudaWeightQuant, DecodeKernelMatchesFloat64OnAwkwardShapes) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(7);
  double worst_decode = 0;
  struct Case {
    int bits;
    int64_t rows, cols, group;
    bool asym, act_order;
  };
  for (const Case& c :
       {Case{4, 37, 96, 32, false, false}, Case{4, 131, 200, 64, true, true}, Case{4, 45, 77, 32, true, false},
        Case{4, 19, 333, 333, false, true}, Case{4, 66, 1056, 96, true, false}, Case{8, 40, 320, 128, true, false},
        Case{8, 9, 200, 200, false, true}, Case{8, 23, 161, 32, true, false}, Case{8, 5, 2080, 64, false, true},
        // Past 256 chunks a row: two steps per thread at one chunk a step (5 warps of 32 over
        // 260 chunks), one step of two at two (the second partial).
        Case{4, 21, 8300, 128, true, true}, Case{8, 6, 8224, 8224, false, false},
        // Enough rows for the 8 (1-2 rows of x) and 4 (3-8) rows per block on GPUs up to 132
        // SMs, rows not a multiple of either (a partial last block); 65 chunks: the width over 3
        // warps at one chunk a step, over 2 at two (one thread's second chunk past the row).
        Case{4, 2125, 2080, 64, true, false}, Case{8, 2119, 1056, 96, false, true},
        // 4 rows per block at 3-8 rows of x and past 512 chunks a row: two steps of two chunks
        // per thread, the second partial; width a partial 32-column chunk.
        Case{4, 1061, 16421, 128, true, false}, Case{8, 1059, 16400, 16400, false, false}}) {
    GqWeight w = make_gq(c.bits, c.rows, c.cols, c.group, c.asym, c.act_order, rng);
    auto dev = gpu->upload(w.m.data.get(), static_cast<size_t>(w.host.bytes()));
    WeightMatrix wm = w.host;
    wm.data = dev.get();
    std::vector<int> ns = {1, 2, 3, 4, 5, 6, 7, 8};
    if (c.cols % 8 == 0) ns.insert(ns.end(), {9, 33});  // the GEMM path takes widths of 8k
    for (int n : ns)
      for (bool aligned : {true, false}) {
        // x rows 16-byte aligned take the vector loads; odd strides the scalar ones.
        const int64_t ldx = aligned ? (c.cols + 3) / 4 * 4 + 4 : c.cols + 5, ldy = c.rows + 3;
        auto x = randn(n * ldx, rng);
        DeviceVec<float> dx(*gpu, x);
        DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
        const MatmulTarget tg{wm, dy.get(), ldy};
        gpu->matmul(dx.get(), n, ldx, std::span(&tg, 1));
        const auto y = dy.read();
        // Up to 8 rows: activations quantized per 32 columns, the rest exact or f32 (float32
        // rounding only). Past 8: weights and activations rounded to bf16 for the tensor cores.
        const std::vector<double> ref = reference(w, n <= 8 ? q8_round_trip(w, x, n, ldx) : x, n, ldx);
        std::vector<float> got;
        for (int i = 0; i < n; ++i)
          for (int64_t r = 0; r < c.rows; ++r) got.push_back(y[i * ldy + r]);
        if (n <= 8) worst_decode = std::max(worst_decode, rel_err(got, ref));
        EXPECT_LT(rel_err(got, ref), n <= 8 ? 1e-5 : 1e-2) << "W" << c.bits << " " << c.rows << "x" << c.cols << " g"
                                                           << c.group << " n=" << n << " aligned=" << aligned;
        for (int i = 0; i < n; ++i)
          for (int64_t r = c.rows; r < ldy; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + r])) << "n=" << n << " r=" << r;
      }
  }
  std::printf("[decode] worst relative error at 1-8 rows: %.3g\n", worst_decode);
}

// Q/K/V-like: three weights of one width into column blocks of one output row (ldy the whole
// row), one call. Two share a launch (zero points on one only); the act-order one runs alone
// on x gathered into its order; a W8G target of the same width joins too. Gaps between the
// blocks stay NaN.
TEST(CudaWeightQuant, DecodeRunsSeveralTargetsInOneCall) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(11);
  const int64_t cols = 256;
  std::vector<GqWeight> ws;
  // Enough rows in the shared launch for 8 (1-2 rows of x) or 4 (3-8) rows per block on GPUs
  // up to 132 SMs, each target's last block partial.
  ws.push_back(make_gq(4, 1501, cols, 32, false, false, rng));
  ws.push_back(make_gq(4, 703, cols, 32, true, false, rng));
  ws.push_back(make_gq(4, 16, cols, 64, true, true, rng));
  ws.push_back(make_gq(8, 9, cols, 128, false, false, rng));
  std::vector<std::shared_ptr<const void>> devs;
  std::vector<int64_t> offs;
  int64_t ldy = 0;
  for (const GqWeight& w : ws) {
    devs.push_back(gpu->upload(w.m.data.get(), static_cast<size_t>(w.host.bytes())));
    offs.push_back(ldy);
    ldy += w.host.rows + 2;  // a 2-column gap after each block
  }
  for (int n : {1, 2, 3, 6}) {
    auto x = randn(n * cols, rng);
    DeviceVec<float> dx(*gpu, x);
    DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
    std::vector<MatmulTarget> tgs;
    for (size_t i = 0; i < ws.size(); ++i) {
      WeightMatrix wm = ws[i].host;
      wm.data = devs[i].get();
      tgs.push_back({wm, dy.get() + offs[i], ldy});
    }
    gpu->matmul(dx.get(), n, cols, tgs);
    const auto y = dy.read();
    for (size_t t = 0; t < ws.size(); ++t) {
      const std::vector<double> ref = reference(ws[t], q8_round_trip(ws[t], x, n, cols), n, cols);
      std::vector<float> got;
      const int64_t rows = ws[t].host.rows;
      for (int i = 0; i < n; ++i) {
        for (int64_t r = 0; r < rows; ++r) got.push_back(y[i * ldy + offs[t] + r]);
        for (int64_t r = rows; r < rows + 2; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + offs[t] + r]));
      }
      EXPECT_LT(rel_err(got, ref), 1e-5) << "target " << t << " n=" << n;
    }
  }
}

// Layouts the kernels do not compute with, and buffers they cannot read wide, are refused
// before anything runs: the output keeps its sentinels.
TEST(CudaWeightQuant, DecodeRefusesBadInput) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(5);
  GqWeight w = make_gq(4, 8, 64, 32, false, false, rng);
  // One byte more so that a misaligned view of the same planes stays inside the allocation.
  std::vector<uint8_t> host(static_cast<size_t>(w.host.bytes()) + 1);
  std::memcpy(host.data() + 1, w.m.data.get(), static_cast<size_t>(w.host.bytes()));
  auto dev = gpu->upload(host.data(), host.size());
  auto x = randn(64, rng);
  DeviceVec<float> dx(*gpu, x);
  DeviceVec<float> dy(*gpu, std::vector<float>(8, NAN));
  auto refused = [&](WeightMatrix wm, const char* what) {
    const MatmulTarget tg{wm, dy.get(), 8};
    EXPECT_THROW(gpu->matmul(dx.get(), 1, 64, std::span(&tg, 1)), Error) << what;
    gpu->synchronize();
    for (float v : dy.read()) EXPECT_TRUE(std::isnan(v)) << what;
  };
  WeightMatrix misaligned = w.host;
  misaligned.data = static_cast<const uint8_t*>(dev.get()) + 1;
  refused(misaligned, "buffer not 16-byte aligned");
  WeightMatrix bad_group = w.host;
  bad_group.data = dev.get();
  bad_group.group_size = 48;
  refused(bad_group, "group size neither a multiple of 32 nor the width");
  WeightMatrix no_group = bad_group;
  no_group.group_size = 0;
  refused(no_group, "no group size");
}

// Decode bandwidth at Llama-3.1-8B shapes: per matrix, the bytes the kernel must read (codes,
// scales, zeros) over its time, against the measured copy bandwidth. Graph-captured so that
// launch gaps stay out; 4 layers' weights (past the L2) cycled.
TEST(CudaWeightQuant, DecodeBandwidthAtLlama8BShapes) {
  TESSERA_REQUIRE_CUDA();
  const char* flag = std::getenv("TESSERA_CUDA_BENCH");
  if (!flag) GTEST_SKIP() << "set TESSERA_CUDA_BENCH=1";
  auto gpu = make_cuda();
  const DeviceCeilings ceil = measure_cuda_ceilings(*gpu);
  std::mt19937 rng(3);
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate|up", 28672, 4096}, {"down", 4096, 14336}};
  std::printf(
      "\n[bench] copy ceiling %.0f GB/s\n| weight | shape | rows of x | us | GB/s | of copy "
      "|\n|---|---|---|---|---|---|\n",
      ceil.copy_bytes_per_s / 1e9);
  // bits 16: bf16 weights (the bulk kernel at one row, the skinny tensor-core kernel past it);
  // bits 9: FP8W (E4M3 codes, f32 scale per row).
  for (int bits : {4, 8, 16, 9}) {
    constexpr int kXRows[] = {1, 2, 4, 5, 8, 9, 16, 32};  // the integer kernels' classes, then tensor cores
    const char* fmt = bits == 4 ? "W4G g128" : bits == 8 ? "W8G g128" : bits == 16 ? "bf16" : "fp8";
    const DType type = bits == 4 ? DType::W4G : bits == 8 ? DType::W8G : bits == 16 ? DType::BF16 : DType::FP8W;
    double layer_us[std::size(kXRows)] = {}, layer_bytes = 0;
    for (const Shape& sh : shapes) {
      // Random codes straight into the layout (make_gq's float64 decode is too slow here);
      // bf16: a repeating pattern of small values (random bits would hold NaNs).
      const GroupQuantLayout l = GroupQuantLayout::make(bits == 4 ? 4 : 8, sh.rows, sh.cols, 128, false, false);
      const Fp8WeightLayout f8 = Fp8WeightLayout::make(sh.rows, sh.cols);
      const size_t n_bytes = bits == 16  ? static_cast<size_t>(sh.rows * sh.cols * 2)
                             : bits == 9 ? static_cast<size_t>(f8.total_bytes)
                                         : static_cast<size_t>(l.total_bytes);
      std::vector<uint8_t> buf(n_bytes);
      if (bits == 9) {  // codes of magnitude 2^-4..2^-1 with both signs, unit scales
        for (int64_t i = 0; i < sh.rows * f8.row_bytes; ++i)
          buf[i] = static_cast<uint8_t>((0x18 + rng() % 24) | (rng() & 0x80));
        auto* sc = reinterpret_cast<float*>(buf.data() + f8.off_scales);
        for (int64_t r = 0; r < sh.rows; ++r) sc[r] = 1.0f;
      } else if (bits == 16) {
        std::vector<uint16_t> pattern(4099);
        for (auto& v : pattern) v = f32_to_bf16(0.02f * std::normal_distribution<float>()(rng));
        auto* w16 = reinterpret_cast<uint16_t*>(buf.data());
        for (size_t i = 0; i < n_bytes / 2; ++i) w16[i] = pattern[i % pattern.size()];
      } else {
        for (size_t i = 0; i < buf.size(); i += 4) {
          const uint32_t v = rng();
          std::memcpy(buf.data() + i, &v, std::min<size_t>(4, buf.size() - i));
        }
        auto* sc = reinterpret_cast<uint16_t*>(buf.data() + l.off_scales);
        for (int64_t i = 0; i < l.n_groups * l.rows; ++i) sc[i] = f32_to_fp16(0.01f);
      }
      constexpr int kCopies = 4;
      std::vector<std::shared_ptr<const void>> devs;
      for (int i = 0; i < kCopies; ++i) devs.push_back(gpu->upload(buf.data(), buf.size()));
      const double bytes =
          bits == 16 || bits == 9 ? double(n_bytes) : double(l.rows * l.code_row_bytes + l.n_groups * l.rows * 2);
      layer_bytes += bytes;
      for (size_t ni = 0; ni < std::size(kXRows); ++ni) {
        const int n = kXRows[ni];
        DeviceVec<float> dx(*gpu, randn(n * sh.cols, rng));
        DeviceVec<float> dy(*gpu, std::vector<float>(n * sh.rows, 0.0f));
        auto run = [&] {
          for (int i = 0; i < kCopies; ++i) {
            WeightMatrix wm{devs[i].get(), type, sh.rows, sh.cols};
            if (is_group_quant(type)) wm.group_size = 128;
            const MatmulTarget tg{wm, dy.get(), sh.rows};
            gpu->matmul(dx.get(), n, sh.cols, std::span(&tg, 1));
          }
        };
        run();  // warm-up
        gpu->begin_capture();
        for (int rep = 0; rep < 10; ++rep) run();
        auto graph = gpu->end_capture();
        graph->launch();
        gpu->synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        constexpr int kLaunches = 5;
        for (int i = 0; i < kLaunches; ++i) graph->launch();
        gpu->synchronize();
        const double us = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() * 1e6 /
                          (kLaunches * 10 * kCopies);
        layer_us[ni] += us;
        std::printf("| %s | %s %lldx%lld | %d | %.1f | %.0f | %.0f%% |\n", fmt, sh.name,
                    static_cast<long long>(sh.rows), static_cast<long long>(sh.cols), n, us, bytes / us / 1e3,
                    100 * bytes / us / 1e3 / (ceil.copy_bytes_per_s / 1e9));
      }
    }
    for (size_t k = 0; k < std::size(kXRows); ++k)
      std::printf("| %s | one layer | %d | %.1f | %.0f | %.0f%% |\n", fmt, kXRows[k], layer_us[k],
                  layer_bytes / layer_us[k] / 1e3,
                  100 * layer_bytes / layer_us[k] / 1e3 / (ceil.copy_bytes_per_s / 1e9));
  }
}

TEST(CudaWeightQuant, MatmulMatchesFloat64AtDecodeAndPrefillRows) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(41);
  struct Case {
    int bits;
    int64_t rows, cols, group;
    bool asym, act_order;
  };
  for (const Case& c :
       {Case{4, 37, 96, 32, false, false}, Case{4, 131, 200, 64, true, true}, Case{8, 40, 320, 128, true, false},
        Case{8, 9, 200, 200, false, true}, Case{4, 70, 1024, 1024, true, false}}) {
    GqWeight w = make_gq(c.bits, c.rows, c.cols, c.group, c.asym, c.act_order, rng);
    auto dev = gpu->upload(w.m.data.get(), static_cast<size_t>(w.host.bytes()));
    WeightMatrix wm = w.host;
    wm.data = dev.get();
    for (int n : {1, 5, 9, 20, 32, 77}) {
      const int64_t ldx = c.cols + 5, ldy = c.rows + 3;
      auto x = randn(n * ldx, rng);
      DeviceVec<float> dx(*gpu, x);
      DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
      const MatmulTarget tg{wm, dy.get(), ldy};
      gpu->matmul(dx.get(), n, ldx, std::span(&tg, 1));
      const auto y = dy.read();
      // Up to 8 rows activations quantized per 32 columns (the reference takes the same
      // rounding); 9-32 rows without a permutation, widths of whole 32-column blocks: weights
      // decoded to f16 in registers and activations rounded to f16 (gemv_gq_mma.cu); otherwise
      // both rounded to bf16 for cuBLASLt.
      const bool skinny_mma = n <= 32 && !c.act_order && c.cols % 32 == 0;
      EXPECT_LT(error_vs_float64(w, y, ldy, x, n, ldx), n <= 8       ? 1e-5
                                                        : skinny_mma ? 2e-3
                                                                     : 1e-2)
          << "W" << c.bits << " g" << c.group << " n=" << n;
      for (int i = 0; i < n; ++i)
        for (int64_t r = c.rows; r < ldy; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + r]));
    }
  }
}

// The kernels in front of a decode product that write its Q8 input themselves: the block's
// pre-norm (add_rms_norm_matmul: x_out = x + residual, norm quantized per 32 columns) and
// SwiGLU (swiglu_matmul), against float64 over that rounding of the float64 norm / SwiGLU (a
// last-bit difference can move a rare value across a rounding edge: 1e-3). Act-order weights
// read x through their permutation and keep the separate quantize launch; 9 rows go to the
// tensor cores. x_out must be exactly x + residual; outputs poisoned first.
TEST(CudaWeightQuant, NormAndSwigluWriteTheQ8InputOfTheProduct) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(43);
  const float eps = 1e-5f;
  struct Case {
    int bits;
    int64_t rows, cols, group;
    bool asym, act_order;
  };
  for (const Case& c :
       {Case{4, 70, 576, 64, false, false}, Case{8, 33, 200, 200, true, false}, Case{4, 40, 320, 32, true, true}}) {
    GqWeight w = make_gq(c.bits, c.rows, c.cols, c.group, c.asym, c.act_order, rng);
    auto dev = gpu->upload(w.m.data.get(), static_cast<size_t>(w.host.bytes()));
    WeightMatrix wm = w.host;
    wm.data = dev.get();
    const int64_t dim = c.cols, ldy = c.rows + 3;
    for (int n : {1, 3, 8, 9}) {
      const std::string what = "W" + std::to_string(c.bits) + " g" + std::to_string(c.group) +
                               (c.act_order ? " act-order" : "") + " n=" + std::to_string(n);
      const double tol = n <= 8 ? 1e-3 : 1e-2;
      auto check = [&](const std::vector<float>& y, const std::vector<float>& xin) {
        return error_vs_float64(w, y, ldy, xin, n, dim);
      };
      {  // the pre-norm
        auto x = randn(n * dim, rng), res = randn(n * dim, rng), g = randn(dim, rng);
        DeviceVec<float> dx(*gpu, x), dres(*gpu, res), dg(*gpu, g);
        DeviceVec<float> dxo(*gpu, std::vector<float>(n * dim, NAN)), dxn(*gpu, n * dim);
        DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
        const MatmulTarget tg{wm, dy.get(), ldy};
        gpu->add_rms_norm_matmul(dx.get(), dres.get(), dg.get(), dxo.get(), dxn.get(), n, static_cast<int>(dim), eps,
                                 std::span(&tg, 1));
        const auto xo = dxo.read(), y = dy.read();
        std::vector<float> xn(n * dim);
        for (int i = 0; i < n; ++i) {
          double ss = 0;
          for (int64_t k = 0; k < dim; ++k) {
            ASSERT_EQ(xo[i * dim + k], x[i * dim + k] + res[i * dim + k]) << what << " x_out " << i << "," << k;
            ss += double(xo[i * dim + k]) * xo[i * dim + k];
          }
          const double inv = 1.0 / std::sqrt(ss / dim + eps);
          for (int64_t k = 0; k < dim; ++k) xn[i * dim + k] = static_cast<float>(xo[i * dim + k] * inv * g[k]);
        }
        EXPECT_LT(check(y, xn), tol) << what << " add_rms_norm_matmul";
        for (int i = 0; i < n; ++i)
          for (int64_t r = c.rows; r < ldy; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + r])) << what << " gap written";
      }
      {  // SwiGLU, gate and up side by side in rows of 2 * dim + 5
        const int64_t ld_in = 2 * dim + 5;
        auto gu = randn(n * ld_in, rng, 2.0f);
        DeviceVec<float> dgu(*gpu, gu), dh(*gpu, n * dim);
        DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
        const MatmulTarget tg{wm, dy.get(), ldy};
        gpu->swiglu_matmul(dgu.get(), dgu.get() + dim, ld_in, dh.get(), n, static_cast<int>(dim), std::span(&tg, 1));
        std::vector<float> h(n * dim);
        for (int i = 0; i < n; ++i)
          for (int64_t k = 0; k < dim; ++k) {
            const double a = gu[i * ld_in + k], b = gu[i * ld_in + dim + k];
            h[i * dim + k] = static_cast<float>(a / (1 + std::exp(-a)) * b);
          }
        EXPECT_LT(check(dy.read(), h), tol) << what << " swiglu_matmul";
      }
    }
  }
}

TEST(CudaWeightQuant, QuantizedCheckpointMatchesTheCpuBackend) {
  TESSERA_REQUIRE_CUDA();
  const std::vector<int32_t> toks = {3, 17, 0, 47, 5, 5, 9, 21, 30, 1, 2, 3};  // > 8 rows, then decode
  for (const char* variant : {"gptq_w4_g32_asym_actorder", "awq_w4_g32", "ct_w8_channel"}) {
    auto quantized = load_safetensors_weights(std::string(TESSERA_FIXTURES_DIR) + "/wquant/" + variant);
    // The CPU reference runs the decoded f32 weights: the CPU's own W4G/W8G path rounds the
    // activations to int8 (2-4% here), which would hide a GPU error of that size.
    auto reference = testing_util::dequantized_copy(*quantized);
    std::vector<std::vector<float>> out;
    for (const char* device : {"cpu", "cuda"}) {
      auto be = make_backend(BackendOptions{device, 2});
      auto w =
          make_resident(std::string(device) == "cpu" ? std::shared_ptr<const ModelWeights>(reference) : quantized, *be);
      const ModelConfig& c = w->config;
      auto model = create_model(w, *be, 16, 16);
      KvCache kv(*be, KvCacheSpec::plain(c.n_layer, c.n_head_kv, c.head_dim, 4, 8, DType::F32));
      BlockPool pool(8);
      SequenceBlocks seq;
      ASSERT_TRUE(seq.reserve(pool, 4, static_cast<int>(toks.size())));
      ForwardBatch prefill;
      prefill.add_sequence(seq, 4, toks.data(), 10, ForwardBatch::Logits::All);
      std::vector<float> logits(toks.size() * c.n_vocab, NAN);
      ModelRunner runner(*model, kv, *be);
      runner.forward(prefill, logits.data());
      seq.n_tokens += 10;
      for (size_t i = 10; i < toks.size(); ++i) {  // decode rows: the gemv path
        ForwardBatch step;
        step.add_sequence(seq, 4, toks.data() + i, 1, ForwardBatch::Logits::All);
        runner.forward(step, logits.data() + i * c.n_vocab);
        seq.n_tokens += 1;
      }
      seq.release_all(pool);
      out.push_back(logits);
    }
    // bf16 weights and activations, the bound CudaModel's bf16 parity uses; a zero point off
    // by one moves these logits by 6% (8 bits, per channel) to over 100% (4 bits).
    const double err = rel_err(out[1], out[0]);
    std::printf("[parity] %s: logits rel err %.3g against the f32 dequantized model\n", variant, err);
    EXPECT_LT(err, 2e-2) << variant;
  }
}
