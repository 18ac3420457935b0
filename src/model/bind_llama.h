#pragma once
// The tensors of a Llama-family checkpoint, bound once for every file format. A format
// supplies its tensor names and a binder with
//   WeightMatrix matrix(name, rows, cols)   and   const float* vector(name, n, optional)
// that find, check and convert one tensor (naming it in any error).
#include <string>

#include "core/error.h"
#include "model/weights.h"

namespace tessera {

struct LlamaTensorNames {
  const char* tok_embd;
  const char* output;
  const char* output_norm;
  const char* layer_prefix;  // followed by the layer index and a '.'
  const char *attn_norm, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *ffn_norm, *w_gate, *w_up, *w_down;
  // Per-head Q/K norms (Qwen 3, Gemma 3) and Gemma 3's post norms (null where the format has
  // no names for them)
  const char *q_norm = nullptr, *k_norm = nullptr, *post_attn_norm = nullptr, *post_ffn_norm = nullptr;
  // Phi-3's fused projections: Q|K|V rows in one matrix, gate|up rows in another.
  const char *wqkv = nullptr, *w_gate_up = nullptr;
  // Mixture of experts: the router and the experts' matrices, each stored as one 3-D tensor.
  const char *router = nullptr, *gate_exps = nullptr, *up_exps = nullptr, *down_exps = nullptr;
};

// Rows [row0, row0 + rows) of a stored matrix, in place (rows are contiguous in every
// block format; not in the group-quantized ones, whose scales sit in planes after the codes).
inline WeightMatrix weight_rows(const WeightMatrix& m, int64_t row0, int64_t rows, const std::string& name) {
  if (is_group_quant(m.dtype)) fail(name, ": a fused matrix cannot be group-quantized (", dtype_name(m.dtype), ")");
  WeightMatrix out = m;
  out.data = static_cast<const uint8_t*>(m.data) + row0 * m.row_bytes();
  out.rows = rows;
  return out;
}

inline constexpr LlamaTensorNames kGgufLlamaNames = {"token_embd.weight",
                                                     "output.weight",
                                                     "output_norm.weight",
                                                     "blk.",
                                                     "attn_norm.weight",
                                                     "attn_q.weight",
                                                     "attn_k.weight",
                                                     "attn_v.weight",
                                                     "attn_output.weight",
                                                     "attn_q.bias",
                                                     "attn_k.bias",
                                                     "attn_v.bias",
                                                     "ffn_norm.weight",
                                                     "ffn_gate.weight",
                                                     "ffn_up.weight",
                                                     "ffn_down.weight",
                                                     "attn_q_norm.weight",
                                                     "attn_k_norm.weight",
                                                     "post_attention_norm.weight",
                                                     "post_ffw_norm.weight",
                                                     "attn_qkv.weight",
                                                     "ffn_up.weight",
                                                     "ffn_gate_inp.weight",
                                                     "ffn_gate_exps.weight",
                                                     "ffn_up_exps.weight",
                                                     "ffn_down_exps.weight"};

inline constexpr LlamaTensorNames kHfLlamaNames = {"model.embed_tokens.weight",
                                                   "lm_head.weight",
                                                   "model.norm.weight",
                                                   "model.layers.",
                                                   "input_layernorm.weight",
                                                   "self_attn.q_proj.weight",
                                                   "self_attn.k_proj.weight",
                                                   "self_attn.v_proj.weight",
                                                   "self_attn.o_proj.weight",
                                                   "self_attn.q_proj.bias",
                                                   "self_attn.k_proj.bias",
                                                   "self_attn.v_proj.bias",
                                                   "post_attention_layernorm.weight",
                                                   "mlp.gate_proj.weight",
                                                   "mlp.up_proj.weight",
                                                   "mlp.down_proj.weight",
                                                   "self_attn.q_norm.weight",
                                                   "self_attn.k_norm.weight",
                                                   nullptr,
                                                   nullptr,
                                                   "self_attn.qkv_proj.weight",
                                                   "mlp.gate_up_proj.weight"};

// A Hugging Face MoE layer's tensor names: Mixtral's block_sparse_moe (w1 gate, w3 up, w2
// down) or Qwen3-MoE's mlp.
struct HfMoeNames {
  const char *router, *experts, *gate, *up, *down;
};
inline HfMoeNames hf_moe_names(const std::string& arch) {
  if (arch == "qwen3moe")
    return {"mlp.gate.weight", "mlp.experts.", "gate_proj.weight", "up_proj.weight", "down_proj.weight"};
  return {"block_sparse_moe.gate.weight", "block_sparse_moe.experts.", "w1.weight", "w3.weight", "w2.weight"};
}

// Fills w's matrices and vectors from w.config (already read and validated).
template <typename Binder>
void bind_llama_tensors(Binder& bind, ModelWeights& w, const LlamaTensorNames& n) {
  const ModelConfig& c = w.config;
  const int64_t q_dim = static_cast<int64_t>(c.n_head) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.n_head_kv) * c.head_dim;
  w.tok_embd = bind.matrix(n.tok_embd, c.n_vocab, c.n_embd);
  w.output = c.tied_embeddings ? w.tok_embd : bind.matrix(n.output, c.n_vocab, c.n_embd);
  w.output_norm = bind.vector(n.output_norm, c.n_embd, false);
  w.layers.resize(c.n_layer);
  for (int i = 0; i < c.n_layer; ++i) {
    const std::string p = n.layer_prefix + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    l.attn_norm = bind.vector(p + n.attn_norm, c.n_embd, false);
    if (c.arch == "phi3") {  // fused projections, bound as row ranges of one stored matrix
      const WeightMatrix qkv = bind.matrix(p + n.wqkv, q_dim + 2 * kv_dim, c.n_embd);
      l.wq = weight_rows(qkv, 0, q_dim, p + n.wqkv);
      l.wk = weight_rows(qkv, q_dim, kv_dim, p + n.wqkv);
      l.wv = weight_rows(qkv, q_dim + kv_dim, kv_dim, p + n.wqkv);
    } else {
      l.wq = bind.matrix(p + n.wq, q_dim, c.n_embd);
      l.wk = bind.matrix(p + n.wk, kv_dim, c.n_embd);
      l.wv = bind.matrix(p + n.wv, kv_dim, c.n_embd);
    }
    l.wo = bind.matrix(p + n.wo, c.n_embd, q_dim);
    l.bq = bind.vector(p + n.bq, q_dim, !c.qkv_bias);
    l.bk = bind.vector(p + n.bk, kv_dim, !c.qkv_bias);
    l.bv = bind.vector(p + n.bv, kv_dim, !c.qkv_bias);
    l.ffn_norm = bind.vector(p + n.ffn_norm, c.n_embd, false);
    if (c.n_expert > 0 && n.gate_exps) {  // GGUF: each kind of expert matrix stacked in one tensor
      if constexpr (requires { bind.experts(std::string(), int64_t{}, int64_t{}, int64_t{}); }) {
        l.router = bind.matrix(p + n.router, c.n_expert, c.n_embd);
        l.gate_exps = bind.experts(p + n.gate_exps, c.n_expert, c.n_ff, c.n_embd);
        l.up_exps = bind.experts(p + n.up_exps, c.n_expert, c.n_ff, c.n_embd);
        l.down_exps = bind.experts(p + n.down_exps, c.n_expert, c.n_embd, c.n_ff);
      } else {
        fail(c.arch, ": this checkpoint format has no stacked expert tensors");
      }
    } else if (c.n_expert > 0) {  // Hugging Face: a tensor per expert, named per family
      const HfMoeNames m = hf_moe_names(c.arch);
      l.router = bind.matrix(p + m.router, c.n_expert, c.n_embd);
      for (int e = 0; e < c.n_expert; ++e) {
        const std::string x = p + m.experts + std::to_string(e) + ".";
        l.gate_exps.push_back(bind.matrix(x + m.gate, c.n_ff, c.n_embd));
        l.up_exps.push_back(bind.matrix(x + m.up, c.n_ff, c.n_embd));
        l.down_exps.push_back(bind.matrix(x + m.down, c.n_embd, c.n_ff));
      }
    } else if (c.arch == "phi3") {
      const WeightMatrix gate_up = bind.matrix(p + n.w_gate_up, 2 * static_cast<int64_t>(c.n_ff), c.n_embd);
      l.w_gate = weight_rows(gate_up, 0, c.n_ff, p + n.w_gate_up);
      l.w_up = weight_rows(gate_up, c.n_ff, c.n_ff, p + n.w_gate_up);
    } else {
      l.w_gate = bind.matrix(p + n.w_gate, c.n_ff, c.n_embd);
      l.w_up = bind.matrix(p + n.w_up, c.n_ff, c.n_embd);
    }
    if (c.n_expert == 0) l.w_down = bind.matrix(p + n.w_down, c.n_embd, c.n_ff);
    if (c.qk_norm) {
      l.q_norm = bind.vector(p + n.q_norm, c.head_dim, false);
      l.k_norm = bind.vector(p + n.k_norm, c.head_dim, false);
    }
    if (c.arch == "gemma3") {
      if (!n.post_attn_norm) fail("gemma3: this checkpoint format is not supported (GGUF only)");
      // GGUF's converter stores Gemma's norm weights with the +1 of Gemma's (1 + w) folded in.
      l.post_attn_norm = bind.vector(p + n.post_attn_norm, c.n_embd, false);
      l.post_ffn_norm = bind.vector(p + n.post_ffn_norm, c.n_embd, false);
    }
  }
}

}  // namespace tessera
