// Gemma 3 decoder: embeddings scaled by sqrt(n_embd); blocks of RMSNorm → attention (QK-norm,
// RoPE, sliding window on the local layers) → RMSNorm → residual → RMSNorm → GeGLU FFN →
// RMSNorm → residual. Five local layers (window, RoPE base 10,000) per global one (full
// causal, the file's RoPE base and scaling). Norm weights are used as stored: GGUF's converter
// already folded Gemma's (1 + w) into them.
#include <cmath>
#include <memory>
#include <utility>

#include "core/error.h"
#include "model/arch/arch.h"

namespace tessera {

namespace {

class Gemma3Model final : public Model {
 public:
  Gemma3Model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens, int max_logits)
      : w_(make_resident(std::move(weights), backend)),
        be_(backend),
        a_(backend, w_->config, max_tokens, max_logits),
        c_(w_->config),
        max_tokens_(max_tokens),
        max_logits_(max_logits) {
    TESSERA_CHECK(c_.sliding_window >= 1 && c_.sliding_window_pattern >= 1 && c_.attn_scale > 0,
                  "gemma3: the config lacks the sliding window, its layer pattern or the attention scale");
    for (const LayerWeights& L : w_->layers)
      TESSERA_CHECK(L.q_norm && L.k_norm && L.post_attn_norm && L.post_ffn_norm,
                    "gemma3: a layer lacks its Q/K or post-attention/post-FFN norm");
    TESSERA_CHECK(c_.rope_scaling != "yarn", "gemma3: YaRN RoPE scaling is not supported");
    rope_global_ = rope_config_for(c_, c_.rope_freq_base, w_->rope_freq_factors, /*with_scaling=*/true);
    rope_local_ = rope_config_for(c_, c_.rope_freq_base_local, nullptr, /*with_scaling=*/false);
  }

  const ModelConfig& config() const override { return c_; }
  int max_batch_tokens() const override { return max_tokens_; }
  int max_logits_rows() const override { return max_logits_; }

  float* forward(const ForwardInputs& in, KvCache& kv) override {
    const AttentionBatch& ab = in.batch;
    const int n = ab.n_tokens;
    const int n_out = in.n_logits;
    TESSERA_CHECK(n >= 1 && n <= max_tokens_, "forward: batch of ", n, " tokens, limit ", max_tokens_);
    TESSERA_CHECK(n_out >= 0 && n_out <= max_logits_, "forward: ", n_out, " logits rows, limit ", max_logits_);
    const int e = c_.n_embd;
    // the local layers' batch: the same rows, a sliding window, their own tables if any
    const AttentionBatch local = in.local_batch(c_.sliding_window);
    AttentionBatch global = ab;
    global.window = 0;

    float* x = a_.x;        // the residual stream: [n, e]
    float* x_next = a_.x2;  // where the next pre-norm writes x + residual
    be_.embed(w_->tok_embd, in.tokens, n, x);
    be_.scale(x, std::sqrt(static_cast<float>(e)), static_cast<int64_t>(n) * e);
    for (int il = 0; il < c_.n_layer; ++il) {
      const LayerWeights& L = w_->layers[il];
      const bool is_local = c_.is_local_layer(il);
      const MatmulTarget qkv[] = {{L.wq, a_.q, a_.qkv_ld}, {L.wk, a_.k, a_.qkv_ld}, {L.wv, a_.v, a_.qkv_ld}};
      // q, k, v = W_qkv · norm(x): [n, q_dim | kv_dim | kv_dim] at stride qkv_ld, after folding
      // the previous layer's (post-normed) FFN output into the residual stream
      if (il == 0) {
        be_.rms_norm(x, L.attn_norm, a_.xn, n, e, c_.rms_eps);
        be_.matmul(a_.xn, n, e, qkv);
      } else {
        be_.add_rms_norm_matmul(x, a_.tmp, L.attn_norm, x_next, a_.xn, n, e, c_.rms_eps, qkv);
        std::swap(x, x_next);
      }
      // QK-norm: each head of q and k RMS-normed before RoPE
      be_.rms_norm_heads(a_.q, a_.qkv_ld, n, c_.n_head, c_.head_dim, L.q_norm, c_.rms_eps);
      be_.rms_norm_heads(a_.k, a_.qkv_ld, n, c_.n_head_kv, c_.head_dim, L.k_norm, c_.rms_eps);
      be_.rope_kv_store_attention(a_.q, a_.qkv_ld, c_.n_head, a_.k, a_.qkv_ld, a_.v, a_.qkv_ld, kv.layer(il),
                                  is_local ? local : global, is_local ? rope_local_ : rope_global_, c_.attn_scale,
                                  a_.att,
                                  a_.q_dim);  // att: [n, q_dim]
      const MatmulTarget o[] = {{L.wo, a_.tmp, e}};
      be_.matmul(a_.att, n, a_.q_dim, o);                                // tmp: [n, e]
      be_.rms_norm(a_.tmp, L.post_attn_norm, a_.tmp, n, e, c_.rms_eps);  // post-attention norm
      // gate, up = W_gate|up · norm(x + tmp): [n, n_ff | n_ff]
      const MatmulTarget gate_up[] = {{L.w_gate, a_.gate, 2 * c_.n_ff}, {L.w_up, a_.up, 2 * c_.n_ff}};
      be_.add_rms_norm_matmul(x, a_.tmp, L.ffn_norm, x_next, a_.xn, n, e, c_.rms_eps, gate_up);
      std::swap(x, x_next);
      be_.geglu(a_.gate, a_.up, 2 * c_.n_ff, a_.h, n, c_.n_ff);  // h: [n, n_ff]
      const MatmulTarget down[] = {{L.w_down, a_.tmp, e}};
      be_.matmul(a_.h, n, c_.n_ff, down);                               // tmp: [n, e]
      be_.rms_norm(a_.tmp, L.post_ffn_norm, a_.tmp, n, e, c_.rms_eps);  // post-FFN norm
    }
    return decoder_head(be_, *w_, a_, x, in);
  }

 private:
  std::shared_ptr<const ModelWeights> w_;
  Backend& be_;
  DecoderActivations a_;  // sized before the body runs: its constructor checks the limits
  const ModelConfig& c_;
  int max_tokens_, max_logits_;
  RopeConfig rope_global_, rope_local_;
};

}  // namespace

std::unique_ptr<Model> make_gemma3_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens,
                                         int max_logits) {
  return std::make_unique<Gemma3Model>(std::move(weights), backend, max_tokens, max_logits);
}

}  // namespace tessera
