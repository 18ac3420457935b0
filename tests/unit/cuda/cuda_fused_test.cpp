// The CUDA backend's fused paths against float64: matmul targets that sit back to back
// (weights in one allocation, outputs side by side in one row — the model's Q|K|V and
// gate|up layout, run as one product), the bulk matrix-vector kernel at one row (widths
// that are not a multiple of its 2,048-column sweep, several targets), and swiglu_matmul
// (SwiGLU fed into the product: the bulk kernel at one row, the default path at 2..8 rows,
// 16-bit activations straight into cuBLASLt beyond). Outputs are poisoned (NaN) first.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/fp16.h"
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

JoinedWeights make_joined(Backend& gpu, DType type, const std::vector<int64_t>& rows, int64_t cols, std::mt19937& rng) {
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

// Tolerance by path. One row of 16-bit weights: f32 products on the matrix-vector kernel;
// from 2 rows the GEMM (activations rounded to their type). Block-quantized weights (Q4_0,
// Q8_0) up to 8 rows: the integer kernels round x to int8 per 32 columns (dp4a), ~5e-3
// (CudaWeightQuant checks them exactly against float64 on that rounding); past 8 rows the
// weights are decoded to bf16 for the GEMM.
double tolerance(DType type, int n) {
  const bool plain16 = type == DType::F16 || type == DType::BF16;
  if (plain16) return n == 1 ? 2e-5 : type == DType::F16 ? 2e-3 : 1e-2;
  return 1.5e-2;
}

// Runs the joined targets' product on n rows of x (outputs side by side in rows of width
// ldy = their rows + 3, poisoned with NaN) and returns the relative error against float64
// over input values passed through `input` (the rounding the path applies, or none); checks
// that the gap past the outputs is never written.
template <typename Input>
double joined_product_error(Backend& gpu, const JoinedWeights& w, const std::vector<int64_t>& rows, int64_t cols, int n,
                            std::mt19937& rng, Input input) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  const int64_t ldy = total + 3;
  auto x = randn(n * cols, rng);
  DeviceVec<float> dx(gpu, x), dy(gpu, std::vector<float>(n * ldy, NAN));
  std::vector<MatmulTarget> targets;
  int64_t off = 0;
  for (size_t t = 0; t < rows.size(); ++t) {
    targets.push_back({w.parts[t], dy.get() + off, ldy});
    off += rows[t];
  }
  gpu.matmul(dx.get(), n, cols, targets);
  const auto y = dy.read();
  std::vector<double> ref;
  std::vector<float> got;
  for (int i = 0; i < n; ++i) {
    off = 0;
    for (size_t t = 0; t < rows.size(); ++t) {
      for (int64_t r = 0; r < rows[t]; ++r) {
        double acc = 0;
        for (int64_t k = 0; k < cols; ++k) acc += double(input(x[i * cols + k])) * w.decoded[t][r * cols + k];
        ref.push_back(acc);
        got.push_back(y[i * ldy + off + r]);
      }
      off += rows[t];
    }
    for (int64_t r = off; r < ldy; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + r])) << "gap written";
  }
  return rel_err(got, ref);
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
    JoinedWeights w = make_joined(*gpu, type, rows, cols, rng);  // outputs side by side, then a gap
    for (int n : {1, 3, 33}) {
      EXPECT_LT(joined_product_error(*gpu, w, rows, cols, n, rng, [](float v) { return v; }), tolerance(type, n))
          << dtype_name(type) << " n=" << n;
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

namespace {

float f16_to_f32(uint16_t h) { return tessera::fp16_to_f32(h); }

// Row i of the pre-norm in float64, x_out / rms(x_out) * g, after checking that x_out holds
// x + residual exactly; empty when it does not.
std::vector<double> reference_norm_row(const std::vector<float>& xo, const std::vector<float>& x,
                                       const std::vector<float>& res, const std::vector<float>& g, int i, int64_t dim,
                                       float eps) {
  double ss = 0;
  for (int64_t k = 0; k < dim; ++k) {
    const int64_t e = i * dim + k;
    EXPECT_EQ(xo[e], x[e] + res[e]) << "x_out " << i << "," << k;
    if (xo[e] != x[e] + res[e]) return {};
    ss += double(xo[e]) * xo[e];
  }
  const double inv = 1.0 / std::sqrt(ss / dim + eps);
  std::vector<double> xn(dim);
  for (int64_t k = 0; k < dim; ++k) xn[k] = xo[i * dim + k] * inv * g[k];
  return xn;
}

}  // namespace

// rope_kv_store in one launch against the separate rope and kv_store ops on the same device
// (which tests/unit/cuda/cuda_ops_test.cpp and cuda_attention_test.cpp check against float64
// and the CPU): the Q|K|V layout and separate buffers, normal and neox pairs, a partial
// rotation, f16 and f32 caches, 1 and 37 rows. Slots not written must keep their poison.
TEST(CudaFused, RopeAndKvStoreInOneLaunchMatchTheSeparateOps) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(24);
  struct Variant {
    bool neox;
    int rot_dim;
    bool joined;
    DType kv;
  };
  const int hd = 64, n_q = 6, n_kv = 2, bs = 7, n_blocks = 20;
  for (Variant vt : {Variant{false, 64, true, DType::F16}, Variant{true, 64, true, DType::F32},
                     Variant{true, 32, false, DType::F16}, Variant{false, 48, false, DType::F32}})
    for (int n : {1, 37}) {
      RopeConfig cfg;
      cfg.head_dim = hd;
      cfg.rot_dim = vt.rot_dim;
      cfg.neox = vt.neox;
      cfg.freq_base = 500000.0f;
      const int64_t qd = n_q * hd, kd = n_kv * hd;
      const int64_t ldq = vt.joined ? qd + 2 * kd : qd + 3, ldk = vt.joined ? ldq : kd + 5;
      // n rows at random positions, written to distinct random slots of the cache.
      HostBatch hb;
      std::vector<int32_t> all_slots(n_blocks * bs);
      std::iota(all_slots.begin(), all_slots.end(), 0);
      std::shuffle(all_slots.begin(), all_slots.end(), rng);
      for (int r = 0; r < n; ++r) {
        hb.positions.push_back(static_cast<int32_t>(rng() % 5000));
        hb.slots.push_back(all_slots[r]);
      }
      hb.q_start = {0, n};
      hb.kv_len = {n};
      hb.tables.resize(n_blocks);
      std::iota(hb.tables.begin(), hb.tables.end(), 0);
      hb.max_blocks = n_blocks;
      const AttentionBatch b = hb.device_view(*gpu);
      const int32_t* pos = b.positions;  // device
      // Two copies of the inputs and of a poisoned cache: one for each path.
      const int64_t q_elems = n * ldq, k_elems = vt.joined ? 0 : n * ldk;
      // Separate buffers: K's rows, then V's rows (of the same stride) after them.
      auto qin = randn(q_elems, rng), kin = randn(std::max<int64_t>(2 * k_elems, 1), rng);
      const size_t elem = vt.kv == DType::F16 ? 2 : 4;
      const size_t cache_bytes = static_cast<size_t>(n_blocks) * n_kv * bs * hd * elem;
      std::vector<uint8_t> poison(cache_bytes, 0x7c);  // f16 0x7c7c is a NaN, f32 likewise
      struct Path {
        std::unique_ptr<DeviceVec<float>> q, k;
        std::unique_ptr<DeviceVec<uint8_t>> kc, vc;
      } path[2];
      for (Path& p : path) {
        p.q = std::make_unique<DeviceVec<float>>(*gpu, qin);
        p.k = std::make_unique<DeviceVec<float>>(*gpu, kin);
        p.kc = std::make_unique<DeviceVec<uint8_t>>(*gpu, poison);
        p.vc = std::make_unique<DeviceVec<uint8_t>>(*gpu, poison);
      }
      auto view = [&](Path& p) { return plain_kv_view(p.kc->get(), p.vc->get(), vt.kv, n_blocks, bs, n_kv, hd); };
      auto kptr = [&](Path& p) { return vt.joined ? p.q->get() + qd : p.k->get(); };
      auto vptr = [&](Path& p) { return vt.joined ? p.q->get() + qd + kd : p.k->get() + k_elems; };
      const int64_t ldv = vt.joined ? ldq : ldk;
      gpu->rope_kv_store(path[0].q->get(), ldq, n_q, kptr(path[0]), ldk, vptr(path[0]), ldv, view(path[0]), b, cfg);
      gpu->rope(path[1].q->get(), n, ldq, n_q, pos, cfg);
      gpu->rope(kptr(path[1]), n, ldk, n_kv, pos, cfg);
      gpu->kv_store(view(path[1]), kptr(path[1]), ldk, vptr(path[1]), ldv, b);
      const auto q0 = path[0].q->read(), q1 = path[1].q->read();
      for (int64_t i = 0; i < q_elems; ++i)
        ASSERT_NEAR(q0[i], q1[i], 1e-6f * (1.0f + std::fabs(q1[i]))) << "q " << i << " n=" << n;
      if (!vt.joined) {
        const auto k0 = path[0].k->read(), k1 = path[1].k->read();
        for (int64_t i = 0; i < k_elems; ++i) ASSERT_NEAR(k0[i], k1[i], 1e-6f * (1.0f + std::fabs(k1[i])));
      }
      for (int which = 0; which < 2; ++which) {
        const auto c0 = (which ? path[0].vc : path[0].kc)->read(), c1 = (which ? path[1].vc : path[1].kc)->read();
        for (size_t e = 0; e < cache_bytes / elem; ++e) {
          float a, bb;
          if (elem == 2) {
            uint16_t ha, hb;
            std::memcpy(&ha, c0.data() + e * 2, 2);
            std::memcpy(&hb, c1.data() + e * 2, 2);
            if (hb == 0x7c7c) {  // not written by the separate ops: not by the fused one either
              ASSERT_EQ(ha, 0x7c7c) << "slot element " << e;
              continue;
            }
            a = f16_to_f32(ha);
            bb = f16_to_f32(hb);
          } else {
            uint32_t ua, ub;
            std::memcpy(&ua, c0.data() + e * 4, 4);
            std::memcpy(&ub, c1.data() + e * 4, 4);
            if (ub == 0x7c7c7c7cu) {
              ASSERT_EQ(ua, 0x7c7c7c7cu) << "slot element " << e;
              continue;
            }
            std::memcpy(&a, &ua, 4);
            std::memcpy(&bb, &ub, 4);
          }
          // f16: one rounding step apart at most (the rotation may differ in its last f32 bit).
          ASSERT_NEAR(a, bb, (elem == 2 ? 1e-3f : 1e-6f) * (1.0f + std::fabs(bb)))
              << (which ? "V" : "K") << " element " << e << " n=" << n;
        }
      }
    }
}

// Bad input to the fused ops: a clear error naming the problem, and the backend still works.
TEST(CudaFused, BadInputIsRefusedWithAClearError) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(26);
  JoinedWeights w = make_joined(*gpu, DType::BF16, {16}, 256, rng);
  DeviceVec<float> gu(*gpu, randn(2 * 512, rng)), h(*gpu, 512), y(*gpu, 16);
  const MatmulTarget t[] = {{w.parts[0], y.get(), 16}};
  // SwiGLU of width 512 into a product of width 256.
  try {
    gpu->swiglu_matmul(gu.get(), gu.get() + 512, 1024, h.get(), 1, 512, t);
    FAIL() << "a target of another width was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("target width 256 is not 512"), std::string::npos) << e.what();
  }
  // More targets than a matmul takes.
  std::vector<MatmulTarget> many(9, t[0]);
  try {
    gpu->matmul(gu.get(), 1, 256, many);
    FAIL() << "9 targets were accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("9 targets"), std::string::npos) << e.what();
  }
  // The backend carries on: a good product after the refusals.
  const auto x = randn(256, rng);
  DeviceVec<float> dx(*gpu, x);
  gpu->matmul(dx.get(), 1, 256, t);
  const auto got = y.read();
  for (int r = 0; r < 16; ++r) {
    double acc = 0;
    for (int k = 0; k < 256; ++k) acc += double(x[k]) * w.decoded[0][r * 256 + k];
    EXPECT_NEAR(got[r], acc, 1e-4 * (1 + std::fabs(acc)));
  }
}

// add_rms_norm_matmul: x_out = x + residual (exact, f32), y = W · rms_norm(x_out) · w, against
// float64: the bulk kernel forming the norm in every block at one row (16-bit weights), the
// f32 norm then the product (quantized weights, 2..8 rows, f32 weights), the norm straight into
// the GEMM's 16-bit input (33 rows); widths a multiple of 4 (16-byte rows) and not. x and
// residual must be left as they were.
TEST(CudaFused, AddRmsNormMatmulMatchesFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(25);
  const float eps = 1e-5f;
  for (DType type : {DType::BF16, DType::F16, DType::Q8_0, DType::F32})
    for (int64_t dim : {int64_t{4096}, int64_t{2080}, int64_t{576}, int64_t{1022}}) {
      // 1,022: the norm kernel's scalar path (rows not 16-byte multiples), through the GEMM
      // alone (matrix-vector products take widths that are multiples of 8; Q8_0 of 32).
      if (dim % 4 != 0 && type == DType::Q8_0) continue;
      const std::vector<int64_t> rows = {40, 24, 24};  // Q|K|V-like targets back to back
      JoinedWeights wts = make_joined(*gpu, type, rows, dim, rng);
      const int64_t ldy = 40 + 24 + 24;
      for (int n : {1, 3, 33}) {
        if (dim % 8 != 0 && n <= 8) continue;
        auto x = randn(n * dim, rng), res = randn(n * dim, rng), g = randn(dim, rng);
        DeviceVec<float> dx(*gpu, x), dres(*gpu, res), dg(*gpu, g);
        DeviceVec<float> dxo(*gpu, std::vector<float>(n * dim, NAN)), dxn(*gpu, n * dim);
        DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
        std::vector<MatmulTarget> targets;
        int64_t off = 0;
        for (size_t t = 0; t < rows.size(); ++t) {
          targets.push_back({wts.parts[t], dy.get() + off, ldy});
          off += rows[t];
        }
        gpu->add_rms_norm_matmul(dx.get(), dres.get(), dg.get(), dxo.get(), dxn.get(), n, static_cast<int>(dim), eps,
                                 targets);
        const auto xo = dxo.read(), y = dy.read();
        EXPECT_EQ(dx.read(), x);
        EXPECT_EQ(dres.read(), res);
        std::vector<double> ref;
        std::vector<float> got;
        for (int i = 0; i < n; ++i) {
          const std::vector<double> xn = reference_norm_row(xo, x, res, g, i, dim, eps);
          ASSERT_EQ(xn.size(), static_cast<size_t>(dim));
          off = 0;
          for (size_t t = 0; t < rows.size(); ++t) {
            for (int64_t r = 0; r < rows[t]; ++r) {
              double acc = 0;
              for (int64_t k = 0; k < dim; ++k) acc += xn[k] * wts.decoded[t][r * dim + k];
              ref.push_back(acc);
              got.push_back(y[i * ldy + off + r]);
            }
            off += rows[t];
          }
        }
        const double tol = type == DType::F32 ? 2e-5 : tolerance(type, n);
        EXPECT_LT(rel_err(got, ref), tol) << dtype_name(type) << " dim " << dim << " n=" << n;
      }
    }
}

// add_rms_norm_swiglu_ffn against float64: at one row with 16-bit weights the gate|up
// product pairs a row of each in every chunk and writes silu(gate) * up itself (n_ff 4,096
// and 1,536: two and one row of each per chunk); 520 rows are too few to pair (the product,
// then swiglu); 3 rows and the other types take the default path. x_out, gate, up and the
// down product are all checked.
TEST(CudaFused, AddRmsNormSwigluFfnMatchesFloat64) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(27);
  const float eps = 1e-5f;
  for (DType type : {DType::BF16, DType::F16, DType::Q8_0, DType::F32})
    for (int64_t n_ff : {int64_t{4096}, int64_t{1536}, int64_t{520}}) {
      if (type == DType::Q8_0 && n_ff % 32 != 0) continue;
      const int64_t dim = 576;
      JoinedWeights gu = make_joined(*gpu, type, {n_ff, n_ff}, dim, rng);  // gate | up, one allocation
      JoinedWeights dn = make_joined(*gpu, type, {dim}, n_ff, rng);
      for (int n : {1, 3}) {
        auto x = randn(n * dim, rng), res = randn(n * dim, rng), g = randn(dim, rng);
        DeviceVec<float> dx(*gpu, x), dres(*gpu, res), dg(*gpu, g);
        DeviceVec<float> dxo(*gpu, std::vector<float>(n * dim, NAN)), dxn(*gpu, n * dim), dh(*gpu, n * n_ff);
        DeviceVec<float> dgu(*gpu, std::vector<float>(n * 2 * n_ff, NAN));
        DeviceVec<float> dy(*gpu, std::vector<float>(n * dim, NAN));
        gpu->add_rms_norm_swiglu_ffn(dx.get(), dres.get(), dg.get(), dxo.get(), dxn.get(), n, static_cast<int>(dim),
                                     eps, {gu.parts[0], dgu.get(), 2 * n_ff}, {gu.parts[1], dgu.get() + n_ff, 2 * n_ff},
                                     dh.get(), {dn.parts[0], dy.get(), dim});
        const auto xo = dxo.read(), gate_up = dgu.read(), y = dy.read();
        std::vector<double> ref_gu, ref_y;
        std::vector<float> got_gu;
        for (int i = 0; i < n; ++i) {
          const std::vector<double> xn = reference_norm_row(xo, x, res, g, i, dim, eps);
          ASSERT_EQ(xn.size(), static_cast<size_t>(dim));
          std::vector<double> act(n_ff);
          for (int64_t r = 0; r < n_ff; ++r) {
            double a = 0, b = 0;
            for (int64_t k = 0; k < dim; ++k) {
              a += xn[k] * gu.decoded[0][r * dim + k];
              b += xn[k] * gu.decoded[1][r * dim + k];
            }
            ref_gu.push_back(a);
            ref_gu.push_back(b);
            got_gu.push_back(gate_up[i * 2 * n_ff + r]);
            got_gu.push_back(gate_up[i * 2 * n_ff + n_ff + r]);
            act[r] = a / (1 + std::exp(-a)) * b;
          }
          for (int64_t d = 0; d < dim; ++d) {
            double acc = 0;
            for (int64_t k = 0; k < n_ff; ++k) acc += act[k] * dn.decoded[0][d * n_ff + k];
            ref_y.push_back(acc);
          }
        }
        const double tol = type == DType::F32 ? 2e-5 : tolerance(type, n);
        EXPECT_LT(rel_err(got_gu, ref_gu), tol) << dtype_name(type) << " n_ff " << n_ff << " n=" << n << " gate|up";
        EXPECT_LT(rel_err(y, ref_y), 2 * tol) << dtype_name(type) << " n_ff " << n_ff << " n=" << n << " down";
      }
    }
}

// 2–8 rows of 16-bit weights (cuBLASLt on the input rounded once to the weights' type, f32
// accumulation) against float64 on that rounding: widths of 576, 1,056, 4,128 and 8,224
// (not multiples of the GEMM's tiles), targets whose rows are not multiples of 16 (40, 24,
// 1,007), several targets writing side by side with a gap, every row count 2..8. Outputs are
// poisoned first: the gap stays NaN.
TEST(CudaFused, SmallBatch16BitProductsMatchFloat64OnTheRoundedInput) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(44);
  for (DType type : {DType::BF16, DType::F16}) {
    const auto round16 = [&](float v) {
      return type == DType::BF16 ? bf16_to_f32(f32_to_bf16(v)) : fp16_to_f32(f32_to_fp16(v));
    };
    for (int64_t cols : {576, 1056, 4128, 8224}) {
      for (const std::vector<int64_t>& rows : {std::vector<int64_t>{40, 24, 24}, std::vector<int64_t>{1007}}) {
        JoinedWeights w = make_joined(*gpu, type, rows, cols, rng);
        for (int n = 2; n <= 8; ++n)
          EXPECT_LT(joined_product_error(*gpu, w, rows, cols, n, rng, round16), 2e-5)
              << dtype_name(type) << " cols=" << cols << " rows=" << rows.size() << " n=" << n;
      }
    }
  }
}
