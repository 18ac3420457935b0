#include "engine/engine_summary.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

#include "core/dtype.h"
#include "engine/engine_model.h"

namespace tessera {

std::string human_bytes_binary(int64_t bytes) {
  static const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes) / 1024.0;
  int u = 0;
  while (v >= 1024.0 && u < 3) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, kUnits[u]);
  return buf;
}

std::string human_count(int64_t n) {
  char buf[32];
  if (n >= 1'000'000'000)
    std::snprintf(buf, sizeof buf, "%.2fB", static_cast<double>(n) / 1e9);
  else if (n >= 1'000'000)
    std::snprintf(buf, sizeof buf, "%.0fM", static_cast<double>(n) / 1e6);
  else if (n >= 1'000)
    std::snprintf(buf, sizeof buf, "%.0fK", static_cast<double>(n) / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(n));
  return buf;
}

EngineSummary describe_engine(ModelEngine& engine, const std::string& model_arg) {
  const ModelConfig& mc = engine.session().config();
  const EngineConfig& ec = engine.config();
  EngineSummary s;
  s.model = model_arg;
  s.name = mc.name;
  s.architecture = mc.arch;
  if (mc.n_expert > 0)  // "qwen3moe, 128 experts, 8 per token"
    s.architecture +=
        ", " + std::to_string(mc.n_expert) + " experts, " + std::to_string(mc.n_expert_used) + " per token";
  s.n_params = mc.n_params();
  s.trained_context = mc.n_ctx_train;
  s.max_model_len = ec.scheduler.max_model_len;
  const KvCacheSpec& kv = engine.kv().spec();
  s.kv_dtype = kv.format_name();  // as --kv-cache-dtype spells it
  s.kv_bits_per_element = 8.0 * kv.bytes_per_token() / (2.0 * kv.n_layers * kv.n_kv_heads * kv.head_dim);
  s.block_size = ec.block_size;
  s.n_blocks = ec.n_blocks;
  s.kv_block_bytes = ec.kv_block_bytes;
  s.n_host_blocks = ec.n_host_blocks;
  // kv is rank 0's cache with parallel ranks: the bytes are every rank's.
  s.tensor_parallel_size = engine.tensor_parallel_size();
  s.pipeline_parallel_size = engine.pipeline_parallel_size();
  if (s.pipeline_parallel_size > 1) s.pipeline_layers = engine.pipeline_layers();
  int64_t all_block_bytes = 0;  // one block id over every rank and layer, unwindowed
  for (const KvCacheSpec* r : engine.kv_specs()) {
    s.kv_bytes += r->full_block_bytes() * ec.n_blocks + r->local_block_bytes() * ec.n_local_blocks;
    all_block_bytes += r->block_bytes();
  }
  if (ec.n_local_blocks > 0) {
    s.window = ec.window;
    s.n_local_layers = 0;
    for (const KvCacheSpec* r : engine.kv_specs()) s.n_local_layers += r->n_group_layers(true);
    s.n_local_layers /= s.tensor_parallel_size;
    s.n_layers = 0;
    for (const KvCacheSpec* r : engine.kv_specs()) s.n_layers += r->n_layers;
    s.n_layers /= s.tensor_parallel_size;  // shards hold every layer
    s.n_local_blocks = ec.n_local_blocks;
    s.unwindowed_tokens = s.kv_bytes / all_block_bytes * kv.block_size;
  }
  s.device = engine.describe_device();
  s.max_num_seqs = ec.scheduler.max_num_seqs;
  s.max_num_batched_tokens = ec.scheduler.max_num_batched_tokens;
  s.max_partial_prefills = ec.scheduler.max_partial_prefills;
  s.policy = std::string(scheduling_policy_name(ec.scheduler.policy));
  s.preemption = std::string(preemption_mode_name(ec.scheduler.preemption_mode));
  s.prefix_caching = ec.prefix_caching;
  s.speculative = describe_speculative_config(ec.speculative);
  return s;
}

std::string format_engine_summary(const EngineSummary& s) {
  std::string out;
  char buf[512];
  const auto line = [&](const char* topic, const std::string& text) {
    out += "tessera: ";
    out += topic;
    out.append(12 - std::string_view(topic).size(), ' ');
    out += text;
    out += '\n';
  };
  const std::string name = s.name.empty() ? s.model : s.name;
  std::snprintf(buf, sizeof buf, "%s (%s, %s parameters) from %s", name.c_str(), s.architecture.c_str(),
                human_count(s.n_params).c_str(), s.model.c_str());
  line("model", buf);
  std::snprintf(buf, sizeof buf, "max %d tokens per sequence (--max-model-len; trained %d)", s.max_model_len,
                s.trained_context);
  line("context", buf);
  std::snprintf(
      buf, sizeof buf,
      "%s (%.2f bits/element), %d blocks of %d tokens = %lld tokens (%s); %.2f sequences of %d tokens at once",
      s.kv_dtype.c_str(), s.kv_bits_per_element, s.n_blocks, s.block_size, static_cast<long long>(s.kv_tokens()),
      human_bytes_binary(s.kv_bytes).c_str(), s.max_concurrency(), s.max_model_len);
  std::string kv_line = buf;
  if (s.tensor_parallel_size > 1 && s.pipeline_parallel_size > 1)  // each rank: its KV heads of its layers
    kv_line += "; " + std::to_string(s.tensor_parallel_size) + " tensor-parallel ranks in each of " +
               std::to_string(s.pipeline_parallel_size) + " pipeline stages (" + s.pipeline_layers +
               "), each its KV heads of its layers";
  else if (s.tensor_parallel_size > 1)  // each rank stores its KV heads of every block
    kv_line += "; " + std::to_string(s.tensor_parallel_size) + " tensor-parallel ranks, " +
               human_bytes_binary(s.kv_bytes / s.tensor_parallel_size) + " each (its KV heads)";
  else if (s.pipeline_parallel_size > 1)  // each stage stores its layers of every block
    kv_line += "; " + std::to_string(s.pipeline_parallel_size) + " pipeline stages (" + s.pipeline_layers +
               "), each its layers' part";
  line("KV cache", kv_line);
  if (s.window > 0) {
    std::snprintf(buf, sizeof buf,
                  "%d of %d layers keep a %d-token window in a pool of %d blocks; without it the same memory "
                  "holds %lld tokens (the windows hold %.2fx as many)",
                  s.n_local_layers, s.n_layers, s.window, s.n_local_blocks, static_cast<long long>(s.unwindowed_tokens),
                  s.unwindowed_tokens > 0 ? static_cast<double>(s.kv_tokens()) / s.unwindowed_tokens : 0.0);
    line("KV windows", buf);
  }
  if (s.n_host_blocks > 0) {
    std::snprintf(buf, sizeof buf, "%d host blocks (%s) for swapped-out sequences", s.n_host_blocks,
                  human_bytes_binary(s.kv_block_bytes * s.n_host_blocks).c_str());
    line("swap space", buf);
  }
  line("device", s.device);
  std::snprintf(buf, sizeof buf,
                "policy %s, %d sequences and %d tokens per step, %d partial prefills, preemption %s, prefix cache %s",
                s.policy.c_str(), s.max_num_seqs, s.max_num_batched_tokens, s.max_partial_prefills,
                s.preemption.c_str(), s.prefix_caching ? "on" : "off");
  line("scheduler", buf);
  if (!s.speculative.empty() && s.speculative != "off") line("speculative", s.speculative);
  return out;
}

}  // namespace tessera
