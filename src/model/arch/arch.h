#pragma once
// Pieces the architecture files share (model/arch/*.cpp): activation buffers owned by the
// backend, the RoPE configuration a config asks for, and each architecture's constructor.
#include <cstdint>
#include <memory>
#include <vector>

#include "model/model.h"

namespace tessera {

// Backend buffers freed together (a model's activations).
class BackendBuffers {
 public:
  explicit BackendBuffers(Backend& be) : be_(be) {}
  BackendBuffers(const BackendBuffers&) = delete;
  BackendBuffers& operator=(const BackendBuffers&) = delete;
  ~BackendBuffers() {
    for (void* p : owned_) be_.free(p);
  }
  float* floats(int64_t n) {
    void* p = be_.alloc(sizeof(float) * static_cast<size_t>(n));
    owned_.push_back(p);
    return static_cast<float*>(p);
  }

 private:
  Backend& be_;
  std::vector<void*> owned_;
};

// The activations of a pre-norm decoder for up to max_tokens rows (max_logits for the head).
// The residual stream alternates between x and x2: each pre-norm writes x + residual into the
// other one (add_rms_norm_matmul), so a backend can fold the norm into the product that follows
// without a second kernel or an in-place race. Q, K and V sit side by side in one row (vLLM's
// qkv_proj layout), gate and up likewise: a backend may then run each group as one product, and
// RoPE rotates Q and K in one call.
struct DecoderActivations {
  DecoderActivations(Backend& be, const ModelConfig& c, int max_tokens, int max_logits);

  BackendBuffers bufs;
  int64_t q_dim = 0, kv_dim = 0, qkv_ld = 0;  // qkv_ld = q_dim + 2 kv_dim
  float *x, *x2, *xn, *tmp;                   // [t, n_embd]
  float *q, *k, *v;                           // [t, q_dim | kv_dim | kv_dim], row stride qkv_ld
  float* att;                                 // [t, q_dim]
  float *gate, *up;                           // [t, n_ff | n_ff], row stride 2 n_ff
  float* h;                                   // [t, n_ff]
  float* rows;                                // [max_logits, n_embd]: the rows the head reads
  float* logits;                              // [max_logits, n_vocab]
};

// The end of a decoder's forward: x += tmp (the last block's output), then the final norm
// and the output matrix on the rows the caller wants only. Returns a.logits: [n_logits, n_vocab].
float* decoder_head(Backend& be, const ModelWeights& w, DecoderActivations& a, float* x, const ForwardInputs& in);
// Its first half: x += tmp, then the final norm of the wanted rows into a.rows [n_logits, n_embd].
void decoder_final_norm(Backend& be, const ModelWeights& w, DecoderActivations& a, float* x, const ForwardInputs& in);

// RoPE as the config says, at base freq_base; with_scaling false leaves out the config's
// rope_scaling (Gemma 3's local layers rotate unscaled).
RopeConfig rope_config_for(const ModelConfig& c, float freq_base, const float* freq_factors, bool with_scaling);
// The RoPE layer il's keys are rotated with, as the model runners use it (Gemma 3's local
// layers: their own base, unscaled); for measuring keys before RoPE (calibrate-kv).
RopeConfig layer_rope_config(const ModelWeights& w, int il);

// comms: a shard's tensor-parallel group, a stage's pipeline group (create_model).
std::unique_ptr<Model> make_llama_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens,
                                        int max_logits, ModelComms comms);
std::unique_ptr<Model> make_gemma3_model(std::shared_ptr<const ModelWeights> weights, Backend& backend, int max_tokens,
                                         int max_logits);

}  // namespace tessera
