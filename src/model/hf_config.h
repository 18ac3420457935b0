#pragma once
// A Hugging Face config.json read into a plain struct, for models shipped as safetensors.
// Only what a llama-family decoder (Llama, Mistral, Qwen2/3, SmolLM) needs is read; other
// fields are ignored. Fields of the wrong JSON type, required fields that are missing and
// values out of range are errors naming the field.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

struct HFRopeScaling {
  std::string type;  // "rope_type" (or the older "type"): "linear", "dynamic", "yarn", "llama3", ...
  double factor = 1.0;
  double low_freq_factor = 1.0;                   // llama3
  double high_freq_factor = 4.0;                  // llama3
  int64_t original_max_position_embeddings = 0;   // 0 when absent
  double attention_factor = 0;                    // yarn: q/k magnitude; 0 when absent (0.1 ln(factor) + 1)
  double beta_fast = 32, beta_slow = 1;           // yarn
  std::vector<double> short_factor, long_factor;  // longrope (Phi-3): per-pair frequency divisors
};

struct HFConfig {
  std::string architecture;  // architectures[0], e.g. "LlamaForCausalLM" (required)
  std::string model_type;    // "llama", "qwen2", ... (empty when absent)
  // Required.
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t vocab_size = 0;
  // Optional, with transformers' LlamaConfig defaults.
  int64_t num_key_value_heads = 0;  // default num_attention_heads; must divide it
  int64_t head_dim = 0;             // default hidden_size / num_attention_heads (must divide)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t max_position_embeddings = 2048;
  int64_t original_max_position_embeddings = 0;  // Phi-3 keeps it beside rope_scaling; 0 when absent
  double partial_rotary_factor = 1.0;            // fraction of each head that rotates (Phi-4-mini: 0.75)
  bool tie_word_embeddings = false;
  std::vector<int64_t> bos_token_ids;  // an int or a list in the file; empty when absent or null
  std::vector<int64_t> eos_token_ids;
  std::optional<HFRopeScaling> rope_scaling;  // absent or null: none
  int64_t sliding_window = 0;                 // keys a query sees (Mistral); 0 when absent or null
  bool use_sliding_window = true;             // false in Qwen 2/3's configs: the window is then off
  bool attention_bias = false;                // biases on q, k, v and o projections
  bool qkv_bias = false;                      // biases on q, k and v: attention_bias, or always for Qwen2
  std::string torch_dtype;                    // "bfloat16", "float16", "float32" (or "dtype"); empty when absent
  // Mixture of experts (Mixtral: num_local_experts; Qwen3-MoE: num_experts, moe_intermediate_size).
  int64_t num_experts = 0;  // 0: a dense model
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;            // 0 when absent: intermediate_size
  bool norm_topk_prob = true;                   // renormalize the chosen experts' weights (Mixtral always does)
  int64_t decoder_sparse_step = 1;              // Qwen-MoE: every step-th layer is sparse
  bool has_mlp_only_layers = false;             // Qwen-MoE: a non-empty list of layers kept dense
  int64_t shared_expert_intermediate_size = 0;  // Qwen2-MoE's shared expert (not supported)
};

// Parses config.json text; `name` starts every error message.
HFConfig parse_hf_config(std::string_view json_text, std::string_view name = "config.json");
// Reads `path`, a config.json or a directory holding one.
HFConfig load_hf_config(const std::string& path);

}  // namespace tessera
