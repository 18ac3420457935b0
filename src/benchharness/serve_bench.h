#pragma once
// `tessera bench serve` as a library call: plan the workload once, run it at each request
// rate of the sweep against an OpenAI-compatible server, and build the report.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "benchharness/load_generator.h"
#include "benchharness/report.h"
#include "benchharness/workload.h"

namespace tessera::bench {

struct ServeBenchOptions {
  WorkloadSpec workload;
  LoadOptions load;           // endpoint, model, API, concurrency cap, timeouts
  std::vector<double> rates;  // empty: the workload's arrival rate (one run)
  uint64_t seed = 0;
  std::string tokenizer_model;         // count prompt tokens in process with this model's tokenizer
  bool allow_estimated_counts = true;  // no tokenizer and no /tokenize: estimate (marked inexact)
  int warmup_requests = 0;             // sent one at a time before the runs, not recorded
  Buckets buckets;
  std::string command_line;  // recorded in the report's config
  // Progress and notes for the user (stderr in the CLI).
  std::function<void(const std::string& run_label, const Progress&)> on_progress;
  std::function<void(const std::string&)> log;
};

BenchReport run_serve_bench(const ServeBenchOptions& options);

// Rates of a sweep: "1,2,4" or "inf".
std::vector<double> parse_rate_list(const std::string& text);
std::string rate_label(double rate);

}  // namespace tessera::bench
