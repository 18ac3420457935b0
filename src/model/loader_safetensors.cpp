// Weights and config from a Hugging Face checkpoint: config.json + safetensors (one file or
// sharded). Matrices in F32/F16/BF16 are used in place; vectors become f32.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/error.h"
#include "model/bind_llama.h"
#include "model/hf_config.h"
#include "model/loader_quantized.h"
#include "format/safetensors.h"
#include "model/weights.h"
#include "quant/quant.h"

namespace tessera {

namespace {

ModelConfig config_from_hf(const HFConfig& h, const std::string& dir) {
  ModelConfig c;
  if (h.architecture == "LlamaForCausalLM" || h.architecture == "MistralForCausalLM") {
    c.arch = "llama";
  } else if (h.architecture == "Qwen2ForCausalLM") {
    c.arch = "qwen2";
  } else if (h.architecture == "Qwen3ForCausalLM") {
    c.arch = "qwen3";
    c.qk_norm = true;
  } else if (h.architecture == "Phi3ForCausalLM") {
    c.arch = "phi3";
  } else if (h.architecture == "MixtralForCausalLM") {
    c.arch = "llama";
  } else if (h.architecture == "Qwen3MoeForCausalLM") {
    c.arch = "qwen3moe";
    c.qk_norm = true;
  } else {
    fail(dir, ": architecture '", h.architecture,
         "' is not supported (supported: LlamaForCausalLM, MistralForCausalLM, MixtralForCausalLM, Qwen2ForCausalLM, "
         "Qwen3ForCausalLM, Qwen3MoeForCausalLM, Phi3ForCausalLM)");
  }
  c.name = std::filesystem::path(dir).filename().string();
  auto narrow = [&](int64_t v, const char* field) {
    if (v < 0 || v > (int64_t{1} << 30)) fail(dir, "/config.json: ", field, " = ", v, " is out of range");
    return static_cast<int>(v);
  };
  c.n_vocab = narrow(h.vocab_size, "vocab_size");
  c.n_embd = narrow(h.hidden_size, "hidden_size");
  c.n_layer = narrow(h.num_hidden_layers, "num_hidden_layers");
  c.n_head = narrow(h.num_attention_heads, "num_attention_heads");
  c.n_head_kv = narrow(h.num_key_value_heads, "num_key_value_heads");
  c.head_dim = narrow(h.head_dim, "head_dim");
  c.n_ff = narrow(h.intermediate_size, "intermediate_size");
  if (h.architecture == "MixtralForCausalLM" || h.architecture == "Qwen3MoeForCausalLM") {
    if (h.num_experts <= 0) fail(dir, "/config.json: ", h.architecture, " without 'num_local_experts'/'num_experts'");
    if (h.decoder_sparse_step != 1 || h.has_mlp_only_layers || h.shared_expert_intermediate_size > 0)
      fail(dir, "/config.json: dense layers among the experts ('decoder_sparse_step', 'mlp_only_layers') or a shared ",
           "expert are not supported");
    c.n_expert = narrow(h.num_experts, "num_experts");
    c.n_expert_used = narrow(h.num_experts_per_tok, "num_experts_per_tok");
    if (h.moe_intermediate_size > 0) c.n_ff = narrow(h.moe_intermediate_size, "moe_intermediate_size");
    c.moe_renormalize = h.architecture == "MixtralForCausalLM" || h.norm_topk_prob;
  }
  c.n_ctx_train = narrow(h.max_position_embeddings, "max_position_embeddings");
  c.rms_eps = static_cast<float>(h.rms_norm_eps);
  c.rope_freq_base = static_cast<float>(h.rope_theta);
  c.rope_dim = static_cast<int>(std::lround(c.head_dim * h.partial_rotary_factor));
  c.rope_neox = true;  // Hugging Face checkpoints rotate halves (rotate_half)
  c.qkv_bias = h.qkv_bias;
  c.tied_embeddings = h.tie_word_embeddings;
  if (h.sliding_window > 0 && h.use_sliding_window) {
    // Mistral (v0.1), Phi-3: every layer attends to the last sliding_window keys. Qwen 2/3
    // window only the layers from max_window_layers on, and ship with the window off; not
    // supported on.
    if (c.arch != "llama" && c.arch != "phi3")
      fail(dir, "/config.json: use_sliding_window is true; a ", h.architecture,
           " sliding window is not supported (set it to false)");
    c.sliding_window = narrow(h.sliding_window, "sliding_window");
    c.sliding_window_pattern = 0;  // every layer local
  }
  if (h.rope_scaling) {
    const HFRopeScaling& s = *h.rope_scaling;
    if (s.type == "llama3" || s.type == "linear") {
      c.rope_scaling = s.type;
      c.rope_scaling_factor = static_cast<float>(s.factor);
      c.rope_low_freq_factor = static_cast<float>(s.low_freq_factor);
      c.rope_high_freq_factor = static_cast<float>(s.high_freq_factor);
      c.rope_original_ctx = static_cast<int>(s.original_max_position_embeddings);
    } else if (s.type == "yarn") {
      // The original context defaults to max_position_embeddings; the context the model then
      // runs at is that times the factor (vLLM's reading).
      c.rope_scaling = s.type;
      c.rope_scaling_factor = static_cast<float>(s.factor);
      c.rope_original_ctx = s.original_max_position_embeddings > 0
                                ? narrow(s.original_max_position_embeddings, "original_max_position_embeddings")
                                : c.n_ctx_train;
      c.rope_yarn_beta_fast = static_cast<float>(s.beta_fast);
      c.rope_yarn_beta_slow = static_cast<float>(s.beta_slow);
      c.rope_attn_factor = static_cast<float>(s.attention_factor > 0 ? s.attention_factor : yarn_attn_factor(s.factor));
      const double extended = static_cast<double>(c.rope_original_ctx) * std::max(1.0, s.factor);
      c.n_ctx_train = static_cast<int>(std::min(extended, static_cast<double>(int64_t{1} << 30)));
    } else if (s.type == "dynamic") {
      // Dynamic NTK, as vLLM runs it: the base stretched once for the full scaled context
      // (max_position_embeddings × factor), not re-derived from each sequence's length as
      // transformers does, since cached keys were rotated with the base of their time.
      const double f = std::max(1.0, s.factor), d = c.rope_dim;
      c.rope_freq_base = static_cast<float>(c.rope_freq_base * std::pow(f * f - f + 1, d / (d - 2)));
      c.n_ctx_train = static_cast<int>(std::min(c.n_ctx_train * f, static_cast<double>(int64_t{1} << 30)));
    } else if (s.type == "longrope") {
      // Phi-3: per-pair divisors, long ones when the context exceeds the original (always, at
      // the model's own context: see read_phi3 in loader_gguf.cpp), q and k scaled as below.
      const int64_t original = h.original_max_position_embeddings > 0 ? h.original_max_position_embeddings
                                                                      : s.original_max_position_embeddings;
      if (original <= 0) fail(dir, "/config.json: longrope needs original_max_position_embeddings");
      c.rope_original_ctx = narrow(original, "original_max_position_embeddings");
      const auto& factors = c.n_ctx_train > c.rope_original_ctx ? s.long_factor : s.short_factor;
      if (static_cast<int64_t>(factors.size()) != c.rope_dim / 2)
        fail(dir, "/config.json: rope_scaling has ", factors.size(), " factors, expected one per rotated pair (",
             c.rope_dim / 2, ")");
      if (c.n_ctx_train > c.rope_original_ctx) {
        c.rope_attn_factor = static_cast<float>(
            s.attention_factor > 0 ? s.attention_factor : longrope_attn_factor(c.n_ctx_train, c.rope_original_ctx));
      }
    } else if (s.type != "default") {
      fail(dir, "/config.json: rope_scaling type '", s.type,
           "' is not supported (llama3, linear, dynamic, yarn, longrope)");
    }
  }
  c.validate();
  return c;
}

struct HFBinder {
  const SafetensorsModel& st;
  ModelWeights& w;
  WeightQuantConfig quant;

  const SafetensorsTensor& find(const std::string& name) {
    const SafetensorsTensor* t = st.find_tensor(name);
    if (!t) fail(st.name(), ": missing tensor '", name, "'");
    if (t->dtype != DType::F32 && t->dtype != DType::F16 && t->dtype != DType::BF16)
      fail(st.name(), ": tensor '", name, "' has type ", safetensors_dtype_name(t->stored),
           ", expected F32, F16 or BF16");
    return *t;
  }

  WeightMatrix matrix(const std::string& name, int64_t rows, int64_t cols) {
    // A quantized linear layer keeps its tensors beside the name without ".weight".
    constexpr std::string_view kWeight = ".weight";
    if (name.size() > kWeight.size() && name.ends_with(kWeight)) {
      WeightMatrix q;
      if (load_quantized_linear(st, quant, name.substr(0, name.size() - kWeight.size()), rows, cols, w, &q)) return q;
    }
    const SafetensorsTensor& t = find(name);
    if (t.shape.size() != 2 || t.shape[0] != rows || t.shape[1] != cols)
      fail(st.name(), ": tensor '", name, "' has shape ", shape_str(t), ", expected [", rows, ", ", cols, "]");
    w.weight_bytes += static_cast<int64_t>(t.n_bytes);
    return WeightMatrix{t.data, t.dtype, rows, cols};
  }

  const float* vector(const std::string& name, int64_t n, bool optional = false) {
    if (optional && !st.find_tensor(name)) return nullptr;
    const SafetensorsTensor& t = find(name);
    if (t.shape.size() != 1 || t.shape[0] != n)
      fail(st.name(), ": tensor '", name, "' has shape ", shape_str(t), ", expected [", n, "]");
    w.weight_bytes += static_cast<int64_t>(t.n_bytes);
    float* out = w.make_f32(n);
    dequantize_row(t.dtype, t.data, out, n);
    return out;
  }

  static std::string shape_str(const SafetensorsTensor& t) {
    std::string s = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
    return s + "]";
  }
};

// The per-layer KV-cache scales of fp8 checkpoints: all layers or none, each a scalar ([] or
// [1]) that is finite and positive. Names as vLLM reads them: self_attn.k_scale / v_scale
// (vLLM, LLM Compressor), else ModelOpt's k_proj / v_proj.output_scale, else the deprecated
// single self_attn.kv_scale (older AutoFP8) for both K and V.
void bind_kv_scales(const SafetensorsModel& st, ModelWeights& w) {
  const int n_layer = w.config.n_layer;
  for (const char* which : {"k", "v"}) {
    std::vector<float>& out = which[0] == 'k' ? w.k_scale : w.v_scale;
    for (int l = 0; l < n_layer; ++l) {
      const std::string attn = "model.layers." + std::to_string(l) + ".self_attn.";
      const SafetensorsTensor* t = nullptr;
      std::string name;
      for (const std::string& candidate :
           {attn + which + "_scale", attn + which + "_proj.output_scale", attn + "kv_scale"}) {
        t = st.find_tensor(candidate);
        name = candidate;
        if (t) break;
      }
      if (!t) {
        TESSERA_CHECK(out.empty(), st.name(), ": '", attn, which, "_scale' is missing while layer 0 has one");
        break;
      }
      TESSERA_CHECK(t->n_elements() == 1 && t->shape.size() <= 1, st.name(), ": '", name, "' is not a scalar");
      TESSERA_CHECK(t->dtype == DType::F32 || t->dtype == DType::F16 || t->dtype == DType::BF16, st.name(), ": '", name,
                    "' has type ", safetensors_dtype_name(t->stored), ", expected F32, F16 or BF16");
      float v = 0;
      dequantize_row(t->dtype, t->data, &v, 1);
      TESSERA_CHECK(std::isfinite(v) && v > 0, st.name(), ": '", name, "' is ", v, " (finite, > 0)");
      out.push_back(v);
    }
  }
}

}  // namespace

std::shared_ptr<ModelWeights> load_safetensors_weights(const std::string& dir) {
  auto st = std::shared_ptr<SafetensorsModel>(SafetensorsModel::open(dir));
  auto w = std::make_shared<ModelWeights>();
  const HFConfig hf = load_hf_config(dir);
  w->config = config_from_hf(hf, dir);
  w->source = dir;
  w->owners.push_back(st);
  HFBinder bind{*st, *w, load_weight_quant_config(dir)};
  // Tied checkpoints may still ship lm_head; the config decides.
  bind_llama_tensors(bind, *w, kHfLlamaNames);
  bind_kv_scales(*st, *w);
  if (hf.rope_scaling && hf.rope_scaling->type == "longrope") {  // divisors chosen as config_from_hf says
    const ModelConfig& c = w->config;
    const auto& factors =
        c.n_ctx_train > c.rope_original_ctx ? hf.rope_scaling->long_factor : hf.rope_scaling->short_factor;
    float* f = w->make_f32(factors.size());
    for (size_t i = 0; i < factors.size(); ++i) f[i] = static_cast<float>(factors[i]);
    w->rope_freq_factors = f;
  }
  return w;
}

}  // namespace tessera
