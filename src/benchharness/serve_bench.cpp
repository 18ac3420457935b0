#include "benchharness/serve_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <limits>
#include <thread>
#include <unistd.h>

#include "core/error.h"

namespace tessera::bench {

std::vector<double> parse_rate_list(const std::string& text) {
  std::vector<double> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    if (item == "inf") {
      out.push_back(std::numeric_limits<double>::infinity());
    } else {
      size_t used = 0;
      double v = 0;
      try {
        v = std::stod(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      TESSERA_CHECK(used == item.size() && used > 0 && v > 0 && std::isfinite(v), "request rate '", item,
                    "' is not a positive number or inf");
      out.push_back(v);
    }
    pos = comma + 1;
  }
  return out;
}

std::string rate_label(double rate) {
  if (std::isinf(rate)) return "rate inf";
  char buf[48];
  std::snprintf(buf, sizeof buf, "rate %g/s", rate);
  return buf;
}

namespace {

std::unique_ptr<TokenCounter> choose_counter(const ServeBenchOptions& o) {
  if (!o.tokenizer_model.empty()) return make_local_token_counter(o.tokenizer_model);
  try {
    return make_server_token_counter(o.load.endpoint, o.load.model, o.load.api_key);
  } catch (const Error& e) {
    TESSERA_CHECK(o.allow_estimated_counts, "cannot count tokens: ", e.what());
    if (o.log)
      o.log(std::string("no token counts from the server (") + e.what() +
            "); prompt lengths are estimated at 4 bytes per token. Use --tokenizer-model for exact counts.");
    return make_estimating_token_counter();
  }
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

}  // namespace

BenchReport run_serve_bench(const ServeBenchOptions& o) {
  WorkloadSpec spec = o.workload;
  std::vector<double> rates = o.rates;
  const bool trace = spec.kind == "trace";
  TESSERA_CHECK(!(trace && !rates.empty()), "a trace replays its own arrival times; drop --request-rate/--rate-sweep");
  if (rates.empty()) rates.push_back(trace ? 0.0 : spec.arrival.rate);
  // With only a duration, plan enough requests for the fastest rate to keep arriving until
  // the end (a 20% margin over the expected count, plus a few).
  const double max_rate = *std::max_element(rates.begin(), rates.end());
  if (!spec.num_requests && spec.duration_s && !trace) {
    TESSERA_CHECK(std::isfinite(max_rate), "--duration needs a finite request rate (or set --num-requests)");
    spec.num_requests = static_cast<int64_t>(std::ceil(max_rate * *spec.duration_s * 1.2)) + 16;
  }
  auto counter = choose_counter(o);
  const TextSource text =
      spec.corpus_path.empty() ? TextSource::builtin(o.seed) : TextSource::from_file(spec.corpus_path);
  const auto t_plan = std::chrono::steady_clock::now();
  const WorkloadPlan plan = plan_workload(spec, *counter, text, o.seed);
  if (o.log) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "planned %lld requests in %zu conversations (%.1f s; tokens: %s)",
                  static_cast<long long>(plan.n_requests), plan.conversations.size(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t_plan).count(),
                  plan.token_counter.c_str());
    o.log(buf);
  }

  Slo slo;
  slo.ttft_ms = spec.slo_ttft_ms;
  slo.tpot_ms = spec.slo_tpot_ms;
  BenchReport report;
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  report.config = {{"tool", "tessera bench serve"},
                   {"started_at", utc_now()},
                   {"command_line", o.command_line},
                   {"host", host},
                   {"cpu_threads", std::thread::hardware_concurrency()},
                   {"base_url", o.load.endpoint.url()},
                   {"endpoint", o.load.api},
                   {"model", o.load.model},
                   {"max_concurrency", o.load.max_concurrency},
                   {"seed", o.seed},
                   {"ignore_eos", o.load.ignore_eos},
                   {"temperature", o.load.temperature},
                   {"extra_body", o.load.extra_body},
                   {"workload", spec.to_json()},
                   {"workload_name", spec.name.empty() ? spec.kind : spec.name},
                   {"token_counter", plan.token_counter},
                   {"exact_token_counts", plan.exact_token_counts},
                   {"text_source", plan.text_source},
                   {"slo",
                    {{"ttft_ms", spec.slo_ttft_ms ? nlohmann::json(*spec.slo_ttft_ms) : nlohmann::json(nullptr)},
                     {"tpot_ms", spec.slo_tpot_ms ? nlohmann::json(*spec.slo_tpot_ms) : nlohmann::json(nullptr)}}},
                   {"buckets", {{"input_edges", o.buckets.input_edges}, {"output_edges", o.buckets.output_edges}}},
                   {"percentiles", "numpy linear interpolation"}};
  nlohmann::json rates_json = nlohmann::json::array();
  for (double r : rates) rates_json.push_back(std::isinf(r) ? nlohmann::json("inf") : nlohmann::json(r));
  report.config["rates"] = trace ? nlohmann::json("trace") : rates_json;

  if (o.warmup_requests > 0) {
    WorkloadPlan warm = plan;
    warm.conversations.resize(std::min<size_t>(warm.conversations.size(), o.warmup_requests));
    for (auto& c : warm.conversations) c.arrival_s = 0, c.turns.resize(1);
    LoadOptions lo = o.load;
    lo.max_concurrency = 1;
    lo.on_progress = nullptr;
    const LoadResult w = run_load(warm, lo);
    int failed = 0;
    for (const auto& r : w.records) failed += !r.ok;
    if (o.log)
      o.log("warm-up: " + std::to_string(w.records.size()) + " requests, " + std::to_string(failed) + " failed");
  }

  for (double rate : rates) {
    WorkloadPlan run_plan = plan;
    ArrivalProcess arrival = spec.arrival;
    std::string label = "trace";
    if (!trace) {
      arrival.rate = rate;
      retime_plan(run_plan, arrival, o.seed, spec.duration_s);
      label = rate_label(rate);
    }
    LoadOptions lo = o.load;
    if (o.on_progress) lo.on_progress = [&](const Progress& p) { o.on_progress(label, p); };
    LoadResult result = run_load(run_plan, lo);
    double offered = rate;
    if (trace && !run_plan.conversations.empty() && run_plan.conversations.back().arrival_s > 0)
      offered = static_cast<double>(run_plan.conversations.size()) / run_plan.conversations.back().arrival_s;
    report.runs.push_back(make_run_report(label, offered, std::move(result), slo, o.buckets));
  }
  return report;
}

}  // namespace tessera::bench
