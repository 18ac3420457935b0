// Group-quantized weights (W4G/W8G) on the CUDA backend: the bf16 decode against the CPU
// reference decoder, matmul at decode and prefill row counts against float64, and a quantized
// checkpoint (tests/fixtures/wquant) giving the logits of the CPU backend running the same
// model with its weights decoded to f32. Skips without a GPU.
#include <cstdio>
#include <numeric>

#include "core/fp16.h"
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

}  // namespace

TEST(CudaWeightQuant, MatmulMatchesFloat64AtDecodeAndPrefillRows) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(41);
  struct Case {
    int bits;
    int64_t rows, cols, group;
    bool asym, act_order;
  };
  for (const Case& c : {Case{4, 37, 96, 32, false, false}, Case{4, 131, 200, 64, true, true},
                        Case{8, 40, 320, 128, true, false}, Case{8, 9, 200, 200, false, true}}) {
    GqWeight w = make_gq(c.bits, c.rows, c.cols, c.group, c.asym, c.act_order, rng);
    auto dev = gpu->upload(w.m.data.get(), static_cast<size_t>(w.host.bytes()));
    WeightMatrix wm = w.host;
    wm.data = dev.get();
    for (int n : {1, 5, 77}) {
      const int64_t ldx = c.cols + 5, ldy = c.rows + 3;
      auto x = randn(n * ldx, rng);
      DeviceVec<float> dx(*gpu, x);
      DeviceVec<float> dy(*gpu, std::vector<float>(n * ldy, NAN));
      const MatmulTarget tg{wm, dy.get(), ldy};
      gpu->matmul(dx.get(), n, ldx, std::span(&tg, 1));
      const auto y = dy.read();
      std::vector<double> ref;
      std::vector<float> got;
      for (int i = 0; i < n; ++i)
        for (int64_t r = 0; r < c.rows; ++r) {
          double acc = 0;
          for (int64_t k = 0; k < c.cols; ++k) acc += double(x[i * ldx + k]) * w.decoded[r * c.cols + k];
          ref.push_back(acc);
          got.push_back(y[i * ldy + r]);
        }
      // Decoded weights and activations rounded to bf16 for the tensor cores.
      EXPECT_LT(rel_err(got, ref), 1e-2) << "W" << c.bits << " g" << c.group << " n=" << n;
      for (int i = 0; i < n; ++i)
        for (int64_t r = c.rows; r < ldy; ++r) EXPECT_TRUE(std::isnan(y[i * ldy + r]));
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
