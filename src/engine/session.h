#pragma once
// A model loaded and ready to run on one backend: weights, tokenizer, runner, paged KV.
// Used by the command line (generate, eval, bench) for single-sequence work; the serving
// engine builds on the same pieces.
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "engine/model_runner.h"
#include "engine/parallel_ranks.h"
#include "kv/kv_cache.h"
#include "model/model.h"
#include "model/weights.h"

namespace tessera {

class GGUFFile;
class Tokenizer;

struct SessionOptions {
  // Path to .gguf or a Hugging Face directory, a model alias (smollm2-135m), or
  // dummy:<preset>[:dtype]; "@w4g128" (w8g64, w4c, w4g128a, ...) after it quantizes the
  // decoder's linear layers at load (round-to-nearest, model/quantize_weights.h).
  std::string model;
  BackendOptions backend;
  int ctx = 0;                 // most tokens of one sequence; 0 = the trained context
  int kv_tokens = 0;           // KV allocated at load, in tokens; 0 = ctx (provision_kv() grows it)
  int max_batch_tokens = 512;  // tokens per forward (prefill chunk)
  int max_logits = 1;          // logits rows per forward
  int block_size = 16;         // tokens per KV block
  // KV storage formats (backend/kv_format.h) and static scales (fp8 :tensor / :head; per
  // layer, one value or one per KV head; empty = 1.0).
  KvFormat k_format = kv_format_of(DType::F16);
  KvFormat v_format = kv_format_of(DType::F16);
  std::vector<std::vector<float>> k_scales, v_scales;
  std::vector<std::vector<float>> k_mean;   // calibrated key centering (KvCacheSpec::k_mean)
  std::vector<std::vector<float>> k_equal;  // calibrated key equalization (KvCacheSpec::k_equal)
  // position-aware key centering (KvCacheSpec::k_rope_*): k_mean is then the pre-RoPE mean
  int k_rope_dim = 0;
  bool k_rope_neox = false;
  std::vector<std::vector<float>> k_rope_freq;
  std::vector<std::vector<float>> k_first;  // the position-0 key's center (KvCacheSpec::k_first)
  uint64_t dummy_seed = 0;                  // for dummy weights
  // Load the weights and tokenizer only: no backend, model or KV (the tensor-parallel engine
  // runs shards of the weights on backends of its own). backend(), model(), kv(), runner(),
  // pool() and feed() then throw.
  bool weights_only = false;
  // Tensor parallelism (engine/parallel_ranks.h, docs/design/parallel.md): the model split over this
  // many ranks of this process, each with its KV heads; feed() runs every rank. backend(),
  // model() and kv() are then rank 0's, and runner() throws (a forward must run on every rank).
  int tensor_parallel_size = 1;
  // Pipeline stages of consecutive layers, the same way; with tensor_parallel_size > 1 too,
  // each stage sharded over that many ranks.
  int pipeline_parallel_size = 1;
};

// Resolves a model argument to a file path: an existing path is returned as is; an alias
// maps to the model cache ($TESSERA_CACHE or ~/.cache/tessera/models). Throws naming the
// alias and the expected file when it is missing.
std::string resolve_model_path(const std::string& model);

// A model's files loaded: weights (quantized at load for "MODEL@w4g128"), tokenizer (when
// the model has one) and the GGUF file (GGUF models only). What Session loads; a draft model
// (engine/model_drafter.h) loads through it too, to run on the target's backend.
struct LoadedModel {
  std::shared_ptr<GGUFFile> gguf;
  std::shared_ptr<ModelWeights> weights;
  std::unique_ptr<Tokenizer> tokenizer;
};
// model_spec: as SessionOptions::model. cpu_threads: for GPTQ/AWQ calibration at load.
LoadedModel load_model(const std::string& model_spec, int cpu_threads, uint64_t dummy_seed = 0);

class Session {
 public:
  explicit Session(const SessionOptions& options);
  ~Session();

  const ModelConfig& config() const { return weights_->config; }
  const ModelWeights& weights() const { return *weights_; }
  std::shared_ptr<const ModelWeights> shared_weights() const { return weights_; }
  // The weights as the session's backend reads them, the model's own (uploaded once on a
  // device); null with tensor-parallel ranks or weights_only.
  std::shared_ptr<const ModelWeights> resident_weights() const { return resident_; }
  const GGUFFile* gguf() const { return gguf_.get(); }  // nullptr for non-GGUF models
  Tokenizer& tokenizer();                               // throws when the model has none
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  Backend& backend() { return ranks_ ? *ranks_->rank(0).backend : *checked(backend_.get()); }
  Model& model() { return ranks_ ? *ranks_->rank(0).model : *checked(model_.get()); }
  KvCache& kv() { return ranks_ ? *ranks_->rank(0).kv : *checked(kv_.get()); }
  ModelRunner& runner() { return *checked(runner_.get()); }  // the model's forward over kv()
  // The backend's description, or the ranks' with tensor parallelism.
  std::string describe_device() { return ranks_ ? ranks_->describe() : backend().describe(); }
  BlockPool& pool() { return *checked(pool_.get()); }
  int block_size() const { return options_.block_size; }
  int ctx() const { return ctx_; }
  int kv_tokens() const { return pool_ ? pool_->n_blocks() * options_.block_size : 0; }
  // Makes the KV cache hold at least `tokens` (at most ctx()), reallocating it; only while
  // no sequence holds blocks. Throws naming the numbers otherwise.
  void provision_kv(int tokens);
  const SessionOptions& options() const { return options_; }

  // Feeds tokens to a sequence in chunks of max_batch_tokens, growing its KV. Logits of the
  // last token (mode Last) or of every token (mode All, up to max_logits per chunk) are
  // appended to `logits` ([rows, n_vocab]). Throws when the context or the KV pool is full.
  void feed(SequenceBlocks& seq, std::span<const int32_t> tokens, ForwardBatch::Logits mode,
            std::vector<float>& logits);
  // One greedy decode step: feeds `token` and returns the argmax of its logits, read back as
  // the engine reads a greedy request's (Backend::LogitsReadback: on a device backend the
  // argmax runs there and only the id crosses the bus). Throws as feed does.
  int32_t decode_greedy(SequenceBlocks& seq, int32_t token);

 private:
  // Runs batch_ (on every rank at tensor parallelism), its logits read back as `plan` says
  // into `logits` (rank 0's).
  void forward(float* logits, const Backend::LogitsReadback& plan);
  SessionOptions options_;
  std::shared_ptr<GGUFFile> gguf_;
  std::shared_ptr<ModelWeights> weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ParallelRanks> ranks_;  // tensor or pipeline ranks: backends, shards or stages, KV, runners
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<const ModelWeights> resident_;  // the model's weights on backend_ (freed before it)
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<BlockPool> pool_;
  ForwardBatch batch_;
  std::vector<float> greedy_row_;  // decode_greedy's host row, written only when the device cannot pick
  int ctx_ = 0;
  void make_kv(int tokens);
  template <typename T>
  T* checked(T* p) const {
    if (!p) weights_only_error();
    return p;
  }
  [[noreturn]] void weights_only_error() const;  // no local model: weights only, or ranks
};

}  // namespace tessera
