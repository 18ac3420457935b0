#pragma once
// Read-only model weights, shared by every run (llama2.c's TransformerWeights). Matrices stay
// in their stored format (usually views into the memory-mapped file); small vectors (norms,
// biases) are f32.
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/tensor.h"
#include "model/config.h"

namespace tessera {

struct LayerWeights {
  const float* attn_norm = nullptr;   // [n_embd]
  WeightMatrix wq, wk, wv, wo;        // [n_head*hd, n_embd], [n_kv*hd, n_embd] x2, [n_embd, n_head*hd]
  const float* bq = nullptr;          // [n_head*hd] (Qwen2), else nullptr
  const float* bk = nullptr;          // [n_kv*hd]
  const float* bv = nullptr;          // [n_kv*hd]
  const float* ffn_norm = nullptr;    // [n_embd]
  WeightMatrix w_gate, w_up, w_down;  // [n_ff, n_embd] x2, [n_embd, n_ff]; unset in MoE layers
  // Mixture of experts (config.n_expert > 0): the router and each expert's SwiGLU matrices.
  WeightMatrix router;                                      // [n_expert, n_embd]
  std::vector<WeightMatrix> gate_exps, up_exps, down_exps;  // n_expert x [n_ff, n_embd] x2, [n_embd, n_ff]
  // Gemma 3 only (else nullptr): per-head Q and K norms, and the norms of the attention's and
  // the FFN's outputs before they join the residual stream.
  const float* q_norm = nullptr;          // [head_dim]
  const float* k_norm = nullptr;          // [head_dim]
  const float* post_attn_norm = nullptr;  // [n_embd]
  const float* post_ffn_norm = nullptr;   // [n_embd]
};

// Which slice of a model a tensor-parallel rank holds (model/tp/shard.h). A shard's config
// describes the rank's slice: n_head, n_head_kv and n_ff are the rank's own; n_vocab stays
// the whole vocabulary (the logits are whole after the all-gather), while tok_embd and
// output hold the rows [vocab_first, vocab_first + n_vocab / size).
struct TensorShard {
  int rank = 0, size = 1;  // size 1: the whole model
  int64_t vocab_first = 0;
  int head_first = 0, kv_head_first = 0;  // the rank's first query and KV head in the whole model
  int64_t ff_first = 0;
};

// Which layers a pipeline stage holds (model/pp/stage.h): the whole model's layers
// [first_layer, first_layer + config.n_layer). Stage 0 embeds the tokens (others receive the
// residual stream from the stage before), the last one has the final norm and head (others
// send the residual stream on). size 1: the whole model.
struct PipelineStage {
  int index = 0, size = 1;
  int first_layer = 0;
  bool first() const { return index == 0; }
  bool last() const { return index == size - 1; }
};

struct ModelWeights {
  ModelConfig config;
  TensorShard shard;
  PipelineStage stage;
  WeightMatrix tok_embd;  // [n_vocab, n_embd]
  WeightMatrix output;    // [n_vocab, n_embd] (= tok_embd when tied)
  const float* output_norm = nullptr;
  const float* rope_freq_factors = nullptr;  // [rope_dim/2] or nullptr
  std::vector<LayerWeights> layers;
  // Static fp8 KV-cache scales a checkpoint carries (self_attn.k_scale / v_scale), one per
  // layer; empty when it has none. Used by the fp8 :tensor KV format unless --kv-scales says.
  std::vector<float> k_scale, v_scale;
  std::string source;        // path, or "dummy:<preset>"
  int64_t weight_bytes = 0;  // bytes of all matrices and vectors, as stored
  // The backend whose memory the pointers are in, once make_resident made them so (null: host
  // memory as loaded). Views of resident weights (first_layers) stay resident.
  const Backend* resident_on = nullptr;

  // Whatever keeps the data alive: the mapped file, owned buffers.
  std::vector<std::shared_ptr<const void>> owners;
  // An owned f32 buffer that lives as long as the weights.
  float* make_f32(size_t n);
};

class GGUFFile;
// Builds weights over a GGUF file (zero-copy for matrices). Checks every tensor's presence,
// type and shape against the config; throws tessera::Error naming the tensor otherwise.
std::shared_ptr<ModelWeights> load_gguf_weights(std::shared_ptr<const GGUFFile> file);
// Builds weights over a Hugging Face checkpoint directory (config.json + safetensors, one
// file or sharded); F32/F16/BF16 matrices are used in place.
std::shared_ptr<ModelWeights> load_safetensors_weights(const std::string& dir);
// The same weights as `backend` reads them: uploaded once for a device backend (the result
// owns the device copies and keeps `host` alive), the host pointers themselves on the CPU.
// Weights already resident on `backend` come back as they are (no second upload).
std::shared_ptr<const ModelWeights> make_resident(std::shared_ptr<const ModelWeights> host, Backend& backend);
// The model's first n_layers layers with its embedding, final norm and head (a layer-truncated
// copy for early-exit drafting): views of `w`'s tensors, keeping `w` alive; no data is copied.
// Throws unless 1 <= n_layers <= w's layer count.
std::shared_ptr<const ModelWeights> first_layers(std::shared_ptr<const ModelWeights> w, int n_layers);
// Reads the model config from GGUF metadata (general.architecture and its keys).
ModelConfig config_from_gguf(const GGUFFile& file);

}  // namespace tessera
