// Weights and config from a GGUF file, zero-copy for the matrices.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "model/bind_llama.h"
#include "format/gguf.h"
#include "model/weights.h"
#include "quant/quant.h"

namespace tessera {

float* ModelWeights::make_f32(size_t n) {
  auto buf = std::shared_ptr<float[]>(new float[n]);
  float* p = buf.get();
  owners.push_back(std::shared_ptr<const void>(buf, buf.get()));
  return p;
}

namespace {

int get_required_int(const GGUFFile& f, const std::string& key) {
  auto v = f.get_int(key);
  if (!v) fail(f.name(), ": missing metadata key '", key, "'");
  if (*v < 0 || *v > (int64_t{1} << 31)) fail(f.name(), ": metadata '", key, "' = ", *v, " is out of range");
  return static_cast<int>(*v);
}

// YaRN as llama.cpp reads it: the original context, beta_fast/slow (default 32/1) and an
// attention factor that multiplies YaRN's own 0.1 ln(factor) + 1.
void read_yarn(const GGUFFile& f, const std::string& a, ModelConfig& c) {
  c.rope_original_ctx = get_required_int(f, a + "rope.scaling.original_context_length");
  if (auto v = f.get_float(a + "rope.scaling.yarn_beta_fast")) c.rope_yarn_beta_fast = static_cast<float>(*v);
  if (auto v = f.get_float(a + "rope.scaling.yarn_beta_slow")) c.rope_yarn_beta_slow = static_cast<float>(*v);
  const double attn = f.get_float(a + "rope.scaling.attn_factor").value_or(1.0);
  c.rope_attn_factor = static_cast<float>(attn * yarn_attn_factor(c.rope_scaling_factor));
}

// Phi-3: a sliding window on every layer (mini-4k: 2047) and, for the 128k models, LongRoPE:
// per-pair frequency divisors for long contexts (rope_factors_long) and short ones
// (rope_factors_short), with q and k scaled by attn_factor. As llama.cpp does for a context
// beyond the original, tessera runs the long factors whenever the model's context exceeds the
// original one (its default --max-model-len), whatever the prompt's length.
void read_phi3(const GGUFFile& f, const std::string& a, ModelConfig& c) {
  if (f.has(a + "attention.sliding_window")) {
    c.sliding_window = get_required_int(f, a + "attention.sliding_window");
    c.sliding_window_pattern = 0;  // every layer local
  }
  if (!f.has(a + "rope.scaling.original_context_length")) return;
  c.rope_original_ctx = get_required_int(f, a + "rope.scaling.original_context_length");
  if (c.n_ctx_train <= c.rope_original_ctx) return;
  const double computed = longrope_attn_factor(c.n_ctx_train, c.rope_original_ctx);
  c.rope_attn_factor = static_cast<float>(f.get_float(a + "rope.scaling.attn_factor").value_or(computed));
}

}  // namespace

ModelConfig config_from_gguf(const GGUFFile& f) {
  ModelConfig c;
  auto arch = f.get_string("general.architecture");
  if (!arch) fail(f.name(), ": missing metadata key 'general.architecture'");
  c.arch = std::string(*arch);
  if (c.arch != "llama" && c.arch != "qwen2" && c.arch != "qwen3" && c.arch != "qwen3moe" && c.arch != "mistral" &&
      c.arch != "gemma3" && c.arch != "phi3")
    fail(f.name(), ": architecture '", c.arch,
         "' is not supported (supported: llama, mistral, qwen2, qwen3, qwen3moe, gemma3, phi3)");
  const std::string a = c.arch + ".";
  if (auto name = f.get_string("general.name")) c.name = std::string(*name);
  c.n_layer = get_required_int(f, a + "block_count");
  c.n_embd = get_required_int(f, a + "embedding_length");
  c.n_ff = get_required_int(f, a + "feed_forward_length");
  c.n_head = get_required_int(f, a + "attention.head_count");
  c.n_head_kv = f.has(a + "attention.head_count_kv") ? get_required_int(f, a + "attention.head_count_kv") : c.n_head;
  c.n_ctx_train = get_required_int(f, a + "context_length");
  c.head_dim = f.has(a + "attention.key_length") ? get_required_int(f, a + "attention.key_length")
                                                 : (c.n_head > 0 ? c.n_embd / c.n_head : 0);
  c.rope_dim = f.has(a + "rope.dimension_count") ? get_required_int(f, a + "rope.dimension_count") : c.head_dim;
  if (auto eps = f.get_float(a + "attention.layer_norm_rms_epsilon")) c.rms_eps = static_cast<float>(*eps);
  if (auto base = f.get_float(a + "rope.freq_base")) c.rope_freq_base = static_cast<float>(*base);
  if (auto type = f.get_string(a + "rope.scaling.type"); type && *type != "none") {
    c.rope_scaling = std::string(*type);
    if (auto factor = f.get_float(a + "rope.scaling.factor")) c.rope_scaling_factor = static_cast<float>(*factor);
    if (c.rope_scaling == "yarn") read_yarn(f, a, c);
  }
  if (f.has(a + "vocab_size")) {
    c.n_vocab = get_required_int(f, a + "vocab_size");
  } else if (f.has("tokenizer.ggml.tokens")) {
    c.n_vocab = static_cast<int>(f.get_string_array("tokenizer.ggml.tokens").size());
  } else if (const auto* t = f.find_tensor("token_embd.weight"); t && t->shape.size() == 2) {
    c.n_vocab = static_cast<int>(t->shape[1]);
  }
  if (c.arch == "gemma3") {
    c.sliding_window = get_required_int(f, a + "attention.sliding_window");
    // llama.cpp's reading of Gemma 3: five local layers, then one global (the files carry no
    // pattern key; a later converter's key is honoured); local layers use RoPE base 10,000
    // without scaling (rope_scaling applies to the global layers only).
    c.sliding_window_pattern =
        f.has(a + "attention.sliding_window_pattern") ? get_required_int(f, a + "attention.sliding_window_pattern") : 6;
    c.rope_freq_base_local = 10000.0f;
    // query_pre_attn_scalar is head_dim except for the 27B (62 layers): n_embd / n_head there,
    // as llama.cpp decides it.
    const float pre_attn =
        c.n_layer == 62 && c.n_head > 0 ? static_cast<float>(c.n_embd / c.n_head) : static_cast<float>(c.head_dim);
    c.attn_scale = pre_attn > 0 ? 1.0f / std::sqrt(pre_attn) : 0.0f;
  }
  if (c.arch == "phi3") read_phi3(f, a, c);
  // Mixture of experts: Mixtral is arch "llama" with an expert count; Qwen3-MoE gives the
  // experts' width apart from the (unused) dense one.
  if (f.has(a + "expert_count")) {
    c.n_expert = get_required_int(f, a + "expert_count");
    c.n_expert_used = get_required_int(f, a + "expert_used_count");
    if (f.has(a + "expert_feed_forward_length")) c.n_ff = get_required_int(f, a + "expert_feed_forward_length");
  }
  if (c.arch == "qwen3moe" && c.n_expert == 0) fail(f.name(), ": qwen3moe without '", a, "expert_count'");
  // GGUF's converter permutes Llama's Q/K rows so RoPE rotates adjacent pairs; Qwen, Gemma and
  // Phi-3 keep halves.
  c.rope_neox =
      c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "qwen3moe" || c.arch == "gemma3" || c.arch == "phi3";
  c.qkv_bias = c.arch == "qwen2";
  c.qk_norm = c.arch == "qwen3" || c.arch == "qwen3moe" || c.arch == "gemma3";
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.validate();
  return c;
}

namespace {

struct TensorBinder {
  const GGUFFile& f;
  ModelWeights& w;

  const GGUFTensorInfo& find(const std::string& name) {
    const GGUFTensorInfo* t = f.find_tensor(name);
    if (!t) fail(f.name(), ": missing tensor '", name, "'");
    return *t;
  }

  // A [rows, cols] matrix (GGUF shape [cols, rows]) in any supported storage type.
  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    const GGUFTensorInfo& t = find(name);
    if (t.shape.size() != 2 || t.shape[0] != cols || t.shape[1] != rows)
      fail(f.name(), ": tensor '", name, "' has shape ", shape_str(t), ", expected [", cols, ", ", rows, "]");
    if (!dtype_traits(t.dtype).supported)
      fail(f.name(), ": tensor '", name, "' has unsupported type ", dtype_name(t.dtype));
    w.weight_bytes += static_cast<int64_t>(t.n_bytes);
    return WeightMatrix{t.data, t.dtype, rows, cols};
  }

  // A vector of n elements, as f32 (converted once when stored as F16/BF16).
  const float* vector(const std::string& name, int64_t n, bool optional = false) {
    const GGUFTensorInfo* t = f.find_tensor(name);
    if (!t) {
      if (optional) return nullptr;
      fail(f.name(), ": missing tensor '", name, "'");
    }
    if (t->shape.size() != 1 || t->shape[0] != n)
      fail(f.name(), ": tensor '", name, "' has shape ", shape_str(*t), ", expected [", n, "]");
    w.weight_bytes += static_cast<int64_t>(t->n_bytes);
    if (t->dtype == DType::F32) return reinterpret_cast<const float*>(t->data);
    if (t->dtype != DType::F16 && t->dtype != DType::BF16)
      fail(f.name(), ": tensor '", name, "' has type ", dtype_name(t->dtype), ", expected F32, F16 or BF16");
    float* out = w.make_f32(n);
    dequantize_row(t->dtype, t->data, out, n);
    return out;
  }

  // n matrices of [rows, cols] stored as one tensor (GGUF shape [cols, rows, n]): the experts
  // of a MoE layer, each a view of its contiguous rows.
  std::vector<WeightMatrix> experts(const std::string& name, int64_t n, int64_t rows, int64_t cols) {
    const GGUFTensorInfo& t = find(name);
    if (t.shape.size() != 3 || t.shape[0] != cols || t.shape[1] != rows || t.shape[2] != n)
      fail(f.name(), ": tensor '", name, "' has shape ", shape_str(t), ", expected [", cols, ", ", rows, ", ", n, "]");
    if (!dtype_traits(t.dtype).supported)
      fail(f.name(), ": tensor '", name, "' has unsupported type ", dtype_name(t.dtype));
    w.weight_bytes += static_cast<int64_t>(t.n_bytes);
    std::vector<WeightMatrix> out;
    const size_t expert_bytes = static_cast<size_t>(rows) * dtype_row_bytes(t.dtype, cols);
    for (int64_t e = 0; e < n; ++e)
      out.push_back(WeightMatrix{static_cast<const uint8_t*>(t.data) + e * expert_bytes, t.dtype, rows, cols});
    return out;
  }

  static std::string shape_str(const GGUFTensorInfo& t) {
    std::string s = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
    return s + "]";
  }
};

}  // namespace

std::shared_ptr<ModelWeights> load_gguf_weights(std::shared_ptr<const GGUFFile> file) {
  const GGUFFile& f = *file;
  auto w = std::make_shared<ModelWeights>();
  w->config = config_from_gguf(f);
  w->source = f.name();
  w->owners.push_back(file);
  const ModelConfig& c = w->config;
  TensorBinder bind{f, *w};
  bind_llama_tensors(bind, *w, kGgufLlamaNames);
  w->rope_freq_factors = bind.vector("rope_freqs.weight", c.rope_dim / 2, /*optional=*/true);
  if (c.arch == "phi3" && c.rope_original_ctx > 0) {  // LongRoPE (see read_phi3)
    const bool long_ctx = c.n_ctx_train > c.rope_original_ctx;
    w->rope_freq_factors = bind.vector(long_ctx ? "rope_factors_long.weight" : "rope_factors_short.weight",
                                       c.rope_dim / 2, /*optional=*/!long_ctx);
  }
  return w;
}

}  // namespace tessera
