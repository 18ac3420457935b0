// tessera bench serve: an open-loop load generator for any OpenAI-compatible server, with
// SLO reports (JSON + HTML); tessera bench compare: two reports side by side.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>

#include "apps/commands.h"
#include "benchharness/html_report.h"
#include "benchharness/serve_bench.h"
#include "core/error.h"

namespace tessera::apps {

namespace {

struct ServeArgs {
  std::string base_url = "http://127.0.0.1:8000";
  std::string workload;  // file, or a built-in kind
  std::string model;
  std::string api_key;
  std::string endpoint = "chat";
  std::string request_rate;  // number or inf
  std::string rate_sweep;    // "1,2,4"
  std::string arrival;       // poisson, gamma, constant
  double burstiness = 0;
  int max_concurrency = 0;
  int64_t num_requests = 0;
  double duration = 0;
  uint64_t seed = 0;
  double slo_ttft_ms = 0, slo_tpot_ms = 0;
  std::string out, html;
  std::string tokenizer_model;
  std::string input_len, output_len, prefix_len, turns;
  int num_prefixes = 0, questions_per_prefix = 0;
  double think_time = -1;
  std::string trace, corpus;
  double scale = 0;
  double timeout = 600;
  double temperature = 0;
  std::string extra_body;
  bool no_ignore_eos = false;
  int warmup = 0;
  std::string bucket_input, bucket_output;
  bool no_exact_counts_ok = false;
};

std::vector<int64_t> parse_edges(const std::string& text, const char* flag) {
  std::vector<int64_t> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    try {
      out.push_back(std::stoll(text.substr(pos, comma - pos)));
    } catch (const std::exception&) {
      fail(flag, " '", text, "' is not a comma-separated list of token counts");
    }
    TESSERA_CHECK(out.back() > 0 && (out.size() == 1 || out.back() > out[out.size() - 2]), flag,
                  " must be increasing positive token counts");
    pos = comma + 1;
  }
  return out;
}

bench::WorkloadSpec workload_from_args(const ServeArgs& a) {
  bench::WorkloadSpec s;
  const bool builtin = a.workload.empty() || a.workload == "synthetic" || a.workload == "sharegpt" ||
                       a.workload == "shared_prefix" || a.workload == "multi_turn" || a.workload == "trace";
  if (builtin) {
    nlohmann::json j = {{"kind", a.workload.empty() ? "synthetic" : a.workload}};
    if (a.workload == "trace") {
      TESSERA_CHECK(!a.trace.empty(), "--workload trace needs --trace FILE");
      j["trace"] = a.trace;
    }
    s = bench::WorkloadSpec::from_json(j);
    s.name = a.workload.empty() ? "synthetic" : a.workload;
  } else {
    s = bench::WorkloadSpec::from_file(a.workload);
  }
  // Flags override the file.
  if (!a.input_len.empty()) s.input = bench::LengthDist::parse(a.input_len, "--input-len");
  if (!a.output_len.empty()) s.output = bench::LengthDist::parse(a.output_len, "--output-len");
  if (!a.prefix_len.empty()) s.prefix = bench::LengthDist::parse(a.prefix_len, "--prefix-len");
  if (!a.turns.empty()) s.turns = bench::LengthDist::parse(a.turns, "--turns");
  if (a.num_prefixes > 0) s.num_prefixes = a.num_prefixes;
  if (a.questions_per_prefix > 0) s.questions_per_prefix = a.questions_per_prefix;
  if (a.think_time >= 0) s.think_time_s = a.think_time;
  if (!a.trace.empty()) s.trace_path = a.trace;
  if (!a.corpus.empty()) s.corpus_path = a.corpus;
  if (a.scale > 0) s.scale = a.scale;
  if (a.num_requests > 0) s.num_requests = a.num_requests;
  if (a.duration > 0) s.duration_s = a.duration;
  if (!a.arrival.empty()) s.arrival.kind = bench::ArrivalProcess::parse_kind(a.arrival);
  if (a.burstiness > 0) s.arrival.burstiness = a.burstiness;
  if (!a.request_rate.empty()) s.arrival.rate = bench::parse_rate_list(a.request_rate).at(0);
  if (a.slo_ttft_ms > 0) s.slo_ttft_ms = a.slo_ttft_ms;
  if (a.slo_tpot_ms > 0) s.slo_tpot_ms = a.slo_tpot_ms;
  return s;
}

// Progress on stderr: rewritten in place on a terminal, a line every few seconds otherwise.
class ProgressPrinter {
 public:
  ProgressPrinter() : tty_(::isatty(2) == 1) {}
  void operator()(const std::string& label, const bench::Progress& p) {
    if (label != label_) label_ = label, last_print_ = -1e9;  // a new run of the sweep
    if (!tty_ && p.elapsed_s - last_print_ < 5.0 && p.done < p.planned) return;
    last_print_ = p.elapsed_s;
    std::fprintf(
        stderr,
        "%s[bench] %s %6.1fs  sent %lld/%lld  done %lld  failed %lld  in flight %lld%s  |  %.2f req/s  %.1f tok/s%s",
        tty_ ? "\r\033[K" : "", label.c_str(), p.elapsed_s, static_cast<long long>(p.sent),
        static_cast<long long>(p.planned), static_cast<long long>(p.done), static_cast<long long>(p.failed),
        static_cast<long long>(p.in_flight), p.waiting ? (" waiting " + std::to_string(p.waiting)).c_str() : "",
        p.recent_requests_per_s, p.recent_tokens_per_s, tty_ ? "" : "\n");
    if (tty_ && p.done >= p.planned && p.in_flight == 0) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  bool tty_;
  std::string label_;
  double last_print_ = -1e9;
};

std::string default_model(const bench::Endpoint& ep, const std::string& key) {
  // The first model the server lists, like vLLM's benchmark does without --model.
  try {
    const auto r = bench::http_get(ep, "/v1/models", key, 10);
    const auto j = nlohmann::json::parse(r.body, nullptr, false);
    if (r.status == 200 && !j.is_discarded() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
        j["data"][0].contains("id"))
      return j["data"][0]["id"].get<std::string>();
  } catch (const Error&) {
  }
  return "default";
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  if (!f) fail("cannot write '", path, "'");
  f << text;
  TESSERA_CHECK(f.good(), "error writing '", path, "'");
}

void run_bench_serve(const ServeArgs& a, const std::string& command_line) {
  bench::ServeBenchOptions o;
  o.workload = workload_from_args(a);
  o.load.endpoint = bench::Endpoint::parse(a.base_url);
  o.load.api_key = a.api_key;
  o.load.model = a.model.empty() ? default_model(o.load.endpoint, a.api_key) : a.model;
  o.load.api = a.endpoint;
  o.load.max_concurrency = a.max_concurrency;
  o.load.timeout_s = a.timeout;
  o.load.temperature = a.temperature;
  o.load.ignore_eos = !a.no_ignore_eos;
  if (!a.extra_body.empty()) {
    o.load.extra_body = nlohmann::json::parse(a.extra_body, nullptr, false);
    TESSERA_CHECK(!o.load.extra_body.is_discarded() && o.load.extra_body.is_object(),
                  "--extra-body must be a JSON object");
  }
  if (!a.rate_sweep.empty())
    o.rates = bench::parse_rate_list(a.rate_sweep);
  else if (!a.request_rate.empty())
    o.rates = bench::parse_rate_list(a.request_rate);
  o.seed = a.seed;
  o.tokenizer_model = a.tokenizer_model;
  o.allow_estimated_counts = true;
  o.warmup_requests = a.warmup;
  if (!a.bucket_input.empty()) o.buckets.input_edges = parse_edges(a.bucket_input, "--bucket-input");
  if (!a.bucket_output.empty()) o.buckets.output_edges = parse_edges(a.bucket_output, "--bucket-output");
  o.command_line = command_line;
  auto printer = std::make_shared<ProgressPrinter>();
  o.on_progress = [printer](const std::string& label, const bench::Progress& p) { (*printer)(label, p); };
  o.log = [](const std::string& msg) { std::fprintf(stderr, "[bench] %s\n", msg.c_str()); };
  std::fprintf(stderr, "[bench] %s -> %s (%s, model %s)\n", o.workload.name.c_str(), o.load.endpoint.url().c_str(),
               o.load.api.c_str(), o.load.model.c_str());
  const bench::BenchReport report = bench::run_serve_bench(o);
  std::printf("%s", bench::format_summary_table(report).c_str());
  for (const auto& run : report.runs)
    for (const auto& [reason, count] : run.failures)
      std::printf("%s: %lld failed: %s\n", run.label.c_str(), static_cast<long long>(count), reason.c_str());
  if (!a.out.empty()) {
    write_text(a.out, report.to_json().dump(1) + "\n");
    std::fprintf(stderr, "[bench] wrote %s\n", a.out.c_str());
  }
  if (!a.html.empty()) {
    write_text(a.html, bench::html_report(report));
    std::fprintf(stderr, "[bench] wrote %s\n", a.html.c_str());
  }
}

}  // namespace

void add_bench_serve(CLI::App& bench) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "serve", "open-loop load against an OpenAI-compatible server: TTFT, ITL, TPOT, throughput, goodput");
  cmd->add_option("--base-url", a->base_url, "server, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)")
      ->capture_default_str();
  cmd->add_option("-w,--workload", a->workload,
                  "workload JSON file, or a built-in kind: synthetic, sharegpt, shared_prefix, multi_turn, trace");
  cmd->add_option("--model", a->model, "model name sent in requests (default: the server's first /v1/models entry)");
  cmd->add_option("--api-key", a->api_key, "sent as Authorization: Bearer");
  cmd->add_option("--endpoint", a->endpoint, "chat (/v1/chat/completions) or completions (/v1/completions)")
      ->capture_default_str();
  cmd->add_option("--request-rate", a->request_rate, "requests per second, or inf (all at once)");
  cmd->add_option("--rate-sweep", a->rate_sweep, "comma-separated rates: one run and one result per rate");
  cmd->add_option("--arrival", a->arrival, "arrival process: poisson, gamma, constant");
  cmd->add_option("--burstiness", a->burstiness, "gamma shape: < 1 burstier than Poisson, > 1 more regular");
  cmd->add_option("--max-concurrency", a->max_concurrency, "cap on requests in flight (0: none)")
      ->capture_default_str();
  cmd->add_option("--num-requests", a->num_requests, "requests (multi_turn: conversations)");
  cmd->add_option("--duration", a->duration, "stop scheduling arrivals after this many seconds");
  cmd->add_option("--seed", a->seed, "seed of lengths, texts and arrivals")->capture_default_str();
  cmd->add_option("--slo-ttft-ms", a->slo_ttft_ms, "goodput SLO: time to first token (ms)");
  cmd->add_option("--slo-tpot-ms", a->slo_tpot_ms, "goodput SLO: time per output token (ms)");
  cmd->add_option("--out", a->out, "write the JSON report (config, summary, buckets, every request)");
  cmd->add_option("--html", a->html, "write a self-contained HTML report with plots");
  cmd->add_option("--tokenizer-model", a->tokenizer_model,
                  "count prompt tokens with this model's tokenizer (GGUF, alias or HF directory) instead of the "
                  "server's /tokenize");
  cmd->add_option("--input-len", a->input_len,
                  "prompt tokens: N, uniform:A:B, normal:M:S, lognormal:MED:SIGMA, "
                  "empirical:V=W,... (optional :MIN:MAX after normal/lognormal)");
  cmd->add_option("--output-len", a->output_len, "output tokens (max_tokens with ignore_eos), same forms");
  cmd->add_option("--prefix-len", a->prefix_len, "shared_prefix: system prompt tokens");
  cmd->add_option("--num-prefixes", a->num_prefixes, "shared_prefix: distinct system prompts");
  cmd->add_option("--questions-per-prefix", a->questions_per_prefix, "shared_prefix: questions per system prompt");
  cmd->add_option("--turns", a->turns, "multi_turn: turns per conversation (same forms as --input-len)");
  cmd->add_option("--think-time", a->think_time, "multi_turn: seconds between a reply and the next turn");
  cmd->add_option("--trace", a->trace, "trace JSONL (timestamp, input_tokens, output_tokens per line)");
  cmd->add_option("--corpus", a->corpus, "text file prompts are cut from (default: a built-in word list)");
  cmd->add_option("--scale", a->scale, "multiply every drawn length (e.g. 0.25 on a small machine)");
  cmd->add_option("--timeout", a->timeout, "per-request timeout in seconds")->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "sampling temperature sent")->capture_default_str();
  cmd->add_option("--extra-body", a->extra_body, "JSON object merged into every request body");
  cmd->add_flag("--no-ignore-eos", a->no_ignore_eos, "do not send ignore_eos (outputs may end early)");
  cmd->add_option("--warmup", a->warmup, "requests sent one at a time before measuring (not recorded)");
  cmd->add_option("--bucket-input", a->bucket_input, "input bucket edges (default 128,512,2048,8192)");
  cmd->add_option("--bucket-output", a->bucket_output, "output bucket edges (default 64,256,1024)");
  cmd->callback(
      [a, cmd] { run_bench_serve(*a, cmd->config_to_str(/*default_also=*/false, /*write_description=*/false)); });
}

void add_bench_compare(CLI::App& bench) {
  struct CompareArgs {
    std::string a, b, names;
  };
  auto c = std::make_shared<CompareArgs>();
  CLI::App* cmd = bench.add_subcommand("compare", "two bench reports side by side, with ratios B/A");
  cmd->add_option("A", c->a, "baseline report (JSON)")->required()->check(CLI::ExistingFile);
  cmd->add_option("B", c->b, "report to compare (JSON)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--names", c->names, "column names 'A,B' (default: the file names)");
  cmd->callback([c] {
    std::string name_a = c->a, name_b = c->b;
    if (!c->names.empty()) {
      const size_t comma = c->names.find(',');
      TESSERA_CHECK(comma != std::string::npos, "--names needs two names separated by a comma");
      name_a = c->names.substr(0, comma);
      name_b = c->names.substr(comma + 1);
    }
    std::printf("%s",
                bench::format_compare(bench::read_report(c->a), bench::read_report(c->b), name_a, name_b).c_str());
  });
}

}  // namespace tessera::apps
