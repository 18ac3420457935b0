// FP8 checkpoints written by an independent writer (tools/fixtures/make_fp8_checkpoint_fixtures.py:
// numpy + safetensors, its own E4M3 encoder and value table): quant_method "fp8" (vLLM /
// AutoFP8) with per-tensor and per-row scales, compressed-tensors float-quantized with channel
// (bf16 [N, 1]) and tensor scales. They load into FP8W with exactly the writer's codes, scales
// and values; the tiny model gives the logits of the same model with the weights decoded to
// f32; the KV scales they carry are read; the variants tessera does not support are refused
// naming the field or the tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "dequantized_weights.h"
#include "format/safetensors.h"
#include "model/model.h"
#include "model/quant_config.h"
#include "quant/fp8_weight.h"
#include "quantized_model_util.h"

using namespace tessera;
using namespace tessera::testing_util;

namespace {

const char* const kFp8Variants[] = {"fp8_tensor_static", "fp8_channel_dynamic", "ct_fp8_channel_dynamic",
                                    "ct_fp8_tensor_static"};

::testing::AssertionResult has(const std::string& msg, const std::string& part) {
  return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                             : ::testing::AssertionFailure() << "'" << msg << "' lacks " << part;
}

std::string config_error(const std::string& qcfg) {
  try {
    parse_weight_quant_config("{\"quantization_config\": " + qcfg + "}", "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A copy of a fixture with its config.json's quantization_config and/or model.safetensors
// bytes edited; returns the error loading it gives ("" when it loads).
// Renames tensors in a safetensors image (the header rewritten, the data as it was).
void rename_tensors(std::string& bytes, const std::map<std::string, std::string>& names) {
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  nlohmann::json header = nlohmann::json::parse(bytes.substr(8, n));
  for (const auto& [from, to] : names) {
    ASSERT_TRUE(header.contains(from)) << from;
    header[to] = header[from];
    header.erase(from);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t m = text.size();
  bytes = std::string(reinterpret_cast<const char*>(&m), 8) + text + bytes.substr(8 + n);
}

std::string load_error_of_edited(const std::string& variant, const std::function<void(nlohmann::json&)>& edit_config,
                                 const std::function<void(std::string&)>& edit_bytes = nullptr) {
  const std::string src = wquant_fixture(variant);
  const std::string dir = ::testing::TempDir() + "/tessera_fp8_edited";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ifstream in(src + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  edit_config(cfg);
  std::ofstream(dir + "/config.json") << cfg.dump();
  std::ifstream st(src + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(st)), std::istreambuf_iterator<char>());
  if (edit_bytes) edit_bytes(bytes);
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << bytes;
  std::string err;
  try {
    load_safetensors_weights(dir);
  } catch (const Error& e) {
    err = e.what();
  }
  std::filesystem::remove_all(dir);
  return err;
}

}  // namespace

// Codes byte for byte, the f32 scale of every row, and each decoded value equal to the
// writer's e4m3 value times its scale (one f32 product).
TEST(Fp8CheckpointLoader, WeightsDecodeToTheWritersValues) {
  for (const char* variant : kFp8Variants) {
    SCOPED_TRACE(variant);
    auto w = load_safetensors_weights(wquant_fixture(variant));
    auto ckpt = SafetensorsFile::open(wquant_fixture(variant) + "/model.safetensors");
    auto expected = SafetensorsFile::open(wquant_fixture(variant) + "/expected.safetensors");
    const SafetensorsTensor& table = *expected->find_tensor("e4m3_values");
    int fp8_layers = 0;
    for (const auto& [prefix, m] : hf_linears(*w)) {
      SCOPED_TRACE(prefix);
      const SafetensorsTensor* scales = expected->find_tensor(prefix + ".scales");
      if (!scales) {  // in ignored_layers: stored and loaded in f16
        EXPECT_EQ(m.dtype, DType::F16);
        continue;
      }
      ASSERT_EQ(m.dtype, DType::FP8W);
      const SafetensorsTensor& codes = *ckpt->find_tensor(prefix + ".weight");
      ASSERT_EQ(codes.shape, (std::vector<int64_t>{m.rows, m.cols}));
      const Fp8WeightLayout l = m.fp8_layout();
      const auto* buf = static_cast<const uint8_t*>(m.data);
      std::vector<float> row(m.cols);
      for (int64_t r = 0; r < m.rows; ++r) {
        const float s = tensor_at<float>(*scales, r);
        ASSERT_EQ(m.fp8_scales()[r], s) << r;
        fp8_dequantize_row(l, buf, r, row.data());
        for (int64_t k = 0; k < m.cols; ++k) {
          const uint8_t code = codes.data[r * m.cols + k];
          ASSERT_EQ(buf[r * l.row_bytes + k], code) << r << "," << k;
          ASSERT_EQ(row[k], tensor_at<float>(table, code) * s) << r << "," << k;
        }
      }
      ++fp8_layers;
    }
    EXPECT_EQ(fp8_layers, std::string(variant) == "fp8_channel_dynamic" ? 6 : 7);
    EXPECT_EQ(w->output.dtype, DType::F16);  // lm_head in ignored_layers / ignore
  }
}

// The whole model against the same weights decoded to f32 (which the test above shows are the
// writer's values): FP8W on the CPU multiplies f32 activations by the decoded weights, so only
// the f32 summation order differs (measured below 1e-6 relative). A scale on the wrong row
// or a per-tensor scale read as row 0's only moves them by orders of magnitude more.
TEST(Fp8CheckpointLoader, TinyModelLogitsMatchTheDequantizedModel) {
  const std::vector<int32_t> toks = {3, 17, 0, 47, 5, 5, 9, 21, 30};
  for (const char* variant : kFp8Variants) {
    auto q = load_safetensors_weights(wquant_fixture(variant));
    const double err = relative_l2(run_logits(q, toks), run_logits(dequantized_copy(*q), toks));
    EXPECT_LT(err, 1e-5) << variant;
  }
}

// The per-layer k_scale / v_scale of the static variants (vLLM's names; compressed-tensors
// with a kv_cache_scheme) are read for an fp8 :tensor KV cache.
TEST(Fp8CheckpointLoader, KvScalesAreRead) {
  for (const char* variant : {"fp8_tensor_static", "ct_fp8_tensor_static"}) {
    auto w = load_safetensors_weights(wquant_fixture(variant));
    EXPECT_EQ(w->k_scale, std::vector<float>{0.05f}) << variant;
    EXPECT_EQ(w->v_scale, std::vector<float>{0.03f}) << variant;
  }
  EXPECT_TRUE(load_safetensors_weights(wquant_fixture("fp8_channel_dynamic"))->k_scale.empty());
  // The other names vLLM reads: the deprecated single kv_scale (older AutoFP8) for K and V,
  // ModelOpt's v_proj.output_scale.
  const std::string src = wquant_fixture("fp8_tensor_static");
  const std::string dir = ::testing::TempDir() + "/tessera_fp8_kv_names";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src + "/config.json", dir + "/config.json");
  std::ifstream in(src + "/model.safetensors", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  rename_tensors(bytes, {{"model.layers.0.self_attn.k_scale", "model.layers.0.self_attn.kv_scale"},
                         {"model.layers.0.self_attn.v_scale", "model.layers.0.self_attn.v_proj.output_scale"}});
  std::ofstream(dir + "/model.safetensors", std::ios::binary) << bytes;
  auto w = load_safetensors_weights(dir);
  EXPECT_EQ(w->k_scale, std::vector<float>{0.05f});
  EXPECT_EQ(w->v_scale, std::vector<float>{0.03f});
  std::filesystem::remove_all(dir);
}

TEST(Fp8CheckpointLoader, ConfigsReadAsWritten) {
  auto c = parse_weight_quant_config(
      R"({"quantization_config": {"quant_method": "fp8", "activation_scheme": "static",
          "ignored_layers": ["lm_head"], "fmt": "e4m3"}})",
      "config.json");
  EXPECT_EQ(c.method, WeightQuantMethod::Fp8);
  EXPECT_TRUE(c.fp8 && c.static_input_scale);
  EXPECT_EQ(c.fp8_scales, Fp8ScaleStrategy::Any);
  c = parse_weight_quant_config(
      R"({"quantization_config": {"quant_method": "compressed-tensors", "format": "float-quantized",
          "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
          "strategy": "channel", "symmetric": true, "dynamic": false},
          "input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}}}})",
      "config.json");
  EXPECT_EQ(c.method, WeightQuantMethod::CompressedTensors);
  EXPECT_TRUE(c.fp8 && !c.static_input_scale);
  EXPECT_EQ(c.fp8_scales, Fp8ScaleStrategy::Channel);
}

TEST(Fp8CheckpointLoader, UnsupportedConfigsNameTheField) {
  const std::string fp8 = R"({"quant_method": "fp8", "activation_scheme": "dynamic", )";
  EXPECT_TRUE(has(config_error(fp8 + R"("weight_block_size": [128, 128]})"), "quantization_config.weight_block_size"));
  EXPECT_TRUE(has(config_error(fp8 + R"("fmt": "e5m2"})"), "quantization_config.fmt"));
  EXPECT_TRUE(has(config_error(R"({"quant_method": "fp8", "activation_scheme": "per-token"})"), "activation_scheme"));
  EXPECT_TRUE(has(config_error(fp8 + R"("ignored_layers": "lm_head"})"), "ignored_layers"));
  // compressed-tensors float-quantized: one config group with these weights / activations.
  auto ct = [](const std::string& weights, const std::string& inputs = "null", const std::string& extra = "") {
    return config_error(R"({"quant_method": "compressed-tensors", "format": "float-quantized", )" + extra +
                        R"("config_groups": {"g": {"targets": ["Linear"], "weights": )" + weights +
                        R"(, "input_activations": )" + inputs + "}}}");
  };
  const std::string channel = R"({"num_bits": 8, "type": "float", "strategy": "channel"})";
  EXPECT_TRUE(has(ct(R"({"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128, 128]})"),
                  "weights.strategy"));
  EXPECT_TRUE(has(ct(R"({"num_bits": 8, "type": "float", "strategy": "group", "group_size": 128})"), "strategy"));
  EXPECT_TRUE(has(ct(R"({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16})"), "num_bits"));
  EXPECT_TRUE(has(ct(R"({"num_bits": 8, "type": "int", "strategy": "channel"})"), "weights.type"));
  EXPECT_TRUE(has(ct(R"({"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": false})"), "symmetric"));
  EXPECT_TRUE(has(ct(channel, R"({"num_bits": 8, "type": "int", "strategy": "token", "dynamic": true})"),
                  "input_activations.type"));
  EXPECT_TRUE(has(ct(channel, R"({"num_bits": 8, "type": "float", "strategy": "token", "dynamic": false})"),
                  "input_activations.strategy"));
  EXPECT_TRUE(
      has(ct(channel, "null", R"("kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "attn_head"}, )"),
          "kv_cache_scheme.strategy"));
  // Integer packing with float weights, and two groups in different formats.
  EXPECT_TRUE(has(config_error(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
      "strategy": "channel"}}}})"),
                  "type"));
  EXPECT_TRUE(has(config_error(R"({"quant_method": "compressed-tensors", "config_groups": {
      "a": {"targets": ["re:.*mlp.*"], "format": "float-quantized", "weights": {"num_bits": 8, "type": "float",
            "strategy": "channel"}},
      "b": {"targets": ["re:.*attn.*"], "format": "pack-quantized", "weights": {"num_bits": 4, "type": "int",
            "strategy": "group", "group_size": 128}}}})"),
                  "format"));
}

// Checkpoints whose tensors are not what tessera loads, or not what their config says.
TEST(Fp8CheckpointLoader, BadTensorsAreRefusedNamingThem) {
  auto keep = [](nlohmann::json&) {};
  // E5M2 weights (same bytes, the header's type changed; both names are 7 characters).
  auto e5m2 = [](std::string& b) {
    for (size_t p = b.find("F8_E4M3"); p != std::string::npos; p = b.find("F8_E4M3", p)) b.replace(p, 7, "F8_E5M2");
  };
  EXPECT_TRUE(has(load_error_of_edited("fp8_channel_dynamic", keep, e5m2), "F8_E5M2"));
  // A static activation scheme needs every layer's input_scale.
  EXPECT_TRUE(
      has(load_error_of_edited("fp8_channel_dynamic",
                               [](nlohmann::json& c) { c["quantization_config"]["activation_scheme"] = "static"; }),
          "input_scale"));
  // compressed-tensors says per channel, the checkpoint holds one scale per tensor.
  const std::string err = load_error_of_edited("ct_fp8_tensor_static", [](nlohmann::json& c) {
    c["quantization_config"]["config_groups"]["group_0"]["weights"]["strategy"] = "channel";
  });
  EXPECT_TRUE(has(err, "weight_scale") && has(err, "shape [1]"));
  // FP8 weights without a quantization_config.
  EXPECT_TRUE(
      has(load_error_of_edited("ct_fp8_channel_dynamic", [](nlohmann::json& c) { c.erase("quantization_config"); }),
          "no quantization_config"));
  // A NaN code (0x7F) in the first byte of q_proj's weight.
  auto nan_code = [](std::string& b) {
    uint64_t n;
    std::memcpy(&n, b.data(), 8);
    const auto header = nlohmann::json::parse(b.substr(8, n));
    const uint64_t off = header["model.layers.0.self_attn.q_proj.weight"]["data_offsets"][0].get<uint64_t>();
    b[8 + n + off] = 0x7F;
  };
  EXPECT_TRUE(has(load_error_of_edited("fp8_tensor_static", keep, nan_code), "NaN"));
}
