#pragma once
// KV-cache capacity planning (`tessera kv-plan`): bytes per token for each KV-cache format
// (backend/kv_format.h; scales included, as the cache allocates them), block overhead, and
// how many sequences of a given context fit in a memory budget next to the weights, with and
// without the sliding-window layers' own pool (docs/design/kv-manager.md). Works from a GGUF
// file, a Hugging Face config.json directory or a dummy: preset.
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/config.h"

namespace tessera::bench {

struct KvModelInfo {
  ModelConfig config;
  int64_t weight_bytes = 0;  // as stored (GGUF tensors, safetensors files) or estimated (dummy)
  bool weight_bytes_estimated = false;
  std::string source;
};

// model: a .gguf path, a model alias (smollm2-135m), a directory with config.json, or
// dummy:<preset>[:dtype] (weights = parameters × dtype size, default f16).
KvModelInfo load_kv_model_info(const std::string& model);

// The formats a plan lists by default (as --kv-cache-dtype names them).
std::vector<std::string> kv_plan_formats();

// 2 (K and V) × layers × KV heads × head dim × bytes per element.
double kv_bytes_per_token(const ModelConfig& c, double bytes_per_elem);

struct KvPlanRow {
  std::string dtype;       // the --kv-cache-dtype name
  bool supported = false;  // the format can store this model's heads (turbo: power-of-two head_dim)
  std::string unsupported_why;
  double bits_per_elem = 0;  // storage per K/V element, scales included
  int block_size = 0;
  int64_t ctx = 0;
  double bytes_per_token = 0;
  double block_bytes = 0;           // block_size × bytes_per_token
  int64_t blocks_per_seq = 0;       // ceil(ctx / block_size)
  double seq_bytes = 0;             // blocks_per_seq × block_bytes
  double expected_waste_bytes = 0;  // half a block per sequence
  double waste_fraction = 0;        // expected waste / (ctx × bytes_per_token)
  int64_t kv_budget_bytes = 0;      // budget − weights − reserve (may be ≤ 0)
  int64_t total_blocks = 0;         // floor(kv budget / block_bytes)
  int64_t max_concurrency = 0;      // floor(total_blocks / blocks_per_seq): sequences at full ctx
  // Models with sliding-window layers (their own KV pool, blocks behind the window dropped):
  // the local layers' blocks one sequence holds at most, its KV then, and the sequences at
  // full ctx the budget holds so. Without local layers: the plain figures.
  int64_t local_blocks_per_seq = 0;  // min(blocks_per_seq, (window - 1) / block + 2)
  double windowed_seq_bytes = 0;
  int64_t windowed_max_concurrency = 0;
};

struct KvPlanOptions {
  int64_t memory_bytes = int64_t{16} << 30;
  int64_t reserve_bytes = 0;  // activations, runtime; subtracted with the weights
  std::vector<int64_t> ctx = {2048, 8192, 32768};
  std::vector<int> block_sizes = {16};
  std::vector<std::string> formats = kv_plan_formats();
  // Tensor parallelism: memory_bytes is then one rank's device, holding 1/N of the weights and
  // its KV heads (plan_tensor_parallel's split: n_head_kv / N, or one shared head).
  int tensor_parallel_size = 1;
  // Pipeline parallelism: memory_bytes is then one stage's device, holding the largest stage's
  // layers (plan_pipeline: the first stages take the extra ones) and their share of the weights
  // (by layers: the embedding and head are not apportioned). Not with tensor_parallel_size > 1.
  int pipeline_parallel_size = 1;
};

std::vector<KvPlanRow> kv_plan(const KvModelInfo& model, const KvPlanOptions& options);
std::string format_kv_plan(const KvModelInfo& model, const KvPlanOptions& options, const std::vector<KvPlanRow>& rows);
nlohmann::json kv_plan_json(const KvModelInfo& model, const KvPlanOptions& options, const std::vector<KvPlanRow>& rows);

// "16GiB", "512MiB", "1.5G", "80GB", "123456" (bytes) → bytes. GiB/G/g binary; GB decimal.
int64_t parse_memory_size(const std::string& text);

}  // namespace tessera::bench
