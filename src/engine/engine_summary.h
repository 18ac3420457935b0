#pragma once
// The start-up summary a `vllm serve` user expects once the model is loaded: the model, its
// context, the KV cache's format and capacity, the device and the scheduler's limits.
// describe_engine() gathers it, format_engine_summary() turns it into lines.
#include <cstdint>
#include <string>

namespace tessera {

class ModelEngine;

struct EngineSummary {
  std::string model;         // as given on the command line
  std::string name;          // the checkpoint's own name
  std::string architecture;  // "llama", "qwen2", ...
  int64_t n_params = 0;
  int trained_context = 0;
  int max_model_len = 0;            // prompt + output tokens of one sequence
  std::string kv_dtype;             // "f16", "fp8_e4m3", "k=int4:channel v=int4:g32", ...
  double kv_bits_per_element = 16;  // storage per K/V element, scales included
  int block_size = 0;
  int n_blocks = 0;
  int64_t kv_block_bytes = 0;      // all ranks' parts of one block
  int64_t kv_bytes = 0;            // both pools, all ranks
  int tensor_parallel_size = 1;    // ranks, each holding kv_bytes / tensor_parallel_size (its KV heads)
  int pipeline_parallel_size = 1;  // stages, each holding its layers' part of kv_bytes
  std::string pipeline_layers;     // "layers 0-14 | 15-29"
  int n_host_blocks = 0;           // swap tier
  // Sliding-window layers with a pool of their own (0 = none): their window, how many of
  // the n_layers they are, their pool's blocks, and the tokens the same KV memory would hold
  // if every layer kept the whole sequence.
  int window = 0;
  int n_local_layers = 0;
  int n_layers = 0;
  int n_local_blocks = 0;
  int64_t unwindowed_tokens = 0;
  std::string device;  // the backend's own description (device or threads and ISA)
  int max_num_seqs = 0;
  int max_num_batched_tokens = 0;
  int max_partial_prefills = 0;
  std::string policy;      // "fcfs", "priority"
  std::string preemption;  // "recompute", "swap"
  bool prefix_caching = false;
  std::string speculative;  // describe_speculative_config(): "off" or method, k, lookup

  int64_t kv_tokens() const { return static_cast<int64_t>(n_blocks) * block_size; }
  // Sequences of max_model_len tokens the cache holds at once.
  double max_concurrency() const { return max_model_len > 0 ? static_cast<double>(kv_tokens()) / max_model_len : 0; }
};

EngineSummary describe_engine(ModelEngine& engine, const std::string& model_arg);
// One "tessera: <topic> <text>" line per topic, each ending in '\n'.
std::string format_engine_summary(const EngineSummary& s);

// "1.50 GiB", "512.0 MiB", "12.0 KiB", "100 B".
std::string human_bytes_binary(int64_t bytes);
// "135M", "8.03B".
std::string human_count(int64_t n);

}  // namespace tessera
