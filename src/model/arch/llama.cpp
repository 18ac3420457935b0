// Llama-family decoder (Llama 2/3, Mistral, SmolLM2, Qwen2 with QKV bias): pre-norm blocks of
// RMSNorm → GQA attention with RoPE → residual → RMSNorm → SwiGLU FFN → residual.
#include <cmath>
#include <memory>
#include <utility>

#include "core/error.h"
#include "model/arch/arch.h"

namespace tessera {

namespace {

class LlamaModel final : public Model {
 public:
  LlamaModel(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens, int max_logits)
      : w_(make_resident(std::move(weights), backend)),
        be_(backend),
        bufs_(backend),
        c_(w_->config),
        max_tokens_(max_tokens),
        max_logits_(max_logits) {
    TESSERA_CHECK(max_tokens >= 1 && max_logits >= 1 && max_logits <= max_tokens, "llama: bad batch limits ",
                  max_tokens, "/", max_logits);
    q_dim_ = static_cast<int64_t>(c_.n_head) * c_.head_dim;
    kv_dim_ = static_cast<int64_t>(c_.n_head_kv) * c_.head_dim;
    const int64_t t = max_tokens;
    // The residual stream alternates between two buffers: each pre-norm writes x + residual
    // into the other one (add_rms_norm_matmul), so a backend can fold the norm into the
    // product that follows without a second kernel or an in-place race.
    x_ = buf(t * c_.n_embd);
    x2_ = buf(t * c_.n_embd);
    xn_ = buf(t * c_.n_embd);
    tmp_ = buf(t * c_.n_embd);
    // Q, K and V side by side in one row (vLLM's qkv_proj layout), gate and up likewise: a
    // backend may then run each group as one product, and RoPE rotates Q and K in one call.
    qkv_ld_ = q_dim_ + 2 * kv_dim_;
    q_ = buf(t * qkv_ld_);  // [t, q_dim | kv_dim | kv_dim]
    k_ = q_ + q_dim_;
    v_ = k_ + kv_dim_;
    att_ = buf(t * q_dim_);
    gate_ = buf(t * 2 * c_.n_ff);  // [t, n_ff | n_ff]
    up_ = gate_ + c_.n_ff;
    h_ = buf(t * c_.n_ff);
    rows_ = buf(static_cast<int64_t>(max_logits) * c_.n_embd);
    logits_ = buf(static_cast<int64_t>(max_logits) * c_.n_vocab);
    rope_ = rope_config_for(c_, c_.rope_freq_base, w_->rope_freq_factors, /*with_scaling=*/true);
  }

  const ModelConfig& config() const override { return c_; }
  int max_batch_tokens() const override { return max_tokens_; }
  int max_logits_rows() const override { return max_logits_; }

  // Token ids and positions were checked on the host by the ModelRunner; the sizes here.
  const float* forward(const ForwardInputs& in, KvCache& kv) override {
    const AttentionBatch& ab = in.batch;
    const int n = ab.n_tokens;
    const int n_out = in.n_logits;
    TESSERA_CHECK(n >= 1 && n <= max_tokens_, "forward: batch of ", n, " tokens, limit ", max_tokens_);
    TESSERA_CHECK(n_out >= 0 && n_out <= max_logits_, "forward: ", n_out, " logits rows, limit ", max_logits_);
    const int e = c_.n_embd;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));

    float* x = x_;        // the residual stream: [n, e]
    float* x_next = x2_;  // where the next pre-norm writes x + residual
    be_.embed(w_->tok_embd, in.tokens, n, x);
    for (int il = 0; il < c_.n_layer; ++il) {
      const LayerWeights& L = w_->layers[il];
      const KvLayerView kvl = kv.layer(il);
      const MatmulTarget qkv[] = {{L.wq, q_, qkv_ld_}, {L.wk, k_, qkv_ld_}, {L.wv, v_, qkv_ld_}};
      // q, k, v = W_qkv · norm(x): [n, q_dim | kv_dim | kv_dim] at stride qkv_ld, after folding
      // the previous layer's FFN output into the residual stream
      if (il == 0) {
        be_.rms_norm(x, L.attn_norm, xn_, n, e, c_.rms_eps);
        be_.matmul(xn_, n, e, qkv);
      } else {
        be_.add_rms_norm_matmul(x, tmp_, L.attn_norm, x_next, xn_, n, e, c_.rms_eps, qkv);
        std::swap(x, x_next);
      }
      if (L.bq) {
        be_.add_bias(q_, qkv_ld_, L.bq, n, static_cast<int>(q_dim_));
        be_.add_bias(k_, qkv_ld_, L.bk, n, static_cast<int>(kv_dim_));
        be_.add_bias(v_, qkv_ld_, L.bv, n, static_cast<int>(kv_dim_));
      }
      // Q and K rotated, K and V into the cache (K's heads follow Q's in the row), then the
      // attention over it.                                               att: [n, q_dim]
      be_.rope_kv_store_attention(q_, qkv_ld_, c_.n_head, k_, qkv_ld_, v_, qkv_ld_, kvl, ab, rope_, scale, att_,
                                  q_dim_);
      const MatmulTarget o[] = {{L.wo, tmp_, e}};
      be_.matmul(att_, n, q_dim_, o);  // tmp: [n, e]
      // gate, up = W_gate|up · norm(x + tmp): [n, n_ff | n_ff]; then tmp = W_down · silu(gate)·up: [n, e]
      be_.add_rms_norm_swiglu_ffn(x, tmp_, L.ffn_norm, x_next, xn_, n, e, c_.rms_eps, {L.w_gate, gate_, 2 * c_.n_ff},
                                  {L.w_up, up_, 2 * c_.n_ff}, h_, {L.w_down, tmp_, e});
      std::swap(x, x_next);
    }
    if (n_out == 0) return logits_;
    be_.add(x, tmp_, static_cast<int64_t>(n) * e);
    // Only the wanted rows go through the final norm and the (large) output matrix.
    be_.gather_rows(x, e, in.logits_rows, n_out, e, rows_);
    be_.rms_norm(rows_, w_->output_norm, rows_, n_out, e, c_.rms_eps);
    const MatmulTarget out[] = {{w_->output, logits_, c_.n_vocab}};
    be_.matmul(rows_, n_out, e, out);  // logits: [n_out, n_vocab]
    return logits_;
  }

 private:
  float* buf(int64_t n) { return bufs_.floats(n); }

  std::shared_ptr<const ModelWeights> w_;
  Backend& be_;
  BackendBuffers bufs_;
  const ModelConfig& c_;
  int max_tokens_, max_logits_;
  int64_t q_dim_ = 0, kv_dim_ = 0, qkv_ld_ = 0;
  RopeConfig rope_;
  float *x_, *x2_, *xn_, *tmp_, *q_, *k_, *v_, *att_, *gate_, *up_, *h_, *rows_, *logits_;
};

}  // namespace

std::unique_ptr<Model> make_llama_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens,
                                        int max_logits) {
  return std::make_unique<LlamaModel>(std::move(weights), backend, max_tokens, max_logits);
}

}  // namespace tessera
