#pragma once
// Everything the engine needs to serve one real model: the session (weights, tokenizer,
// runner), a KV cache sized from a memory budget, and the executor over them. Build an
// EngineCore (offline batches) or an Engine (serving) from config() and executor().
#include <memory>

#include "engine/engine_core.h"
#include "engine/executor_model.h"
#include "engine/session.h"

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
};

class ModelEngine {
 public:
  explicit ModelEngine(ModelEngineOptions options);
  ~ModelEngine();

  Session& session() { return *session_; }
  KvCache& kv() { return *kv_; }
  Executor& executor() { return *executor_; }
  const EngineConfig& config() const { return config_; }

 private:
  std::unique_ptr<Session> session_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<ModelExecutor> executor_;
  EngineConfig config_;
};

}  // namespace tessera
