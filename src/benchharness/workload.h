#pragma once
// A serving workload: what requests look like (prompt and output length distributions, chat
// mix, shared prefixes, multi-turn conversations, a trace) and when they arrive. Parsed from
// a JSON file (docs/design/bench-harness.md has the format and examples) or built from flags,
// then planned into concrete conversations with prompt text of exact token counts.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "benchharness/distributions.h"
#include "benchharness/prompt_text.h"

namespace tessera::bench {

struct WorkloadSpec {
  // "synthetic": prompts and outputs drawn from `input` and `output`;
  // "sharegpt": the ShareGPT-like chat mix (log-normal lengths, see sharegpt_defaults());
  // "shared_prefix": num_prefixes system prompts × questions_per_prefix questions;
  // "multi_turn": conversations of `turns` turns that grow with each reply;
  // "trace": arrival times and lengths replayed from a JSONL file.
  std::string kind = "synthetic";
  std::string name;
  LengthDist input = LengthDist::fixed(128);   // user message tokens (per turn)
  LengthDist output = LengthDist::fixed(128);  // max_tokens, with ignore_eos
  double scale = 1.0;                          // multiplies every drawn length (small machines)
  // shared_prefix
  int num_prefixes = 4;
  int questions_per_prefix = 16;
  LengthDist prefix = LengthDist::fixed(512);  // system prompt tokens
  // multi_turn
  LengthDist turns = LengthDist::fixed(4);
  double think_time_s = 0;  // pause between a reply and the next turn
  // trace
  std::string trace_path;
  // common
  std::string corpus_path;              // empty: built-in word list
  std::optional<int64_t> num_requests;  // default: 100 (shared_prefix: prefixes × questions)
  std::optional<double> duration_s;     // stop scheduling arrivals after this time
  ArrivalProcess arrival;
  std::optional<double> slo_ttft_ms, slo_tpot_ms;

  static WorkloadSpec from_json(const nlohmann::json& j);
  static WorkloadSpec from_file(const std::string& path);
  nlohmann::json to_json() const;
  // The ShareGPT-like mix's length distributions (documented in the design doc).
  static void sharegpt_defaults(LengthDist& input, LengthDist& output);
};

struct PlannedTurn {
  std::string user_text;
  int64_t user_tokens = 0;
  int64_t output_tokens = 0;  // max_tokens
};

// One conversation; single-turn workloads have one turn each. Turn 0 is sent at `arrival_s`,
// turn k+1 think_time_s after turn k's reply completes (the history includes the reply).
struct PlannedConversation {
  int64_t id = 0;
  double arrival_s = 0;
  std::string system_text;  // empty: no system message
  int64_t system_tokens = 0;
  int prefix_group = -1;  // shared_prefix: which system prompt
  std::vector<PlannedTurn> turns;
};

struct WorkloadPlan {
  std::vector<PlannedConversation> conversations;  // by arrival time
  int64_t n_requests = 0;                          // turns in all
  double think_time_s = 0;                         // multi_turn
  bool exact_token_counts = true;
  std::string token_counter;  // how counts were obtained
  std::string text_source;
};

// Draws lengths and arrivals from `seed` and cuts the texts. Same spec, seed and counter:
// same plan. Arrivals follow spec.arrival (trace: the file); spec.duration_s is not applied
// here except to traces (retime_plan applies it per run).
WorkloadPlan plan_workload(const WorkloadSpec& spec, TokenCounter& counter, const TextSource& text, uint64_t seed);

// Only the arrival times of a plan change between the rates of a sweep: the same prompts are
// re-timed with `arrival` (same seed), so runs differ only in load.
void retime_plan(WorkloadPlan& plan, const ArrivalProcess& arrival, uint64_t seed, std::optional<double> duration_s);

// One line of a trace file: {"timestamp": s, "input_tokens": n, "output_tokens": m}
// ("timestamp_ms" instead of "timestamp"; "input_length"/"output_length" also accepted,
// as in Mooncake traces). Lines must be in time order.
struct TraceEntry {
  double timestamp_s = 0;
  int64_t input_tokens = 0, output_tokens = 0;
};
std::vector<TraceEntry> read_trace(const std::string& path);

}  // namespace tessera::bench
