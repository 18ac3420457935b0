// Llama-family decoder (Llama 2/3, Mistral, SmolLM2, Qwen2 with QKV bias, Qwen3 with QK-norm,
// Mixtral and Qwen3-MoE with mixture-of-experts FFNs): pre-norm blocks of RMSNorm → GQA
// attention with RoPE → residual → RMSNorm → SwiGLU FFN (or its experts) → residual. Mistral v0.1's and Phi-3's sliding windows apply to every layer; Phi-3's fused
// QKV and gate|up matrices are bound as row ranges (bind_llama.h), so its block is this one.
// A pipeline stage (model/pp/stage.h) runs its layers only, between a recv and a send of the
// residual stream.
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "core/error.h"
#include "model/arch/arch.h"
#include "model/arch/tensor_parallel.h"

namespace tessera {

namespace {

class LlamaModel final : public Model {
 public:
  LlamaModel(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens, int max_logits,
             ModelComms comms)
      : w_(make_resident(std::move(weights), backend)),
        be_(backend),
        a_(backend, w_->config, max_tokens, max_logits),
        tp_(backend, *w_, comms.tensor, max_logits),
        stages_(w_->stage.size > 1 ? comms.pipeline : nullptr),
        c_(w_->config),
        max_tokens_(max_tokens),
        max_logits_(max_logits) {
    rope_ = rope_config_for(c_, c_.rope_freq_base, w_->rope_freq_factors, /*with_scaling=*/true);
    const PipelineStage& st = w_->stage;
    if (st.size > 1) {
      TESSERA_CHECK(stages_ && stages_->size() == st.size && stages_->rank() == st.index, c_.arch, ": pipeline stage ",
                    st.index, " of ", st.size, " needs the pipeline's communicator");
    }
    if (c_.qk_norm)
      for (const LayerWeights& L : w_->layers)
        TESSERA_CHECK(L.q_norm && L.k_norm, c_.arch, ": a layer lacks its Q or K norm");
    if (c_.n_expert > 0)
      for (const LayerWeights& L : w_->layers) {
        TESSERA_CHECK(L.gate_exps.size() == static_cast<size_t>(c_.n_expert) &&
                          L.up_exps.size() == L.gate_exps.size() && L.down_exps.size() == L.gate_exps.size() &&
                          L.router.data,
                      c_.arch, ": a layer lacks its router or experts");
        moe_.push_back(MoeFfnWeights{L.router, L.gate_exps.data(), L.up_exps.data(), L.down_exps.data(), c_.n_expert,
                                     c_.n_expert_used, c_.n_ff, c_.moe_renormalize});
      }
  }

  const ModelConfig& config() const override { return c_; }
  int max_batch_tokens() const override { return max_tokens_; }
  int max_logits_rows() const override { return max_logits_; }

  // Token ids and positions were checked on the host by the ModelRunner; the sizes here.
  float* forward(const ForwardInputs& in, KvCache& kv) override {
    const AttentionBatch& ab = in.batch;
    const int n = ab.n_tokens;
    const int n_out = in.n_logits;
    TESSERA_CHECK(n >= 1 && n <= max_tokens_, "forward: batch of ", n, " tokens, limit ", max_tokens_);
    TESSERA_CHECK(n_out >= 0 && n_out <= max_logits_, "forward: ", n_out, " logits rows, limit ", max_logits_);
    const int e = c_.n_embd;
    // YaRN's attention magnitude scales q and k; folded in here (its square on the logits)
    const float scale = c_.rope_attn_factor * c_.rope_attn_factor / std::sqrt(static_cast<float>(c_.head_dim));
    // the batch of the sliding-window layers (Mistral v0.1), on their own tables if any
    const AttentionBatch local = in.local_batch(c_.sliding_window);

    float* x = a_.x;        // the residual stream: [n, e]
    float* x_next = a_.x2;  // where the next pre-norm writes x + residual
    const PipelineStage& st = w_->stage;
    // Before any op: a stage that fails after its layers would leave the next one waiting.
    TESSERA_CHECK(st.last() || n_out == 0, "forward: pipeline stage ", st.index, " of ", st.size, " asked for logits");
    if (st.first())
      tp_.embed(in.tokens, n, x);
    else  // a later pipeline stage: the residual stream after the stage before's layers
      stages_->recv(x, static_cast<int64_t>(n) * e, st.index - 1);
    for (int il = 0; il < c_.n_layer; ++il) {
      const LayerWeights& L = w_->layers[il];
      const KvLayerView kvl = kv.layer(il);
      const MatmulTarget qkv[] = {{L.wq, a_.q, a_.qkv_ld}, {L.wk, a_.k, a_.qkv_ld}, {L.wv, a_.v, a_.qkv_ld}};
      // q, k, v = W_qkv · norm(x): [n, q_dim | kv_dim | kv_dim] at stride qkv_ld, after folding
      // the previous layer's FFN output into the residual stream
      if (il == 0) {
        be_.rms_norm(x, L.attn_norm, a_.xn, n, e, c_.rms_eps);
        be_.matmul(a_.xn, n, e, qkv);
      } else {
        be_.add_rms_norm_matmul(x, a_.tmp, L.attn_norm, x_next, a_.xn, n, e, c_.rms_eps, qkv);
        std::swap(x, x_next);
      }
      if (L.bq) {
        be_.add_bias(a_.q, a_.qkv_ld, L.bq, n, static_cast<int>(a_.q_dim));
        be_.add_bias(a_.k, a_.qkv_ld, L.bk, n, static_cast<int>(a_.kv_dim));
        be_.add_bias(a_.v, a_.qkv_ld, L.bv, n, static_cast<int>(a_.kv_dim));
      }
      if (c_.qk_norm) {  // Qwen3: each head of q and k RMS-normed before RoPE
        be_.rms_norm_heads(a_.q, a_.qkv_ld, n, c_.n_head, c_.head_dim, L.q_norm, c_.rms_eps);
        be_.rms_norm_heads(a_.k, a_.qkv_ld, n, c_.n_head_kv, c_.head_dim, L.k_norm, c_.rms_eps);
      }
      // Q and K rotated, K and V into the cache (K's heads follow Q's in the row), then the
      // attention over it.                                               att: [n, q_dim]
      be_.rope_kv_store_attention(a_.q, a_.qkv_ld, c_.n_head, a_.k, a_.qkv_ld, a_.v, a_.qkv_ld, kvl,
                                  c_.is_local_layer(il) ? local : ab, rope_, scale, a_.att, a_.q_dim);
      const MatmulTarget o[] = {{L.wo, a_.tmp, e}};
      be_.matmul(a_.att, n, a_.q_dim, o);               // tmp: [n, e]
      tp_.reduce(a_.tmp, static_cast<int64_t>(n) * e);  // tensor parallel: the ranks' partial sums
      if (!moe_.empty()) {
        // x += tmp; tmp = the experts' weighted sum on norm(x): [n, e]
        be_.add_rms_norm(x, a_.tmp, L.ffn_norm, a_.xn, n, e, c_.rms_eps);
        be_.moe_ffn(a_.xn, n, e, moe_[il], a_.tmp);
        continue;
      }
      // gate, up = W_gate|up · norm(x + tmp): [n, n_ff | n_ff]; then tmp = W_down · silu(gate)·up: [n, e]
      be_.add_rms_norm_swiglu_ffn(x, a_.tmp, L.ffn_norm, x_next, a_.xn, n, e, c_.rms_eps,
                                  {L.w_gate, a_.gate, 2 * c_.n_ff}, {L.w_up, a_.up, 2 * c_.n_ff}, a_.h,
                                  {L.w_down, a_.tmp, e});
      tp_.reduce(a_.tmp, static_cast<int64_t>(n) * e);
      std::swap(x, x_next);
    }
    if (!st.last()) {
      // The last layer's FFN output joins the residual stream, which the next stage goes on from.
      be_.add(x, a_.tmp, static_cast<int64_t>(n) * e);
      stages_->send(x, static_cast<int64_t>(n) * e, st.index + 1);
      return a_.logits;
    }
    return tp_.head(a_, x, in);
  }

 private:
  std::shared_ptr<const ModelWeights> w_;
  Backend& be_;
  DecoderActivations a_;  // sized before the body runs: its constructor checks the limits
  TensorParallelOps tp_;  // the collectives of a tensor-parallel shard; plain ops otherwise
  Communicator* stages_;  // a pipeline stage's group (receives from index - 1, sends to index + 1); else null
  const ModelConfig& c_;
  int max_tokens_, max_logits_;
  RopeConfig rope_;
  std::vector<MoeFfnWeights> moe_;  // per layer, for a mixture-of-experts model
};

}  // namespace

std::unique_ptr<Model> make_llama_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens,
                                        int max_logits, ModelComms comms) {
  return std::make_unique<LlamaModel>(std::move(weights), backend, max_tokens, max_logits, comms);
}

}  // namespace tessera
