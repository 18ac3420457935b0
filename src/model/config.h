#pragma once
// What the model code needs to know about a checkpoint, from GGUF metadata or config.json.
#include <cmath>
#include <cstdint>
#include <string>

namespace tessera {

struct ModelConfig {
  std::string arch;  // "llama" (Llama 2/3, Mistral, Mixtral, SmolLM2), "mistral", "qwen2", "qwen3", "qwen3moe",
                     // "phi3" or "gemma3"
  std::string name;  // general.name or the checkpoint's directory name
  int n_vocab = 0;
  int n_embd = 0;  // model width
  int n_layer = 0;
  int n_head = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  int n_ff = 0;         // FFN hidden width
  int n_ctx_train = 0;  // trained context length
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  int rope_dim = 0;          // rotated elements per head
  bool rope_neox = false;    // GGUF llama permutes Q/K to interleaved pairs; HF and Qwen2 use halves
  std::string rope_scaling;  // "", "linear", "llama3" or "yarn"
  float rope_scaling_factor = 0.0f;
  float rope_low_freq_factor = 1.0f;
  float rope_high_freq_factor = 4.0f;
  int rope_original_ctx = 0;  // llama3, yarn: the context the model was pretrained at
  float rope_yarn_beta_fast = 32.0f;
  float rope_yarn_beta_slow = 1.0f;
  // YaRN's attention magnitude: q and k scaled by it, so attention logits by its square
  // (0.1 ln(factor) + 1 unless the config says otherwise); Phi-3's LongRoPE factor
  // sqrt(1 + ln(ctx / original) / ln(original)); 1 for other scalings.
  float rope_attn_factor = 1.0f;
  bool qkv_bias = false;  // Qwen2
  bool qk_norm = false;   // Qwen 3, Gemma 3: each head of Q and K RMS-normed (own weights) before RoPE
  bool tied_embeddings = false;
  // Local (sliding-window) layers. Gemma 3: interleaved with global ones, with their own RoPE
  // base; every sliding_window_pattern-th layer (il % pattern == pattern - 1) is global.
  // Mistral: pattern 0, every layer local.
  int sliding_window = 0;  // keys a local layer's query sees, itself included; 0 = no local layers
  int sliding_window_pattern = 0;
  float rope_freq_base_local = 10000.0f;
  float attn_scale = 0.0f;  // query scale (query_pre_attn_scalar^-1/2); 0 = 1/sqrt(head_dim)
  // Mixture of experts (Mixtral, Qwen3-MoE): every layer's FFN is n_expert SwiGLU experts of
  // width n_ff, n_expert_used of them per token (top-k of the router's softmax, weights
  // renormalized over the chosen ones unless moe_renormalize is off). 0 = a dense FFN.
  int n_expert = 0;
  int n_expert_used = 0;
  bool moe_renormalize = true;  // false: the chosen experts keep their softmax weights (HF norm_topk_prob)

  bool is_local_layer(int il) const {
    if (sliding_window <= 0) return false;
    return sliding_window_pattern == 0 || il % sliding_window_pattern < sliding_window_pattern - 1;
  }

  // Throws tessera::Error naming the first field that is out of range or inconsistent.
  void validate() const;
  int64_t n_params() const;  // weights of the transformer, embeddings included once
  // Those a token computes with: of a MoE layer's experts only the n_expert_used it is routed to.
  int64_t n_active_params() const {
    return n_params() - static_cast<int64_t>(n_layer) * (n_expert - n_expert_used) * 3 * n_embd * n_ff;
  }
};

// YaRN's default attention magnitude, 0.1 ln(factor) + 1, and LongRoPE's,
// sqrt(1 + ln(ctx / original) / ln(original)): the GGUF and config.json loaders both use them.
inline double yarn_attn_factor(double factor) { return 0.1 * std::log(factor > 1 ? factor : 1.0) + 1; }
inline double longrope_attn_factor(double ctx, double original) {
  return std::sqrt(1 + std::log(ctx / original) / std::log(original));
}

// Hard limits on what a model file may ask for, so a bad file cannot make us allocate
// absurd amounts before failing.
constexpr int kMaxLayers = 1024;
constexpr int kMaxWidth = 1 << 17;
constexpr int kMaxVocab = 1 << 22;
constexpr int kMaxHeads = 1024;
constexpr int kMaxExperts = 1024;

}  // namespace tessera
