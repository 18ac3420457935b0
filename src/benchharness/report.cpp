#include "benchharness/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "core/error.h"

namespace tessera::bench {

nlohmann::json summary_json(const Summary& s) {
  if (s.count == 0) return nullptr;
  return {{"count", s.count}, {"mean", s.mean}, {"std", s.std}, {"min", s.min}, {"p50", s.p50},
          {"p90", s.p90},     {"p95", s.p95},   {"p99", s.p99}, {"max", s.max}};
}

namespace {

Summary summary_from_json(const nlohmann::json& j) {
  Summary s;
  if (!j.is_object()) return s;
  // Fields a writer left out (e.g. the offline bench's P90) read as NaN: "not measured".
  auto get = [&](const char* key) { return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN; };
  s.count = j.value("count", size_t{0});
  s.mean = get("mean");
  s.std = get("std");
  s.min = get("min");
  s.p50 = get("p50");
  s.p90 = get("p90");
  s.p95 = get("p95");
  s.p99 = get("p99");
  s.max = get("max");
  return s;
}

nlohmann::json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

std::optional<double> optional_from(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_number()) return std::nullopt;
  return j[key].get<double>();
}

}  // namespace

bool Slo::met_by(const RequestRecord& r) const {
  if (!r.ok) return false;
  if (ttft_ms && !(r.ttft_s >= 0 && r.ttft_s * 1000.0 <= *ttft_ms)) return false;
  const double tpot = r.tpot_s();
  if (tpot_ms && tpot >= 0 && tpot * 1000.0 > *tpot_ms) return false;
  return true;
}

nlohmann::json Metrics::to_json() const {
  return {{"n_requests", n_requests},
          {"n_ok", n_ok},
          {"n_failed", n_failed},
          {"n_good", n_good},
          {"input_tokens", input_tokens},
          {"output_tokens", output_tokens},
          {"request_throughput", request_throughput},
          {"output_throughput", output_throughput},
          {"total_token_throughput", total_token_throughput},
          {"goodput_fraction", optional_json(goodput_fraction)},
          {"goodput_rps", optional_json(goodput_rps)},
          {"ttft_ms", summary_json(ttft_ms)},
          {"itl_ms", summary_json(itl_ms)},
          {"tpot_ms", summary_json(tpot_ms)},
          {"e2e_ms", summary_json(e2e_ms)},
          {"first_byte_ms", summary_json(first_byte_ms)},
          {"queue_ms", summary_json(queue_ms)}};
}

Metrics metrics_from_json(const nlohmann::json& j) {
  Metrics m;
  m.n_requests = j.value("n_requests", int64_t{0});
  m.n_ok = j.value("n_ok", int64_t{0});
  m.n_failed = j.value("n_failed", int64_t{0});
  m.n_good = j.value("n_good", int64_t{0});
  m.input_tokens = j.value("input_tokens", int64_t{0});
  m.output_tokens = j.value("output_tokens", int64_t{0});
  m.request_throughput = j.value("request_throughput", 0.0);
  m.output_throughput = j.value("output_throughput", 0.0);
  m.total_token_throughput = j.value("total_token_throughput", 0.0);
  m.goodput_fraction = optional_from(j, "goodput_fraction");
  m.goodput_rps = optional_from(j, "goodput_rps");
  auto sub = [&](const char* key) { return j.contains(key) ? summary_from_json(j[key]) : Summary{}; };
  m.ttft_ms = sub("ttft_ms");
  m.itl_ms = sub("itl_ms");
  m.tpot_ms = sub("tpot_ms");
  m.e2e_ms = sub("e2e_ms");
  m.first_byte_ms = sub("first_byte_ms");
  m.queue_ms = sub("queue_ms");
  return m;
}

Metrics compute_metrics(const std::vector<const RequestRecord*>& records, double duration_s, const Slo& slo) {
  Metrics m;
  std::vector<double> ttft, itl, tpot, e2e, first_byte, queue;
  for (const RequestRecord* r : records) {
    ++m.n_requests;
    if (!r->ok) {
      ++m.n_failed;
      continue;
    }
    ++m.n_ok;
    if (slo.met_by(*r)) ++m.n_good;
    m.input_tokens += r->prompt_tokens >= 0 ? r->prompt_tokens : r->input_tokens;
    m.output_tokens += r->output_tokens;
    if (r->ttft_s >= 0) ttft.push_back(r->ttft_s * 1000.0);
    for (double g : r->itl_s()) itl.push_back(g * 1000.0);
    if (const double t = r->tpot_s(); t >= 0) tpot.push_back(t * 1000.0);
    e2e.push_back(r->e2e_s * 1000.0);
    if (r->first_byte_s >= 0) first_byte.push_back(r->first_byte_s * 1000.0);
    if (r->queue_s >= 0) queue.push_back(r->queue_s * 1000.0);
  }
  m.ttft_ms = summarize(ttft);
  m.itl_ms = summarize(itl);
  m.tpot_ms = summarize(tpot);
  m.e2e_ms = summarize(e2e);
  m.first_byte_ms = summarize(first_byte);
  m.queue_ms = summarize(queue);
  if (duration_s > 0) {
    m.request_throughput = m.n_ok / duration_s;
    m.output_throughput = m.output_tokens / duration_s;
    m.total_token_throughput = (m.input_tokens + m.output_tokens) / duration_s;
  }
  if (slo.any() && m.n_requests > 0) {
    m.goodput_fraction = static_cast<double>(m.n_good) / static_cast<double>(m.n_requests);
    m.goodput_rps = duration_s > 0 ? m.n_good / duration_s : 0.0;
  }
  return m;
}

std::string Buckets::range_label(const std::vector<int64_t>& edges, int64_t value) {
  int64_t lo = 0;
  for (int64_t e : edges) {
    if (value < e) return "[" + std::to_string(lo) + ", " + std::to_string(e) + ")";
    lo = e;
  }
  return "[" + std::to_string(lo) + ", inf)";
}

std::string failure_reason(const RequestRecord& r) {
  std::string s = r.error.empty() ? "unknown" : r.error;
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return s;
}

RunReport make_run_report(std::string label, double offered_rate, LoadResult result, const Slo& slo,
                          const Buckets& buckets) {
  RunReport rep;
  rep.label = std::move(label);
  rep.offered_rate = offered_rate;
  rep.duration_s = result.duration_s;
  rep.records = std::move(result.records);
  std::vector<const RequestRecord*> all;
  for (const auto& r : rep.records) all.push_back(&r);
  rep.summary = compute_metrics(all, rep.duration_s, slo);
  // Buckets by planned lengths: they are what the workload asked for, known for failures too.
  std::map<std::pair<int64_t, int64_t>, std::vector<const RequestRecord*>> by_bucket;
  auto bucket_index = [](const std::vector<int64_t>& edges, int64_t v) {
    return static_cast<int64_t>(std::upper_bound(edges.begin(), edges.end(), v) - edges.begin());
  };
  for (const auto& r : rep.records)
    by_bucket[{bucket_index(buckets.input_edges, r.input_tokens), bucket_index(buckets.output_edges, r.max_tokens)}]
        .push_back(&r);
  for (const auto& [key, recs] : by_bucket) {
    RunReport::Bucket b;
    b.input_range = Buckets::range_label(buckets.input_edges, recs.front()->input_tokens);
    b.output_range = Buckets::range_label(buckets.output_edges, recs.front()->max_tokens);
    b.metrics = compute_metrics(recs, rep.duration_s, slo);
    rep.buckets.push_back(std::move(b));
  }
  std::map<std::string, int64_t> failures;
  for (const auto& r : rep.records)
    if (!r.ok) ++failures[failure_reason(r)];
  rep.failures.assign(failures.begin(), failures.end());
  std::stable_sort(rep.failures.begin(), rep.failures.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return rep;
}

nlohmann::json BenchReport::to_json(bool with_records) const {
  nlohmann::json runs_json = nlohmann::json::array();
  for (const RunReport& r : runs) {
    nlohmann::json buckets = nlohmann::json::array();
    for (const auto& b : r.buckets) {
      nlohmann::json bj = b.metrics.to_json();
      bj["input_range"] = b.input_range;
      bj["output_range"] = b.output_range;
      buckets.push_back(std::move(bj));
    }
    nlohmann::json failures = nlohmann::json::array();
    for (const auto& [reason, count] : r.failures) failures.push_back({{"reason", reason}, {"count", count}});
    nlohmann::json rj = {{"label", r.label},
                         {"duration_s", r.duration_s},
                         {"summary", r.summary.to_json()},
                         {"buckets", buckets},
                         {"failures", failures}};
    rj["offered_rate"] = std::isinf(r.offered_rate) ? nlohmann::json("inf") : nlohmann::json(r.offered_rate);
    if (with_records) {
      nlohmann::json recs = nlohmann::json::array();
      for (const auto& rec : r.records) recs.push_back(rec.to_json());
      rj["requests"] = std::move(recs);
    }
    runs_json.push_back(std::move(rj));
  }
  return {{"schema", "tessera.bench.serve/1"}, {"config", config}, {"runs", runs_json}};
}

BenchReport read_report(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read report '", path, "'");
  const auto j = nlohmann::json::parse(in, nullptr, false);
  TESSERA_CHECK(!j.is_discarded() && j.is_object(), "report '", path, "' is not a JSON object");
  TESSERA_CHECK(j.contains("runs") && j["runs"].is_array(), "report '", path, "' has no \"runs\" array");
  BenchReport rep;
  rep.config = j.value("config", nlohmann::json::object());
  for (const auto& rj : j["runs"]) {
    RunReport r;
    r.label = rj.value("label", std::string());
    if (rj.contains("offered_rate"))
      r.offered_rate = rj["offered_rate"].is_number() ? rj["offered_rate"].get<double>() : INFINITY;
    r.duration_s = rj.value("duration_s", 0.0);
    TESSERA_CHECK(rj.contains("summary") && rj["summary"].is_object(), "report '", path, "': a run has no summary");
    r.summary = metrics_from_json(rj["summary"]);
    if (rj.contains("buckets"))
      for (const auto& bj : rj["buckets"])
        r.buckets.push_back(
            {bj.value("input_range", std::string()), bj.value("output_range", std::string()), metrics_from_json(bj)});
    if (rj.contains("failures"))
      for (const auto& f : rj["failures"])
        r.failures.emplace_back(f.value("reason", std::string()), f.value("count", int64_t{0}));
    if (rj.contains("requests"))
      for (const auto& q : rj["requests"]) r.records.push_back(RequestRecord::from_json(q));
    rep.runs.push_back(std::move(r));
  }
  return rep;
}

namespace {

std::string fmt(double v, int prec = 2) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

struct Row {
  std::string name;
  std::optional<double> a, b;
  bool higher_is_better;
};

std::vector<Row> compare_rows(const Metrics& a, const Metrics& b) {
  auto s = [](const Summary& x, double Summary::*f) -> std::optional<double> {
    if (x.count == 0 || std::isnan(x.*f)) return std::nullopt;
    return x.*f;
  };
  std::vector<Row> rows = {
      {"successful requests", double(a.n_ok), double(b.n_ok), true},
      {"failed requests", double(a.n_failed), double(b.n_failed), false},
      {"request throughput (req/s)", a.request_throughput, b.request_throughput, true},
      {"output throughput (tok/s)", a.output_throughput, b.output_throughput, true},
      {"total token throughput (tok/s)", a.total_token_throughput, b.total_token_throughput, true},
      {"goodput (req/s)", a.goodput_rps, b.goodput_rps, true},
      {"goodput (share of requests)", a.goodput_fraction, b.goodput_fraction, true},
  };
  const std::pair<const char*, Summary Metrics::*> lat[] = {{"TTFT", &Metrics::ttft_ms},
                                                            {"TPOT", &Metrics::tpot_ms},
                                                            {"ITL", &Metrics::itl_ms},
                                                            {"E2E", &Metrics::e2e_ms},
                                                            {"queue", &Metrics::queue_ms}};
  const std::pair<const char*, double Summary::*> stats[] = {
      {"mean", &Summary::mean}, {"P50", &Summary::p50}, {"P90", &Summary::p90}, {"P99", &Summary::p99}};
  for (const auto& [name, field] : lat) {
    if ((a.*field).count == 0 && (b.*field).count == 0) continue;
    for (const auto& [sname, sfield] : stats)
      rows.push_back({std::string(name) + " " + sname + " (ms)", s(a.*field, sfield), s(b.*field, sfield), false});
  }
  return rows;
}

}  // namespace

std::string format_compare(const BenchReport& a, const BenchReport& b, const std::string& name_a,
                           const std::string& name_b) {
  std::ostringstream os;
  const size_t n = std::max(a.runs.size(), b.runs.size());
  if (a.runs.size() != b.runs.size())
    os << "note: " << name_a << " has " << a.runs.size() << " runs, " << name_b << " has " << b.runs.size()
       << "; runs are paired by position\n\n";
  for (size_t i = 0; i < n; ++i) {
    if (i >= a.runs.size() || i >= b.runs.size()) break;
    const RunReport& ra = a.runs[i];
    const RunReport& rb = b.runs[i];
    os << "### " << (ra.label == rb.label ? ra.label : ra.label + " vs " + rb.label) << "\n\n";
    os << "| metric | " << name_a << " | " << name_b << " | " << name_b << " / " << name_a
       << " |\n|---|---:|---:|---:|\n";
    for (const Row& r : compare_rows(ra.summary, rb.summary)) {
      os << "| " << r.name << " | " << (r.a ? fmt(*r.a) : "-") << " | " << (r.b ? fmt(*r.b) : "-") << " | ";
      if (r.a && r.b && *r.a != 0)
        os << fmt(*r.b / *r.a) << "x" << (r.higher_is_better ? "" : " (lower is better)");
      else
        os << "-";
      os << " |\n";
    }
    os << "\n";
  }
  return os.str();
}

std::string format_summary_table(const BenchReport& report) {
  std::ostringstream os;
  os << "| run | ok | failed | req/s | out tok/s | total tok/s | goodput req/s | goodput % | TTFT P50 ms | TTFT P99 ms "
        "| TPOT P50 ms | TPOT P99 ms | ITL P50 ms | ITL P99 ms | E2E P50 ms |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const RunReport& r : report.runs) {
    const Metrics& m = r.summary;
    auto opt = [](const std::optional<double>& v, double mult = 1) { return v ? fmt(*v * mult) : std::string("-"); };
    auto sm = [](const Summary& s, double Summary::*f) {
      return s.count && !std::isnan(s.*f) ? fmt(s.*f) : std::string("-");
    };
    os << "| " << r.label << " | " << m.n_ok << " | " << m.n_failed << " | " << fmt(m.request_throughput) << " | "
       << fmt(m.output_throughput, 1) << " | " << fmt(m.total_token_throughput, 1) << " | " << opt(m.goodput_rps)
       << " | " << opt(m.goodput_fraction, 100) << " | " << sm(m.ttft_ms, &Summary::p50) << " | "
       << sm(m.ttft_ms, &Summary::p99) << " | " << sm(m.tpot_ms, &Summary::p50) << " | " << sm(m.tpot_ms, &Summary::p99)
       << " | " << sm(m.itl_ms, &Summary::p50) << " | " << sm(m.itl_ms, &Summary::p99) << " | "
       << sm(m.e2e_ms, &Summary::p50) << " |\n";
  }
  return os.str();
}

}  // namespace tessera::bench
