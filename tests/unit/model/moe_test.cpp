// Mixture-of-experts pieces apart from the llama.cpp parity (arch_parity_test.cpp): the CPU
// moe_ffn against a float64 reference with and without renormalised weights (Qwen3-MoE's
// norm_topk_prob false keeps the softmax weights), its refusal of a bad router, the real-shape
// presets' parameter counts against the published model cards, and quantization at load
// covering the experts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "model/dummy.h"
#include "model/quantize_weights.h"
#include "model/weights.h"
#include "unit/model/moe_reference.h"

using namespace tessera;

using testing_util::moe_reference;

TEST(MoeFfn, CpuMatchesFloat64WithAndWithoutRenormalisation) {
  constexpr int kDim = 48, kFf = 40, kExp = 6, kUsed = 2, kRows = 7;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 0.4f);
  auto randv = [&](size_t n) {
    std::vector<float> v(n);
    for (float& f : v) f = nd(rng);
    return v;
  };
  const std::vector<float> router = randv(kExp * kDim), x = randv(kRows * kDim);
  std::vector<std::vector<float>> gate, up, down;
  std::vector<WeightMatrix> g, u, d;
  for (int e = 0; e < kExp; ++e) {
    gate.push_back(randv(kFf * kDim));
    up.push_back(randv(kFf * kDim));
    down.push_back(randv(kDim * kFf));
  }
  for (int e = 0; e < kExp; ++e) {
    g.push_back(WeightMatrix{gate[e].data(), DType::F32, kFf, kDim});
    u.push_back(WeightMatrix{up[e].data(), DType::F32, kFf, kDim});
    d.push_back(WeightMatrix{down[e].data(), DType::F32, kDim, kFf});
  }
  CpuBackend be(2);
  for (const bool renorm : {true, false}) {
    const MoeFfnWeights moe{
        WeightMatrix{router.data(), DType::F32, kExp, kDim}, g.data(), u.data(), d.data(), kExp, kUsed, kFf, renorm};
    std::vector<float> out(kRows * kDim, NAN);
    be.moe_ffn(x.data(), kRows, kDim, moe, out.data());
    double num = 0, den = 0;
    for (int r = 0; r < kRows; ++r) {
      const std::vector<float> xr(x.begin() + r * kDim, x.begin() + (r + 1) * kDim);
      const auto ref = moe_reference(xr, kDim, kFf, kExp, kUsed, renorm, router, gate, up, down);
      for (int c = 0; c < kDim; ++c) {
        num += (out[r * kDim + c] - ref[c]) * (out[r * kDim + c] - ref[c]);
        den += ref[c] * ref[c];
      }
    }
    EXPECT_LT(std::sqrt(num / den), 1e-5) << "renormalize " << renorm;
  }
  // A router of the wrong shape is refused, naming it.
  const MoeFfnWeights bad{
      WeightMatrix{router.data(), DType::F32, kExp - 1, kDim}, g.data(), u.data(), d.data(), kExp, kUsed, kFf, true};
  std::vector<float> out(kDim);
  try {
    be.moe_ffn(x.data(), 1, kDim, bad, out.data());
    ADD_FAILURE() << "accepted a 5-row router for 6 experts";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("router"), std::string::npos) << e.what();
  }
}

// Published totals: Qwen3-30B-A3B 30.5B parameters, 3.3B activated; Mixtral-8x7B 46.7B, 12.9B
// per token.
TEST(MoePresets, ParameterCountsMatchTheModelCards) {
  const ModelConfig q = dummy_preset("qwen3-30b-a3b"), m = dummy_preset("mixtral-8x7b");
  EXPECT_NEAR(q.n_params() / 1e9, 30.5, 0.05);
  EXPECT_NEAR(q.n_active_params() / 1e9, 3.3, 0.06);
  EXPECT_NEAR(m.n_params() / 1e9, 46.7, 0.05);
  EXPECT_NEAR(m.n_active_params() / 1e9, 12.9, 0.05);
}

TEST(MoePresets, QuantizationAtLoadCoversTheExperts) {
  auto w = make_dummy_weights("qwen3moe-tiny:f32", 1);
  WeightQuantSpec spec;
  ASSERT_TRUE(parse_weight_quant_spec("w8g32", &spec));
  quantize_linear_weights(*w, spec);
  for (const LayerWeights& l : w->layers) {
    EXPECT_EQ(l.router.dtype, DType::F32);  // kept as stored, as llama-quantize does
    for (const auto* group : {&l.gate_exps, &l.up_exps, &l.down_exps})
      for (const WeightMatrix& e : *group) EXPECT_EQ(e.dtype, DType::W8G);
  }
}

// A Hugging Face MoE config asking for what the loader does not build is refused, naming it.
TEST(MoeCheckpoints, UnsupportedQwenMoeLayoutsAreRefused) {
  namespace fs = std::filesystem;
  const fs::path src = fs::path(TESSERA_FIXTURES_DIR) / "arch" / "qwen3moe_hf";
  const fs::path dir = fs::temp_directory_path() / ("tessera_moe_" + std::to_string(::getpid()));
  for (const auto& [field, value] : std::vector<std::pair<std::string, nlohmann::json>>{
           {"decoder_sparse_step", 2}, {"mlp_only_layers", {0}}, {"shared_expert_intermediate_size", 64}}) {
    fs::create_directories(dir);
    fs::copy_file(src / "model.safetensors", dir / "model.safetensors", fs::copy_options::overwrite_existing);
    std::ifstream in(src / "config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    cfg[field] = value;
    std::ofstream(dir / "config.json") << cfg.dump();
    try {
      load_safetensors_weights(dir.string());
      ADD_FAILURE() << field << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not supported"), std::string::npos) << e.what();
    }
  }
  EXPECT_NO_THROW(load_safetensors_weights(src.string()));
  fs::remove_all(dir);
}
