// GPTQ, AWQ and compressed-tensors checkpoints written by an independent writer
// (tools/fixtures/make_wquant_fixtures.py: numpy + safetensors, each format's documented
// packing) load into the codes, scales, zero points and permutation the writer intended, and
// the whole tiny model gives the logits of the same model with the dequantized weights in f32.
// Also: configs and tensors tessera does not support are rejected naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "core/fp16.h"
#include "dequantized_weights.h"
#include "quantized_model_util.h"
#include "engine/model_runner.h"
#include "format/safetensors.h"
#include "model/dummy.h"
#include "model/model.h"
#include "model/quant_config.h"
#include "model/quantize_weights.h"
#include "quant/group_quant.h"

using namespace tessera;
using namespace tessera::testing_util;

namespace {

const char* const kVariants[] = {"gptq_w4_g64_sym",    "gptq_w4_g32_asym_actorder", "gptq_w8_channel_v2", "awq_w4_g32",
                                 "ct_w4_g64_sym_bf16", "ct_w4_g32_asym_actorder",   "ct_w8_channel"};

std::string fixture(const std::string& name) { return wquant_fixture(name); }

}  // namespace

// Codes (exact), scales (f16 bits), zero points and the group of every input column as the
// writer meant them.
TEST(WeightQuantLoader, CheckpointsDecodeToTheWritersIntendedValues) {
  for (const char* variant : kVariants) {
    SCOPED_TRACE(variant);
    auto w = load_safetensors_weights(fixture(variant));
    auto expected = SafetensorsFile::open(fixture(variant) + "/expected.safetensors");
    const bool eight = std::string(variant).find("w8") != std::string::npos;
    const bool act_order = std::string(variant).find("actorder") != std::string::npos;
    for (const auto& [prefix, m] : hf_linears(*w)) {
      SCOPED_TRACE(prefix);
      ASSERT_EQ(m.dtype, eight ? DType::W8G : DType::W4G);
      EXPECT_EQ(m.gq_perm, act_order);
      const GroupQuantLayout l = m.gq_layout();
      const auto* buf = static_cast<const uint8_t*>(m.data);
      const auto& codes = *expected->find_tensor(prefix + ".codes");
      const auto& zeros = *expected->find_tensor(prefix + ".zeros");
      const auto& scales = *expected->find_tensor(prefix + ".scales");
      const auto& g_idx = *expected->find_tensor(prefix + ".g_idx");
      ASSERT_EQ(codes.shape, (std::vector<int64_t>{m.rows, m.cols}));
      const int32_t* perm = gq_perm(l, buf);
      std::vector<float> row(m.cols);
      for (int64_t r = 0; r < m.rows; ++r) {
        gq_dequantize_row(l, buf, r, row.data());
        for (int64_t j = 0; j < m.cols; ++j) {
          const int64_t k = perm ? perm[j] : j, g = j / l.group_size;
          ASSERT_EQ(g, tensor_at<int32_t>(g_idx, k)) << "column " << k;
          ASSERT_EQ(gq_code(l, buf, r, j), tensor_at<uint8_t>(codes, r * m.cols + k)) << r << "," << k;
          ASSERT_EQ(gq_zero(l, buf, r, g), tensor_at<uint8_t>(zeros, g * m.rows + r)) << r << "," << g;
          ASSERT_EQ(gq_scale_f16(l, buf, r, g), tensor_at<uint16_t>(scales, g * m.rows + r)) << r << "," << g;
          const float want = static_cast<float>(int(tensor_at<uint8_t>(codes, r * m.cols + k)) -
                                                int(tensor_at<uint8_t>(zeros, g * m.rows + r))) *
                             fp16_to_f32(tensor_at<uint16_t>(scales, g * m.rows + r));
          ASSERT_EQ(row[k], want) << r << "," << k;
        }
      }
    }
    EXPECT_EQ(w->output.dtype, DType::F16);  // lm_head stays unquantized
  }
}

// The whole model: the quantized checkpoint's logits against the same model with its weights
// decoded to f32. The difference is the 8-bit quantization of the activations in the 7
// products of each layer (measured 1.8-2.4% relative here). Every zero point off by one moved
// them by 101-138% at 4 bits and by 6% at 8 bits (per channel); the exact checks above catch
// smaller slips.
TEST(WeightQuantLoader, TinyModelLogitsMatchTheDequantizedModel) {
  const std::vector<int32_t> toks = {3, 17, 0, 47, 5, 5, 9, 21, 30};
  for (const char* variant : kVariants) {
    auto q = load_safetensors_weights(fixture(variant));
    const auto ref = run_logits(dequantized_copy(*q), toks);
    const auto got = run_logits(q, toks);
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << variant;
      num += (got[i] - ref[i]) * (got[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    EXPECT_LT(std::sqrt(num / den), 4e-2) << variant;
  }
}

// Dummy weights in the group formats (for benchmarks at real sizes): the decoder's linear
// layers are W4G/W8G, the model runs, and gives the logits of its dequantized copy.
TEST(WeightQuantLoader, DummyGroupQuantizedWeights) {
  const std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (const char* spec : {"llama3-tiny:w4g64", "llama3-tiny:w8c", "llama3-tiny:w4g128", "llama3-tiny:fp8"}) {
    auto q = make_dummy_weights(spec, 7);
    const std::string s = spec;
    const bool fp8 = s.ends_with("fp8");
    ASSERT_EQ(q->layers[0].wq.dtype, fp8                                 ? DType::FP8W
                                     : s.find("w8") != std::string::npos ? DType::W8G
                                                                         : DType::W4G)
        << spec;
    EXPECT_EQ(q->tok_embd.dtype, fp8 ? DType::BF16 : DType::F16);
    const auto ref = run_logits(dequantized_copy(*q), toks);
    const auto got = run_logits(q, toks);
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << spec;
      num += (got[i] - ref[i]) * (got[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    // FP8W runs on f32 activations: only f32 summation order differs from the decoded copy.
    EXPECT_LT(std::sqrt(num / den), fp8 ? 1e-4 : 4e-2) << spec;
  }
  EXPECT_THROW(make_dummy_weights("llama3-tiny:w4g48", 7), Error);
}

// Quantization at load ("MODEL@w4g64a", "MODEL@fp8"): any model's linear layers become
// W4G/W8G/FP8W by RTN.
TEST(WeightQuantLoader, QuantizeAtLoad) {
  WeightQuantSpec spec;
  ASSERT_TRUE(parse_weight_quant_spec("w4g64a", &spec));
  EXPECT_TRUE(spec.bits == 4 && spec.group == 64 && spec.asymmetric);
  ASSERT_TRUE(parse_weight_quant_spec("w8c", &spec));
  EXPECT_TRUE(spec.bits == 8 && spec.group == 0 && !spec.asymmetric);
  EXPECT_FALSE(parse_weight_quant_spec("q4_0", &spec));
  EXPECT_THROW(parse_weight_quant_spec("w4g20", &spec), Error);
  // GPTQ/AWQ names carry their calibration settings.
  ASSERT_TRUE(parse_weight_quant_spec("gptq-w4g32a,calib=/c.txt,tokens=4096,window=256,damp=0.05,act-order", &spec));
  EXPECT_TRUE(spec.method == "gptq" && spec.bits == 4 && spec.group == 32 && spec.asymmetric &&
              spec.calib_file == "/c.txt" && spec.calib_tokens == 4096 && spec.window == 256 && spec.damp == 0.05 &&
              spec.act_order);
  ASSERT_TRUE(parse_weight_quant_spec("awq-w4g128,calib=c.txt", &spec));
  EXPECT_TRUE(spec.method == "awq" && spec.group == 128 && !spec.asymmetric);
  auto spec_error = [&](const std::string& s) {
    try {
      parse_weight_quant_spec(s, &spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(spec_error("gptq-w4g128").find("needs calibration text"), std::string::npos);
  EXPECT_NE(spec_error("awq-w4g128,calib=c.txt,act-order").find("GPTQ setting"), std::string::npos);
  EXPECT_NE(spec_error("gptq-w4g128,calib=c.txt,bogus=1").find("unknown setting 'bogus=1'"), std::string::npos);
  EXPECT_NE(spec_error("gptq-w4g128,calib=c.txt,damp=2").find("damp=2"), std::string::npos);
  EXPECT_NE(spec_error("w4g128,calib=c.txt").find("no calibration settings"), std::string::npos);
  EXPECT_THROW(make_dummy_weights("llama3-tiny:gptq-w4g128,calib=c.txt", 7), Error);
  WeightQuantSpec gptq_spec;
  ASSERT_TRUE(parse_weight_quant_spec("gptq-w4g128,calib=c.txt", &gptq_spec));
  auto dummy = make_dummy_weights("llama3-tiny:q8_0", 3);
  EXPECT_THROW(quantize_linear_weights(*dummy, gptq_spec), Error);  // needs calibration tokens
  const std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  for (const char* s : {"w4g64a", "w8g128", "fp8"}) {
    ASSERT_TRUE(parse_weight_quant_spec(s, &spec));
    auto w = make_dummy_weights("llama3-tiny:q8_0", 3);
    quantize_linear_weights(*w, spec);
    EXPECT_EQ(w->layers[1].w_down.dtype, spec.fp8 ? DType::FP8W : spec.bits == 8 ? DType::W8G : DType::W4G) << s;
    EXPECT_EQ(w->layers[1].w_down.gq_zeros, spec.asymmetric) << s;
    EXPECT_EQ(w->output.dtype, DType::Q8_0) << s;  // the head is kept
    const auto ref = run_logits(dequantized_copy(*w), toks);
    const auto got = run_logits(w, toks);
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num += (got[i] - ref[i]) * (got[i] - ref[i]);
      den += ref[i] * ref[i];
    }
    EXPECT_LT(std::sqrt(num / den), spec.fp8 ? 1e-4 : 4e-2) << s;
    EXPECT_THROW(quantize_linear_weights(*w, spec), Error);  // quantized already
  }
}

namespace {

std::string quant_error(const std::string& qcfg) {
  try {
    parse_weight_quant_config("{\"quantization_config\": " + qcfg + "}", "config.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(WeightQuantLoader, UnsupportedConfigsNameTheField) {
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos ? ::testing::AssertionSuccess()
                                               : ::testing::AssertionFailure() << "'" << msg << "' lacks " << part;
  };
  EXPECT_TRUE(
      has(quant_error(R"({"quant_method": "gptq", "bits": 3, "group_size": 128})"), "quantization_config.bits"));
  EXPECT_TRUE(has(quant_error(R"({"quant_method": "gptq", "bits": 4, "group_size": 48})"), "group_size"));
  EXPECT_TRUE(
      has(quant_error(R"({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"})"), "checkpoint_format"));
  EXPECT_TRUE(has(quant_error(R"({"quant_method": "gptq", "bits": 4, "dynamic": {"-:.*mlp": {}}})"), "dynamic"));
  EXPECT_TRUE(has(quant_error(R"({"quant_method": "awq", "bits": 4, "version": "gemv"})"), "version"));
  EXPECT_TRUE(has(quant_error(R"({"quant_method": "exl2", "bits": 4})"), "quant_method"));
  EXPECT_TRUE(has(quant_error(R"({"quant_method": "compressed-tensors", "format": "naive-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "int",
      "strategy": "channel"}}}})"),
                  "format"));
  EXPECT_TRUE(has(quant_error(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
      "strategy": "tensor"}}}})"),
                  "strategy"));
  EXPECT_TRUE(has(quant_error(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int",
      "strategy": "group", "group_size": 128}, "input_activations": {"num_bits": 8}}}})"),
                  "input_activations"));
  // And the supported ones read as written.
  const auto c = parse_weight_quant_config(
      R"({"quantization_config": {"quant_method": "gptq", "bits": 8, "group_size": -1, "sym": false,
          "desc_act": true, "checkpoint_format": "gptq_v2"}})",
      "config.json");
  EXPECT_EQ(c.method, WeightQuantMethod::Gptq);
  EXPECT_EQ(c.bits, 8);
  EXPECT_EQ(c.group_size, -1);
  EXPECT_FALSE(c.symmetric);
  EXPECT_TRUE(c.act_order && c.gptq_v2);
}

// A checkpoint whose tensors disagree with its config: the error names the tensor and shape.
TEST(WeightQuantLoader, MismatchedTensorsNameTheTensor) {
  const std::string src = fixture("gptq_w4_g64_sym");
  const std::string dir = ::testing::TempDir() + "/tessera_wquant_bad_group";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(src + "/config.json");
  std::string cfg((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto pos = cfg.find("\"group_size\": 64");
  ASSERT_NE(pos, std::string::npos);
  cfg.replace(pos, 16, "\"group_size\": 32");  // the scales hold 64-column groups
  std::ofstream(dir + "/config.json") << cfg;
  try {
    load_safetensors_weights(dir);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("scales"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shape"), std::string::npos) << msg;
  }
  std::filesystem::remove_all(dir);
}

// Older checkpoints: the settings in quantize_config.json (AutoGPTQ) or quant_config.json
// (AutoAWQ) beside a config.json without quantization_config, quant_method often absent.
TEST(WeightQuantLoader, SettingsBesideConfigJsonAreRead) {
  for (const auto& [variant, file] :
       {std::pair<const char*, const char*>{"gptq_w4_g32_asym_actorder", "quantize_config.json"},
        std::pair<const char*, const char*>{"awq_w4_g32", "quant_config.json"}}) {
    const std::string src = fixture(variant);
    const std::string dir = ::testing::TempDir() + "/tessera_wquant_side_config";
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors");
    std::ifstream in(src + "/config.json");
    nlohmann::json cfg = nlohmann::json::parse(in);
    nlohmann::json q = cfg["quantization_config"];
    q.erase("quant_method");
    cfg.erase("quantization_config");
    std::ofstream(dir + "/config.json") << cfg.dump();
    std::ofstream(dir + "/" + file) << q.dump();
    auto side = load_safetensors_weights(dir);
    auto ref = load_safetensors_weights(src);
    const WeightMatrix a = side->layers[0].w_down, b = ref->layers[0].w_down;
    ASSERT_EQ(a.dtype, b.dtype) << variant;
    ASSERT_EQ(a.bytes(), b.bytes()) << variant;
    EXPECT_EQ(std::memcmp(a.data, b.data, static_cast<size_t>(a.bytes())), 0) << variant;
    std::filesystem::remove_all(dir);
  }
}

// Quantized tensors in a checkpoint whose config.json has no quantization_config.
TEST(WeightQuantLoader, QuantizedTensorsWithoutAConfigAreRefused) {
  const std::string src = fixture("awq_w4_g32");
  const std::string dir = ::testing::TempDir() + "/tessera_wquant_no_config";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(src + "/config.json");
  nlohmann::json cfg = nlohmann::json::parse(in);
  cfg.erase("quantization_config");
  std::ofstream(dir + "/config.json") << cfg.dump();
  try {
    load_safetensors_weights(dir);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no quantization_config"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}
