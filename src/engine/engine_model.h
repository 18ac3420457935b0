#pragma once
// Everything the engine needs to serve one real model: the session (weights, tokenizer,
// runner), a KV cache sized from a memory budget, and the executor over them. Build an
// EngineCore (offline batches) or an Engine (serving) from config() and executor().
#include <memory>
#include <string>

#include "engine/engine_core.h"
#include "engine/executor_model.h"
#include "engine/session.h"
#include "engine/parallel_ranks.h"

namespace tessera {

struct ModelEngineOptions {
  SessionOptions session;  // model, backend, KV formats, block_size (ctx, batch sizes are set here)
  // max_model_len 0 = the trained context, at most 8192; max_logits_rows 0 = max_num_seqs +
  // prompt_logprob_rows; preemption_mode Swap needs swap_space_bytes.
  SchedulerConfig scheduler;
  int64_t kv_cache_bytes = 0;  // KV budget; 0 = kv_memory_fraction of the memory available
  double kv_memory_fraction = 0.4;
  // A device backend (CUDA): with kv_cache_bytes 0 the budget is device_kv_fraction of the
  // device memory free after the warm-up forward, less device_reserve_bytes (decode graphs,
  // attention scratch, other processes).
  double device_kv_fraction = 0.9;
  int64_t device_reserve_bytes = int64_t{1} << 30;
  int max_kv_blocks = 0;  // cap on the pool (tests); 0 = none
  bool prefix_caching = true;
  // Sliding-window layers (Gemma 3's local layers, Mistral's) keep their KV in a pool of
  // their own that drops blocks behind the window (vLLM's hybrid KV cache manager); false =
  // every layer keeps the whole sequence (--disable-hybrid-kv-cache-manager).
  bool hybrid_kv_cache = true;
  AdmissionLimits admission;
  int max_n = 16;
  bool warmup = true;  // one forward of max_num_batched_tokens tokens before serving
  // Host memory for swap preemption's KV tier (whole blocks); 0 = none.
  int64_t swap_space_bytes = 0;
  // Logits rows per forward beyond max_num_seqs, for prompt-logprob prefill chunks (each
  // needs a row per prompt token); costs rows x vocabulary x 4 bytes twice.
  int prompt_logprob_rows = 64;
  // Speculative decoding (off by default); its draft tokens get logits rows of their own
  // beyond the two above.
  SpeculativeConfig speculative;
  // Tensor parallelism (docs/design/parallel.md): the model's heads, FFN and vocabulary split
  // over this many ranks in this process (threads on the CPU, one GPU each on CUDA), each with
  // its own KV cache of its KV heads. kv_cache_bytes and swap_space_bytes are then per rank
  // (vLLM's per-GPU meaning); the default CPU budget is split between the ranks.
  int tensor_parallel_size = 1;
  // Pipeline parallelism (docs/design/parallel.md): the model's layers split into this many
  // stages in this process (threads on the CPU, one GPU each on CUDA), each with the KV cache
  // of its layers; each step's batch runs through them in micro-batches. Budgets per stage,
  // as above. Not with tensor_parallel_size > 1.
  int pipeline_parallel_size = 1;
};

class ModelEngine {
 public:
  explicit ModelEngine(ModelEngineOptions options);
  ~ModelEngine();

  // The session holds the weights and tokenizer; with tensor or pipeline parallelism only
  // those (the ranks hold the shards or stages, backends and KV caches).
  Session& session() { return *session_; }
  // The KV cache of the model (rank 0's with parallel ranks: its KV heads, or pipeline stage
  // 0's layers only).
  KvCache& kv() { return ranks_ ? *ranks_->rank(0).kv : *kv_; }
  // The backend the logits are sampled from with one rank or tensor parallelism (rank 0's);
  // with pipeline stages, stage 0's (the last stage samples; all stages are of one kind).
  Backend& backend() { return ranks_ ? *ranks_->rank(0).backend : session_->backend(); }
  // The backend's description, or the ranks' ("2 tensor-parallel ranks (...), each cpu (...)").
  std::string describe_device() { return ranks_ ? ranks_->describe() : session_->backend().describe(); }
  // Every rank's cache (one without parallel ranks).
  std::vector<const KvCacheSpec*> kv_specs();
  int tensor_parallel_size() const { return ranks_ ? ranks_->layout().tensor : 1; }
  int pipeline_parallel_size() const { return ranks_ ? ranks_->layout().pipeline : 1; }
  // "layers 0-14 | 15-29" with pipeline parallelism, else "".
  std::string pipeline_layers() const {
    return ranks_ && ranks_->layout().pipelined() ? ranks_->pipeline().describe() : "";
  }
  Executor& executor() { return *executor_; }
  const EngineConfig& config() const { return config_; }

 private:
  std::unique_ptr<Session> session_;
  std::unique_ptr<ParallelRanks> ranks_;  // tensor or pipeline parallelism; outlives the executor
  std::unique_ptr<KvCache> kv_;           // one rank only
  std::unique_ptr<Executor> executor_;
  EngineConfig config_;
};

}  // namespace tessera
