#pragma once
// A simulated executor: the engine loop runs unchanged, but a step costs modeled time
// instead of a forward, so 100,000-request workloads run in seconds (scheduler tests at
// scale, capacity planning).
//
// It is also a checker of KV bookkeeping. Its "KV cache" holds one 64-bit value per slot:
// the hash of the token at that position and of the value at the previous position, read
// through the batch's block table. A token is derived from the value of the last row, so a
// sequence's output is a function of its whole context read through its pages: a wrong slot
// mapping, a missed copy-on-write, a prefix hit on different tokens or a block reused while
// still needed changes the output — and the tests compare outputs against runs alone.
// Greedy sequences (temperature 0) get the same tokens for the same context; others mix
// their seed in. The batch's structure (positions, slots, KV lengths) is checked too.
// Log-probabilities are stand-ins derived the same way (fake_logprobs), and swaps move the
// values to a host tier of its own and back, so a lost or misplaced swap changes outputs.
// With a local pool (window > 0: the engine's sliding-window group) every row also writes its
// value through the local table, and reads back through it the oldest key of its window and
// the previous position: a local block dropped too early, or a wrong local copy or swap,
// throws.
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/executor.h"

namespace tessera {

// Step time as a function of the batch: a fixed launch cost, a cost per token (weight
// reads and GEMMs), per sequence, and per cached token each sequence attends over.
struct CostModel {
  double step_overhead_s = 1.0e-3;
  double per_token_s = 40.0e-6;
  double per_seq_s = 5.0e-6;
  double per_context_token_s = 20.0e-9;
  double step_seconds(const ForwardBatch& batch) const;
};

struct SimulatorConfig {
  int32_t vocab_size = 32000;
  int n_blocks = 0;  // the KV layout the engine uses
  int block_size = 16;
  int n_host_blocks = 0;  // host tier for swap preemption
  int window = 0;         // the local pool's window and blocks (EngineConfig's); 0 = none
  int n_local_blocks = 0;
  int32_t eos_token = -1;  // when >= 0 and eos_one_in > 0: emitted about once in eos_one_in tokens
  int eos_one_in = 0;
  CostModel cost;
  bool sleep = false;  // sleep for the modeled step time (live demos), off for tests
  int max_batch_tokens = 1 << 20;
  int max_logits_rows = 1 << 20;
};

class SimulatedExecutor final : public Executor {
 public:
  explicit SimulatedExecutor(const SimulatorConfig& config);

  void add_sequence(SeqId seq, const SamplingParams& params, std::span<const int32_t> prompt) override;
  void remove_sequence(SeqId seq) override;
  size_t n_sequences() const override { return seqs_.size(); }
  void execute(const StepInput& input, StepOutput& output) override;
  int max_batch_tokens() const override { return config_.max_batch_tokens; }
  int max_logits_rows() const override { return config_.max_logits_rows; }
  int n_host_blocks() const override { return config_.n_host_blocks; }
  void swap_out(std::span<const BlockSwap> swaps) override;
  void swap_in(std::span<const BlockSwap> swaps) override;

  double elapsed_seconds() const { return elapsed_s_; }  // modeled time of all steps so far
  int64_t n_steps() const { return n_steps_; }
  // The seed a sequence samples with: 0 (greedy) or derived from params.seed, else its id.
  static uint64_t sampling_seed(const SamplingParams& params, SeqId seq);
  // The token the simulator produces after a context whose last value is `value`.
  int32_t token_after(uint64_t value, uint64_t seed) const;
  // The value chain of a context computed directly (the reference for tests).
  static uint64_t context_value(std::span<const int32_t> tokens);
  // The stand-in log-probabilities of `token` after a context whose last value is `value`,
  // with n_top alternatives: what a logits row would give, as a function of the context.
  Logprobs fake_logprobs(uint64_t value, int32_t token, int32_t n_top) const;
  int64_t n_swapped_out_blocks() const { return n_swapped_out_; }
  int64_t n_swapped_in_blocks() const { return n_swapped_in_; }

 private:
  struct SeqState {
    uint64_t seed = 0;  // 0 for greedy
    int32_t n_logprobs = 0;
  };
  void check_swap(const BlockSwap& s) const;
  // The device slots of a block: the full pool's or the local pool's.
  std::vector<uint64_t>& values(bool local) { return local ? local_kv_ : kv_; }
  std::vector<uint8_t>& written(bool local) { return local ? local_written_ : written_; }

  SimulatorConfig config_;
  std::vector<uint64_t> kv_;        // [n_blocks * block_size]
  std::vector<uint8_t> written_;    // slot written at least once
  std::vector<uint64_t> local_kv_;  // [n_local_blocks * block_size]
  std::vector<uint8_t> local_written_;
  std::vector<uint64_t> host_kv_;  // [n_host_blocks * block_size]
  std::vector<uint8_t> host_written_;
  int64_t n_swapped_out_ = 0, n_swapped_in_ = 0;
  std::unordered_map<SeqId, SeqState> seqs_;
  double elapsed_s_ = 0;
  int64_t n_steps_ = 0;
};

}  // namespace tessera
