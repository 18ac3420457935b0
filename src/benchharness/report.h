#pragma once
// Metrics of a benchmark run and the JSON report (schema "tessera.bench.serve/1", described
// in docs/design/bench-harness.md): config, one entry per request rate with a summary, the
// same metrics per input/output length bucket, failures by reason, and every raw record.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "benchharness/load_generator.h"
#include "benchharness/stats.h"

namespace tessera::bench {

// A summary as the report writes it (null when it has no samples).
nlohmann::json summary_json(const Summary& s);

struct Slo {
  std::optional<double> ttft_ms, tpot_ms;
  bool any() const { return ttft_ms || tpot_ms; }
  // A request meets the SLO when it succeeded, its TTFT is within ttft_ms and its TPOT within
  // tpot_ms (a request with one output token has no TPOT and passes that part).
  bool met_by(const RequestRecord& r) const;
};

struct Metrics {
  int64_t n_requests = 0, n_ok = 0, n_failed = 0, n_good = 0;
  int64_t input_tokens = 0, output_tokens = 0;  // successful requests; input as the server counted
                                                // it when reported, else as planned
  Summary ttft_ms, itl_ms, tpot_ms, e2e_ms, first_byte_ms, queue_ms;  // successful requests
  double request_throughput = 0;                                      // successful requests / run duration
  double output_throughput = 0;                                       // output tokens / s
  double total_token_throughput = 0;                                  // (input + output) tokens / s
  std::optional<double> goodput_fraction;                             // good / all requests; none without an SLO
  std::optional<double> goodput_rps;                                  // good requests / s
  nlohmann::json to_json() const;
};

// `duration_s` divides the counts (a bucket's throughputs are its share of the run's).
Metrics compute_metrics(const std::vector<const RequestRecord*>& records, double duration_s, const Slo& slo);

// Length buckets: [edges[i-1], edges[i]) with an implicit 0 before the first edge and
// infinity after the last.
struct Buckets {
  std::vector<int64_t> input_edges = {128, 512, 2048, 8192};
  std::vector<int64_t> output_edges = {64, 256, 1024};
  static std::string range_label(const std::vector<int64_t>& edges, int64_t value);
};

struct RunReport {
  std::string label;        // "rate 4/s", "trace", ...
  double offered_rate = 0;  // requests/s of the arrival process (inf: all at once)
  double duration_s = 0;
  Metrics summary;
  struct Bucket {
    std::string input_range, output_range;
    Metrics metrics;
  };
  std::vector<Bucket> buckets;
  std::vector<std::pair<std::string, int64_t>> failures;  // reason, count (most frequent first)
  std::vector<RequestRecord> records;
};

RunReport make_run_report(std::string label, double offered_rate, LoadResult result, const Slo& slo,
                          const Buckets& buckets);

struct BenchReport {
  nlohmann::json config;  // what was run: server, model, workload, arrival, SLO, tool versions
  std::vector<RunReport> runs;
  nlohmann::json to_json(bool with_records = true) const;
};

// Parses a report written by to_json (or `tessera bench offline --out`); only the parts
// compare and the HTML page use (label, rate, duration, summary) are required.
BenchReport read_report(const std::string& path);
// Summary metrics from JSON (as written by Metrics::to_json).
Metrics metrics_from_json(const nlohmann::json& j);

// The key failures are grouped by: the error text (HTTP status and the server's message, or
// the transport error), cut to 160 bytes.
std::string failure_reason(const RequestRecord& r);

// `tessera bench compare`: a Markdown table per pair of runs (matched by position), metrics
// of A and B side by side with the ratio B/A.
std::string format_compare(const BenchReport& a, const BenchReport& b, const std::string& name_a,
                           const std::string& name_b);
// A Markdown summary of a report (one row per run), printed at the end of `bench serve`.
std::string format_summary_table(const BenchReport& report);

}  // namespace tessera::bench
