// `tessera quantize` (model/quantize_checkpoint.h): a 16-bit checkpoint quantized with RTN and
// written as compressed-tensors loads back through the checkpoint loader into exactly the
// codes, scales and zero points of the quantizer, within the quantization step of the
// original weights; the rest of the checkpoint is carried over; bad input is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/fp16.h"
#include "format/safetensors_writer.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "engine/model_runner.h"
#include "model/model.h"
#include "model/quantize_calib_forward.h"
#include "model/quantize_calibrated.h"
#include "model/quantize_checkpoint.h"
#include "model/weights.h"
#include "quant/group_quant.h"

using namespace tessera;
namespace fs = std::filesystem;

namespace {

constexpr int kEmbd = 64, kFf = 96, kVocab = 40, kLayers = 2, kHeads = 4, kKvHeads = 2;

struct Linear {
  std::string name;
  int64_t rows, cols;
};

std::vector<Linear> linears() {
  std::vector<Linear> out;
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    out.push_back({p + "self_attn.q_proj.weight", kEmbd, kEmbd});
    out.push_back({p + "self_attn.k_proj.weight", kEmbd / 2, kEmbd});
    out.push_back({p + "self_attn.v_proj.weight", kEmbd / 2, kEmbd});
    out.push_back({p + "self_attn.o_proj.weight", kEmbd, kEmbd});
    out.push_back({p + "mlp.gate_proj.weight", kFf, kEmbd});
    out.push_back({p + "mlp.up_proj.weight", kFf, kEmbd});
    out.push_back({p + "mlp.down_proj.weight", kEmbd, kFf});
  }
  return out;
}

// A random f16 checkpoint; returns every tensor's values as written.
std::map<std::string, std::vector<uint16_t>> write_f16_checkpoint(const std::string& dir) {
  fs::create_directories(dir);
  nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"hidden_size", kEmbd},
                        {"intermediate_size", kFf},
                        {"num_hidden_layers", kLayers},
                        {"num_attention_heads", kHeads},
                        {"num_key_value_heads", kKvHeads},
                        {"vocab_size", kVocab},
                        {"torch_dtype", "float16"}};
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  std::ofstream(dir + "/tokenizer.json") << "{\"not\": \"read\"}";
  std::mt19937 rng(9);
  std::normal_distribution<float> d(0, 0.3f);
  std::map<std::string, std::vector<uint16_t>> values;
  auto add = [&](const std::string& name, int64_t n, float offset) {
    auto& v = values[name];
    for (int64_t i = 0; i < n; ++i) v.push_back(f32_to_fp16(d(rng) + offset));
  };
  std::vector<SafetensorsOutTensor> ts;
  std::map<std::string, std::vector<int64_t>> shapes;
  add("model.embed_tokens.weight", kVocab * kEmbd, 0), shapes["model.embed_tokens.weight"] = {kVocab, kEmbd};
  add("lm_head.weight", kVocab * kEmbd, 0), shapes["lm_head.weight"] = {kVocab, kEmbd};
  add("model.norm.weight", kEmbd, 1), shapes["model.norm.weight"] = {kEmbd};
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", kEmbd, 1), shapes[p + "input_layernorm.weight"] = {kEmbd};
    add(p + "post_attention_layernorm.weight", kEmbd, 1), shapes[p + "post_attention_layernorm.weight"] = {kEmbd};
  }
  for (const Linear& m : linears()) add(m.name, m.rows * m.cols, 0), shapes[m.name] = {m.rows, m.cols};
  for (auto& [name, v] : values) ts.push_back({name, SafetensorsDType::F16, shapes[name], v.data(), v.size() * 2});
  write_safetensors(dir + "/model.safetensors", ts);
  return values;
}

WeightMatrix find_linear(const ModelWeights& w, const std::string& name) {
  const int l = std::stoi(name.substr(std::string("model.layers.").size()));
  const LayerWeights& L = w.layers[l];
  if (name.ends_with("q_proj.weight")) return L.wq;
  if (name.ends_with("k_proj.weight")) return L.wk;
  if (name.ends_with("v_proj.weight")) return L.wv;
  if (name.ends_with("o_proj.weight")) return L.wo;
  if (name.ends_with("gate_proj.weight")) return L.w_gate;
  if (name.ends_with("up_proj.weight")) return L.w_up;
  return L.w_down;
}

QuantizeOptions options(const std::string& method, int bits, int64_t group_size, bool asymmetric) {
  QuantizeOptions o;
  o.method = method;
  o.bits = bits;
  o.group_size = group_size;
  o.asymmetric = asymmetric;
  return o;
}

}  // namespace

TEST(QuantizeCheckpoint, RtnRoundTripsThroughCompressedTensors) {
  const std::string in = ::testing::TempDir() + "/tessera_quantize_in";
  const auto values = write_f16_checkpoint(in);
  for (const QuantizeOptions& o :
       {options("rtn", 4, 32, true), options("rtn", 4, 64, false), options("rtn", 8, -1, false)}) {
    SCOPED_TRACE(std::to_string(o.bits) + " bits, group " + std::to_string(o.group_size));
    const std::string out = ::testing::TempDir() + "/tessera_quantize_out";
    fs::remove_all(out);
    int layers_seen = 0;
    const QuantizeReport r = quantize_checkpoint(in, out, o, [&](int layer, int n, const auto& ts) {
      EXPECT_EQ(layer, layers_seen++);
      EXPECT_EQ(n, kLayers);
      EXPECT_EQ(ts.size(), 7u);
    });
    EXPECT_EQ(layers_seen, kLayers);
    EXPECT_EQ(r.tensors.size(), 7u * kLayers);
    EXPECT_LT(r.bytes_out, r.bytes_in);
    EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
    auto w = load_safetensors_weights(out);
    EXPECT_EQ(w->output.dtype, DType::F16);  // lm_head is left alone
    for (const Linear& lin : linears()) {
      SCOPED_TRACE(lin.name);
      const WeightMatrix m = find_linear(*w, lin.name);
      ASSERT_EQ(m.dtype, o.bits == 8 ? DType::W8G : DType::W4G);
      std::vector<float> orig(lin.rows * lin.cols);
      for (size_t i = 0; i < orig.size(); ++i) orig[i] = fp16_to_f32(values.at(lin.name)[i]);
      const int64_t group = o.group_size < 0 ? lin.cols : o.group_size;
      const GroupQuantMatrix want = quantize_group_rtn(orig.data(), lin.rows, lin.cols, o.bits, group, o.asymmetric);
      const GroupQuantLayout l = m.gq_layout();
      ASSERT_EQ(l.total_bytes, want.layout.total_bytes);
      // Bit for bit the quantizer's buffer: codes, scales, zero points survived the packing.
      EXPECT_EQ(std::memcmp(m.data, want.data.get(), static_cast<size_t>(l.total_bytes)), 0);
      std::vector<float> row(lin.cols);
      for (int64_t r0 = 0; r0 < lin.rows; ++r0) {
        gq_dequantize_row(l, static_cast<const uint8_t*>(m.data), r0, row.data());
        for (int64_t k = 0; k < lin.cols; ++k) {
          const float step = fp16_to_f32(gq_scale_f16(l, static_cast<const uint8_t*>(m.data), r0, k / group));
          ASSERT_LE(std::fabs(row[k] - orig[r0 * lin.cols + k]), step * 1.01f) << r0 << "," << k;
        }
      }
    }
    fs::remove_all(out);
  }
  fs::remove_all(in);
}

TEST(QuantizeCheckpoint, RefusesQuantizedInputAndBadOptions) {
  auto error_of = [](const std::string& in, const QuantizeOptions& o) {
    try {
      quantize_checkpoint(in, ::testing::TempDir() + "/tessera_quantize_never", o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string quantized = std::string(TESSERA_FIXTURES_DIR) + "/wquant/awq_w4_g32";
  EXPECT_NE(error_of(quantized, {}).find("quantized already"), std::string::npos);
  EXPECT_NE(error_of(quantized, options("gptq", 4, 128, false)).find("needs the calibrated model"), std::string::npos);
  EXPECT_NE(error_of(quantized, options("omq", 4, 128, false)).find("rtn, gptq or awq"), std::string::npos);
  EXPECT_NE(error_of(quantized, options("rtn", 3, 128, false)).find("--bits"), std::string::npos);
  EXPECT_NE(error_of(quantized, options("rtn", 4, 100, false)).find("--group-size"), std::string::npos);
  EXPECT_NE(error_of("/nonexistent/model.gguf", {}).find("GGUF"), std::string::npos);
}

// GPTQ and AWQ over a whole (random) model: every matrix's output error on its calibration
// inputs is below RTN's in sum (per layer too for AWQ; not per matrix: AWQ's α minimizes the
// summed error of the matrices sharing an input, so k_proj alone may lose a little), and
// `tessera quantize` writes exactly the calibrated buffers (act-order permutation, AWQ's
// folded norms) so that they load back bit for bit.
TEST(QuantizeCheckpoint, GptqAndAwqWriteTheCalibratedModel) {
  const std::string in = ::testing::TempDir() + "/tessera_quantize_calib_in";
  write_f16_checkpoint(in);
  std::mt19937 rng(4);
  std::vector<int32_t> tokens(4 * 32 + 5);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % kVocab);
  const auto be = make_backend(BackendOptions{});
  for (const QuantizeOptions& o : {options("gptq", 4, 32, true), options("awq", 4, 32, false),
                                   options("gptq", 8, -1, false), options("awq", 4, 64, true)}) {
    QuantizeOptions qo = o;
    qo.act_order = o.method == "gptq" && o.bits == 4;
    SCOPED_TRACE(qo.method + " " + std::to_string(qo.bits) + " bits, group " + std::to_string(qo.group_size));
    auto w = load_safetensors_weights(in);
    const std::vector<float> norm0(w->layers[0].attn_norm, w->layers[0].attn_norm + kEmbd);
    CalibratedQuantOptions co;
    co.method = qo.method;
    co.bits = qo.bits;
    co.group_size = qo.group_size;
    co.asymmetric = qo.asymmetric;
    co.act_order = qo.act_order;
    co.window = 32;
    int layers = 0;
    double sum = 0, sum_rtn = 0;
    quantize_calibrated(*w, *be, tokens, co, [&](const CalibratedLayerReport& r) {
      EXPECT_EQ(r.layer, layers++);
      ASSERT_EQ(r.matrices.size(), 7u);
      double layer_sum = 0, layer_rtn = 0;
      for (const auto& m : r.matrices) layer_sum += m.out_err, layer_rtn += m.rtn_out_err;
      if (qo.method == "awq") {
        EXPECT_LT(layer_sum, layer_rtn) << "layer " << r.layer;
      }
      sum += layer_sum, sum_rtn += layer_rtn;
      EXPECT_EQ(r.awq_alpha.size(), qo.method == "awq" ? 4u : 0u);
    });
    EXPECT_EQ(layers, kLayers);
    EXPECT_LT(sum, qo.method == "gptq" ? 0.9 * sum_rtn : sum_rtn);
    EXPECT_EQ(w->layers[0].wq.gq_perm, qo.act_order);
    if (qo.method == "awq") {
      EXPECT_NE(std::vector<float>(w->layers[0].attn_norm, w->layers[0].attn_norm + kEmbd), norm0);
    }

    const std::string out = ::testing::TempDir() + "/tessera_quantize_calib_out";
    fs::remove_all(out);
    quantize_checkpoint(in, out, qo, {}, w.get());
    auto back = load_safetensors_weights(out);
    for (const Linear& lin : linears()) {
      SCOPED_TRACE(lin.name);
      const WeightMatrix want = find_linear(*w, lin.name), got = find_linear(*back, lin.name);
      ASSERT_EQ(got.dtype, want.dtype);
      ASSERT_EQ(got.gq_perm, want.gq_perm);
      ASSERT_EQ(got.bytes(), want.bytes());
      EXPECT_EQ(std::memcmp(got.data, want.data, static_cast<size_t>(want.bytes())), 0);
    }
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_EQ(std::memcmp(back->layers[l].attn_norm, w->layers[l].attn_norm, kEmbd * 4), 0);
      EXPECT_EQ(std::memcmp(back->layers[l].ffn_norm, w->layers[l].ffn_norm, kEmbd * 4), 0);
    }
    fs::remove_all(out);
  }
  // Bad calibration options are refused naming the option.
  auto w = load_safetensors_weights(in);
  auto error_of = [&](CalibratedQuantOptions co, std::span<const int32_t> toks) {
    try {
      quantize_calibrated(*w, *be, toks, co);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CalibratedQuantOptions co;
  co.window = 32;
  EXPECT_NE(error_of(co, std::span<const int32_t>(tokens).first(20)).find("fewer than one window"), std::string::npos);
  co.bits = 3;
  EXPECT_NE(error_of(co, tokens).find("no 3-bit codes"), std::string::npos);
  co.bits = 4;
  co.damp = 0;
  EXPECT_NE(error_of(co, tokens).find("--damp"), std::string::npos);
  co.damp = 0.01;
  co.method = "awq";
  co.act_order = true;
  EXPECT_NE(error_of(co, tokens).find("--act-order"), std::string::npos);
  co.act_order = false;
  co.method = "rtn";
  EXPECT_NE(error_of(co, tokens).find("takes no calibration"), std::string::npos);
  co.method = "gptq";
  std::vector<int32_t> out_of_vocab(tokens);
  out_of_vocab[3] = kVocab;
  EXPECT_NE(error_of(co, out_of_vocab).find("outside the vocabulary"), std::string::npos);
  fs::remove_all(in);
}

// The calibration forward is the model's forward: the float layers run stage by stage over two
// windows, then the final norm and the head, give the logits ModelRunner gives for each window
// (so the Gram matrices GPTQ and AWQ see are of the inputs the model really has).
TEST(QuantizeCheckpoint, CalibrationForwardIsTheModelsForward) {
  const std::string in = ::testing::TempDir() + "/tessera_quantize_fw_in";
  write_f16_checkpoint(in);
  const std::shared_ptr<const ModelWeights> w = load_safetensors_weights(in);
  const ModelConfig& c = w->config;
  constexpr int kWindow = 16;
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(2 * kWindow);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % kVocab);
  CpuBackend be(2);
  CalibForward fw(be, *w, tokens, kWindow);
  for (int l = 0; l < kLayers; ++l) {
    const LayerWeights& L = w->layers[l];
    const WeightMatrix* ms[7] = {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down};
    LayerF32 f;
    for (int i = 0; i < 7; ++i) {
      ASSERT_EQ(ms[i]->dtype, DType::F16);
      const auto* h = static_cast<const uint16_t*>(ms[i]->data);
      for (int64_t k = 0; k < ms[i]->rows * ms[i]->cols; ++k) f.m[i].push_back(fp16_to_f32(h[k]));
    }
    f.attn_norm = L.attn_norm;
    f.ffn_norm = L.ffn_norm;
    InputStats qkv_in(kEmbd), o_in(static_cast<int64_t>(c.n_head) * c.head_dim), ffn_in(kEmbd), down_in(kFf);
    fw.stage_a(f, qkv_in);
    fw.stage_b(f, o_in);
    fw.stage_c(f, ffn_in);
    fw.stage_d(f, down_in);
    fw.stage_e(f);
    EXPECT_EQ(down_in.n, 2 * kWindow);
  }
  auto model = create_model(w, be, kWindow, kWindow);
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE("window " + std::to_string(s));
    std::vector<float> xn(kWindow * kEmbd), got(kWindow * kVocab), want(kWindow * kVocab, NAN);
    be.rms_norm(fw.residual().data() + s * kWindow * kEmbd, w->output_norm, xn.data(), kWindow, kEmbd, c.rms_eps);
    const MatmulTarget head[] = {{w->output, got.data(), kVocab}};
    be.matmul(xn.data(), kWindow, kEmbd, head);
    KvCache kv(be, KvCacheSpec::plain(c.n_layer, c.n_head_kv, c.head_dim, 4, 8, DType::F32));
    BlockPool pool(8);
    SequenceBlocks seq;
    ASSERT_TRUE(seq.reserve(pool, 4, kWindow));
    ForwardBatch fb;
    fb.add_sequence(seq, 4, tokens.data() + s * kWindow, kWindow, ForwardBatch::Logits::All);
    ModelRunner(*model, kv, be).forward(fb, want.data());
    for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3f * (1 + std::fabs(want[i]))) << i;
  }
  fs::remove_all(in);
}
