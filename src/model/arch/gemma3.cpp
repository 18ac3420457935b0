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
        bufs_(backend),
        c_(w_->config),
        max_tokens_(max_tokens),
        max_logits_(max_logits) {
    TESSERA_CHECK(max_tokens >= 1 && max_logits >= 1 && max_logits <= max_tokens, "gemma3: bad batch limits ",
                  max_tokens, "/", max_logits);
    TESSERA_CHECK(c_.sliding_window >= 1 && c_.sliding_window_pattern >= 1 && c_.attn_scale > 0,
                  "gemma3: the config lacks the sliding window, its layer pattern or the attention scale");
    for (const LayerWeights& L : w_->layers)
      TESSERA_CHECK(L.q_norm && L.k_norm && L.post_attn_norm && L.post_ffn_norm,
                    "gemma3: a layer lacks its Q/K or post-attention/post-FFN norm");
    q_dim_ = static_cast<int64_t>(c_.n_head) * c_.head_dim;
    kv_dim_ = static_cast<int64_t>(c_.n_head_kv) * c_.head_dim;
    const int64_t t = max_tokens;
    // As in the Llama runner: the residual stream alternates between two buffers, Q|K|V and
    // gate|up share rows.
    x_ = bufs_.floats(t * c_.n_embd);
    x2_ = bufs_.floats(t * c_.n_embd);
    xn_ = bufs_.floats(t * c_.n_embd);
    tmp_ = bufs_.floats(t * c_.n_embd);
    qkv_ld_ = q_dim_ + 2 * kv_dim_;
    q_ = bufs_.floats(t * qkv_ld_);  // [t, q_dim | kv_dim | kv_dim]
    k_ = q_ + q_dim_;
    v_ = k_ + kv_dim_;
    att_ = bufs_.floats(t * q_dim_);
    gate_ = bufs_.floats(t * 2 * c_.n_ff);  // [t, n_ff | n_ff]
    up_ = gate_ + c_.n_ff;
    h_ = bufs_.floats(t * c_.n_ff);
    rows_ = bufs_.floats(static_cast<int64_t>(max_logits) * c_.n_embd);
    logits_ = bufs_.floats(static_cast<int64_t>(max_logits) * c_.n_vocab);
    rope_global_ = rope_config_for(c_, c_.rope_freq_base, w_->rope_freq_factors, /*with_scaling=*/true);
    rope_local_ = rope_config_for(c_, c_.rope_freq_base_local, nullptr, /*with_scaling=*/false);
  }

  const ModelConfig& config() const override { return c_; }
  int max_batch_tokens() const override { return max_tokens_; }
  int max_logits_rows() const override { return max_logits_; }

  const float* forward(const ForwardInputs& in, KvCache& kv) override {
    const AttentionBatch& ab = in.batch;
    const int n = ab.n_tokens;
    const int n_out = in.n_logits;
    TESSERA_CHECK(n >= 1 && n <= max_tokens_, "forward: batch of ", n, " tokens, limit ", max_tokens_);
    TESSERA_CHECK(n_out >= 0 && n_out <= max_logits_, "forward: ", n_out, " logits rows, limit ", max_logits_);
    const int e = c_.n_embd;
    AttentionBatch local = ab;  // the local layers' batch: the same rows, a sliding window
    local.window = c_.sliding_window;
    AttentionBatch global = ab;
    global.window = 0;

    float* x = x_;        // the residual stream: [n, e]
    float* x_next = x2_;  // where the next pre-norm writes x + residual
    be_.embed(w_->tok_embd, in.tokens, n, x);
    be_.scale(x, std::sqrt(static_cast<float>(e)), static_cast<int64_t>(n) * e);
    for (int il = 0; il < c_.n_layer; ++il) {
      const LayerWeights& L = w_->layers[il];
      const bool is_local = c_.is_local_layer(il);
      const MatmulTarget qkv[] = {{L.wq, q_, qkv_ld_}, {L.wk, k_, qkv_ld_}, {L.wv, v_, qkv_ld_}};
      // q, k, v = W_qkv · norm(x): [n, q_dim | kv_dim | kv_dim] at stride qkv_ld, after folding
      // the previous layer's (post-normed) FFN output into the residual stream
      if (il == 0) {
        be_.rms_norm(x, L.attn_norm, xn_, n, e, c_.rms_eps);
        be_.matmul(xn_, n, e, qkv);
      } else {
        be_.add_rms_norm_matmul(x, tmp_, L.attn_norm, x_next, xn_, n, e, c_.rms_eps, qkv);
        std::swap(x, x_next);
      }
      // QK-norm: each head of q and k RMS-normed before RoPE
      be_.rms_norm_heads(q_, qkv_ld_, n, c_.n_head, c_.head_dim, L.q_norm, c_.rms_eps);
      be_.rms_norm_heads(k_, qkv_ld_, n, c_.n_head_kv, c_.head_dim, L.k_norm, c_.rms_eps);
      be_.rope_kv_store_attention(q_, qkv_ld_, c_.n_head, k_, qkv_ld_, v_, qkv_ld_, kv.layer(il),
                                  is_local ? local : global, is_local ? rope_local_ : rope_global_, c_.attn_scale, att_,
                                  q_dim_);  // att: [n, q_dim]
      const MatmulTarget o[] = {{L.wo, tmp_, e}};
      be_.matmul(att_, n, q_dim_, o);                                // tmp: [n, e]
      be_.rms_norm(tmp_, L.post_attn_norm, tmp_, n, e, c_.rms_eps);  // post-attention norm
      // gate, up = W_gate|up · norm(x + tmp): [n, n_ff | n_ff]
      const MatmulTarget gate_up[] = {{L.w_gate, gate_, 2 * c_.n_ff}, {L.w_up, up_, 2 * c_.n_ff}};
      be_.add_rms_norm_matmul(x, tmp_, L.ffn_norm, x_next, xn_, n, e, c_.rms_eps, gate_up);
      std::swap(x, x_next);
      be_.geglu(gate_, up_, 2 * c_.n_ff, h_, n, c_.n_ff);  // h: [n, n_ff]
      const MatmulTarget down[] = {{L.w_down, tmp_, e}};
      be_.matmul(h_, n, c_.n_ff, down);                             // tmp: [n, e]
      be_.rms_norm(tmp_, L.post_ffn_norm, tmp_, n, e, c_.rms_eps);  // post-FFN norm
    }
    if (n_out == 0) return logits_;
    be_.add(x, tmp_, static_cast<int64_t>(n) * e);
    be_.gather_rows(x, e, in.logits_rows, n_out, e, rows_);
    be_.rms_norm(rows_, w_->output_norm, rows_, n_out, e, c_.rms_eps);
    const MatmulTarget out[] = {{w_->output, logits_, c_.n_vocab}};
    be_.matmul(rows_, n_out, e, out);  // logits: [n_out, n_vocab]
    return logits_;
  }

 private:
  std::shared_ptr<const ModelWeights> w_;
  Backend& be_;
  BackendBuffers bufs_;
  const ModelConfig& c_;
  int max_tokens_, max_logits_;
  int64_t q_dim_ = 0, kv_dim_ = 0, qkv_ld_ = 0;
  RopeConfig rope_global_, rope_local_;
  float *x_, *x2_, *xn_, *tmp_, *q_, *k_, *v_, *att_, *gate_, *up_, *h_, *rows_, *logits_;
};

}  // namespace

std::unique_ptr<Model> make_gemma3_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens,
                                         int max_logits) {
  return std::make_unique<Gemma3Model>(std::move(weights), backend, max_tokens, max_logits);
}

}  // namespace tessera
