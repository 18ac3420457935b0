#include "benchharness/offline_report.h"

#include <cstdio>

#include "benchharness/report.h"
#include "benchharness/stats.h"

namespace tessera::bench {

namespace {
Summary summarize_ms(const std::vector<double>& seconds) {
  std::vector<double> ms(seconds.size());
  for (size_t i = 0; i < ms.size(); ++i) ms[i] = seconds[i] * 1000.0;
  return summarize(ms);
}
}  // namespace

nlohmann::json offline_report_json(const std::vector<OfflineBenchRow>& rows, nlohmann::json config) {
  nlohmann::json runs = nlohmann::json::array();
  for (const OfflineBenchRow& r : rows) {
    // Every request arrives at t = 0 (offered rate inf); only what the offline bench measures
    // is written, so missing percentiles read as absent, not as zero.
    nlohmann::json summary = {{"n_requests", r.n_requests},
                              {"n_ok", r.n_requests},
                              {"n_failed", 0},
                              {"request_throughput", r.requests_per_s},
                              {"output_throughput", r.output_tokens_per_s},
                              {"total_token_throughput", r.total_tokens_per_s},
                              {"goodput_fraction", nullptr},
                              {"goodput_rps", nullptr},
                              {"ttft_ms", summary_json(summarize_ms(r.ttft_s))},
                              {"itl_ms", summary_json(summarize_ms(r.itl_s))},
                              {"tpot_ms", summary_json(summarize_ms(r.tpot_s))},
                              {"e2e_ms", summary_json(summarize_ms(r.e2e_s))}};
    runs.push_back(
        {{"label", "concurrency " + std::to_string(r.concurrency) + (r.prefix_cache ? " (prefix cache)" : "")},
         {"offered_rate", "inf"},
         {"duration_s", r.seconds},
         {"summary", summary},
         {"engine",
          {{"concurrency", r.concurrency},
           {"prefix_cache", r.prefix_cache},
           {"prefix_hit_tokens", r.prefix_hit_tokens},
           {"preemptions", r.preemptions},
           {"steps", r.steps},
           {"spec_decode_num_drafts", r.spec.drafts},
           {"spec_decode_draft_tokens", r.spec.draft_tokens},
           {"spec_decode_accepted_tokens", r.spec.accepted_tokens}}}});
  }
  config["tool"] = "tessera bench offline";
  return {{"schema", "tessera.bench.serve/1"}, {"config", std::move(config)}, {"runs", std::move(runs)}};
}

std::string format_offline_table(const std::vector<OfflineBenchRow>& rows) {
  std::string s =
      "| seqs | prefix cache | requests | time (s) | req/s | output tok/s | computed tok/s | TTFT mean (s) | TTFT p50 "
      "(s) | TTFT p99 (s) | ITL mean (ms) | ITL p50 (ms) | ITL p99 (ms) | hit tokens | preemptions | steps | "
      "drafts | draft tokens | accepted |\n"
      "|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  char buf[512];
  for (const OfflineBenchRow& r : rows) {
    const Summary ttft = summarize(r.ttft_s), itl = summarize_ms(r.itl_s);
    std::snprintf(
        buf, sizeof buf,
        "| %d | %s | %d | %.2f | %.2f | %.1f | %.1f | %.3f | %.3f | %.3f | %.1f | %.1f | %.1f | %lld | %lld | %lld | "
        "%lld | %lld | %.1f%% |\n",
        r.concurrency, r.prefix_cache ? "on" : "off", r.n_requests, r.seconds, r.requests_per_s, r.output_tokens_per_s,
        r.total_tokens_per_s, ttft.mean, ttft.p50, ttft.p99, itl.mean, itl.p50, itl.p99,
        static_cast<long long>(r.prefix_hit_tokens), static_cast<long long>(r.preemptions),
        static_cast<long long>(r.steps), static_cast<long long>(r.spec.drafts),
        static_cast<long long>(r.spec.draft_tokens), 100.0 * r.spec.acceptance_rate());
    s += buf;
  }
  return s;
}

}  // namespace tessera::bench
