#pragma once
// Options shared by the subcommands that load a model.
#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_model.h"
#include "engine/kv_scales.h"
#include "engine/session.h"

namespace tessera::apps {

struct ModelArgs {
  std::string model = "smollm2-135m";
  std::string device = "cpu";
  int threads = 0;
  int max_model_len = 0;  // prompt + output tokens of one sequence; 0 = the model's trained context
  int batch = 512;
  int block_size = 16;
  std::string kv_cache_dtype = "f16";  // K and V, unless --k-cache-dtype / --v-cache-dtype say otherwise
  std::string k_cache_dtype, v_cache_dtype;
  std::string kv_scales;  // static scales file (tessera calibrate-kv)
  bool no_cuda_graphs = false;
  uint64_t seed = 0;         // dummy weights
  std::string quantization;  // vLLM's --quantization: fp8 or w4a16, quantized at load (RTN)

  void add_to(CLI::App& cmd);
  SessionOptions session_options() const;
};

// Options of the serving engine (scheduler, KV budget, prefix cache, preemption, per-tenant
// admission limits).
struct EngineArgs {
  int max_num_seqs = 32;
  int max_num_batched_tokens = 512;
  std::string kv_cache_memory;  // bytes, with K/M/G suffix; empty = a fraction of free memory
  bool no_prefix_cache = false;
  bool disable_hybrid_kv = false;             // --disable-hybrid-kv-cache-manager
  std::string scheduling_policy = "fcfs";     // or "priority"
  std::string preemption_mode = "recompute";  // or "swap"
  std::optional<double> swap_space_gib;       // host KV tier for swap mode; unset = 4 GiB
  int max_requests_per_tenant = 0;            // 0 = no limit
  int64_t max_tokens_per_tenant = 0;          // prompt + max_tokens x n in flight; 0 = no limit
  std::string speculative_config;             // JSON (vLLM's form); empty = no speculation
  int tensor_parallel_size = 1;               // ranks the model is split over (docs/design/parallel.md)
  int pipeline_parallel_size = 1;             // stages of consecutive layers (docs/design/parallel.md)

  void add_to(CLI::App& cmd);
  // Throws when flags contradict each other (--swap-space without --preemption-mode swap).
  struct ModelEngineOptions engine_options(const ModelArgs& model) const;
};

// Prints the start-up summary (engine/engine_summary.h) to stderr.
void print_engine_summary(ModelEngine& engine, const ModelArgs& model);

// vLLM's multi-letter short options, which CLI11 does not take (a short name is one letter):
// "-tp N" and "-tp=N" become "--tensor-parallel-size N", "-pp" "--pipeline-parallel-size".
// argv[0] and the rest are kept.
std::vector<std::string> expand_short_aliases(int argc, char** argv);

// Reads a whole file; throws naming the path.
std::string read_file(const std::string& path);

// The --kv-scales file's key centering into o: position-aware ("k_rope", version 2) when the
// file has it, else the static k_mean / k_equal; the first key's center ("k_first") with either.
// A device other than the CPU takes the static pair alone, with a warning (its backend does
// not read centering by position).
void apply_key_centering(const KvScales& file, SessionOptions& o);

// A comma-separated list of integers (an option like --batches 1,8,32), each >= min_value;
// throws naming the option when an item is not an integer, too small, or the list is empty.
std::vector<int> parse_int_list(const std::string& text, const std::string& option, int min_value);

}  // namespace tessera::apps
