#include "model/config.h"

#include <cmath>

#include "core/error.h"

namespace tessera {

void ModelConfig::validate() const {
  auto in = [](int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; };
  TESSERA_CHECK(in(n_layer, 1, kMaxLayers), "model config: layer count ", n_layer, " is outside [1, ", kMaxLayers, "]");
  TESSERA_CHECK(in(n_embd, 1, kMaxWidth), "model config: width ", n_embd, " is outside [1, ", kMaxWidth, "]");
  TESSERA_CHECK(in(n_ff, 1, 8 * kMaxWidth), "model config: FFN width ", n_ff, " is out of range");
  TESSERA_CHECK(in(n_vocab, 1, kMaxVocab), "model config: vocabulary size ", n_vocab, " is outside [1, ", kMaxVocab,
                "]");
  TESSERA_CHECK(in(n_head, 1, kMaxHeads), "model config: head count ", n_head, " is out of range");
  TESSERA_CHECK(in(n_head_kv, 1, n_head) && n_head % n_head_kv == 0, "model config: KV head count ", n_head_kv,
                " must divide the head count ", n_head);
  TESSERA_CHECK(in(head_dim, 2, 1024) && head_dim % 2 == 0, "model config: head dimension ", head_dim,
                " must be even and at most 1024");
  TESSERA_CHECK(in(rope_dim, 2, head_dim) && rope_dim % 2 == 0, "model config: RoPE dimension ", rope_dim,
                " must be even and at most the head dimension ", head_dim);
  TESSERA_CHECK(std::isfinite(rms_eps) && rms_eps > 0 && rms_eps < 1, "model config: RMS norm epsilon ", rms_eps,
                " is out of range");
  TESSERA_CHECK(std::isfinite(rope_freq_base) && rope_freq_base > 1, "model config: RoPE base ", rope_freq_base,
                " is out of range");
  TESSERA_CHECK(n_ctx_train >= 1, "model config: context length ", n_ctx_train, " must be positive");
  TESSERA_CHECK(rope_scaling.empty() || rope_scaling == "linear" || rope_scaling == "llama3" || rope_scaling == "yarn",
                "model config: unsupported RoPE scaling '", rope_scaling, "' (supported: linear, llama3, yarn)");
  if (rope_scaling == "yarn") {
    TESSERA_CHECK(rope_original_ctx >= 1, "model config: YaRN needs the original context length (", rope_original_ctx,
                  ")");
    TESSERA_CHECK(std::isfinite(rope_yarn_beta_fast) && std::isfinite(rope_yarn_beta_slow) &&
                      rope_yarn_beta_fast > rope_yarn_beta_slow && rope_yarn_beta_slow > 0,
                  "model config: YaRN beta_fast (", rope_yarn_beta_fast, ") must exceed beta_slow (",
                  rope_yarn_beta_slow, ") > 0");
    // The attention magnitude is folded into the attention scale, exact only when every
    // element of a head rotates.
    TESSERA_CHECK(rope_dim == head_dim, "model config: YaRN with partial rotary (", rope_dim, " of ", head_dim,
                  ") is not supported");
  }
  TESSERA_CHECK(std::isfinite(rope_attn_factor) && rope_attn_factor > 0 && rope_attn_factor < 16,
                "model config: RoPE attention factor ", rope_attn_factor, " is out of range");
  // It is folded into the attention scale, exact only when every element of a head rotates.
  TESSERA_CHECK(rope_attn_factor == 1.0f || rope_dim == head_dim, "model config: a RoPE attention factor with ",
                "partial rotary (", rope_dim, " of ", head_dim, ") is not supported");
  TESSERA_CHECK(in(n_expert, 0, kMaxExperts) && (n_expert == 0 ? n_expert_used == 0 : in(n_expert_used, 1, n_expert)),
                "model config: ", n_expert_used, " experts used of ", n_expert,
                " (need 1 <= used <= count <= ", kMaxExperts, ", or both 0)");
  if (arch == "gemma3") {
    TESSERA_CHECK(sliding_window >= 1 && sliding_window_pattern >= 1, "model config: gemma3 needs a sliding window (",
                  sliding_window, ") and a layer pattern (", sliding_window_pattern, ")");
    TESSERA_CHECK(std::isfinite(rope_freq_base_local) && rope_freq_base_local > 1, "model config: local RoPE base ",
                  rope_freq_base_local, " is out of range");
    TESSERA_CHECK(std::isfinite(attn_scale) && attn_scale > 0, "model config: attention scale ", attn_scale,
                  " is out of range");
  }
  if (!rope_scaling.empty())
    TESSERA_CHECK(std::isfinite(rope_scaling_factor) && rope_scaling_factor >= 1, "model config: RoPE scaling factor ",
                  rope_scaling_factor, " must be >= 1");
}

int64_t ModelConfig::n_params() const {
  const int64_t e = n_embd, q = static_cast<int64_t>(n_head) * head_dim,
                kv = static_cast<int64_t>(n_head_kv) * head_dim;
  // Gemma 3 adds two norms of the residual width; Gemma 3 and Qwen 3 the per-head Q and K norms.
  const int64_t extra_norms = (arch == "gemma3" ? 2 * e : 0) + (qk_norm ? 2 * head_dim : 0);
  // A MoE layer holds n_expert FFNs and the router's [n_expert, e] matrix.
  const int64_t ffn = n_expert > 0 ? n_expert * (3 * e * n_ff + e) : 3 * e * n_ff;
  const int64_t per_layer = e * q + 2 * e * kv + q * e + ffn + 2 * e + extra_norms;
  return n_layer * per_layer + static_cast<int64_t>(n_vocab) * e * (tied_embeddings ? 1 : 2) + e;
}

}  // namespace tessera
