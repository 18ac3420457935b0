#include "benchharness/workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessera::bench {

namespace {

constexpr int64_t kDefaultRequests = 100;

const std::vector<std::string> kKinds = {"synthetic", "sharegpt", "shared_prefix", "multi_turn", "trace"};

void check_keys(const nlohmann::json& j, const std::vector<std::string>& allowed, const std::string& where) {
  for (const auto& [key, value] : j.items())
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) fail(where, ": unknown key \"", key, "\"");
}

double positive_number(const nlohmann::json& j, const std::string& what) {
  TESSERA_CHECK(j.is_number() && j.get<double>() >= 0 && std::isfinite(j.get<double>()), what,
                " must be a non-negative number");
  return j.get<double>();
}

int64_t scaled(int64_t v, double scale) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::llround(static_cast<double>(v) * scale)));
}

}  // namespace

void WorkloadSpec::sharegpt_defaults(LengthDist& input, LengthDist& output) {
  // Right-skewed like real chat: short questions dominate, a long tail of pasted documents;
  // replies are longer than questions on average (see the design doc for the reasoning).
  input.kind = LengthDist::Kind::LogNormal;
  input.a = 100;  // median
  input.b = 1.0;  // mean = 100 * e^0.5 = 165
  input.min = 4;
  input.max = 2048;
  output.kind = LengthDist::Kind::LogNormal;
  output.a = 150;
  output.b = 0.8;  // mean = 150 * e^0.32 = 207
  output.min = 4;
  output.max = 1024;
}

WorkloadSpec WorkloadSpec::from_json(const nlohmann::json& j) {
  TESSERA_CHECK(j.is_object(), "workload: expected a JSON object");
  check_keys(j,
             {"kind", "name", "input", "output", "scale", "shared_prefix", "multi_turn", "trace", "corpus",
              "num_requests", "duration_s", "arrival", "slo"},
             "workload");
  WorkloadSpec s;
  if (j.contains("kind")) {
    TESSERA_CHECK(j["kind"].is_string(), "workload: \"kind\" must be a string");
    s.kind = j["kind"];
    TESSERA_CHECK(std::find(kKinds.begin(), kKinds.end(), s.kind) != kKinds.end(), "workload: unknown kind '", s.kind,
                  "' (synthetic, sharegpt, shared_prefix, multi_turn, trace)");
  }
  if (s.kind == "sharegpt") sharegpt_defaults(s.input, s.output);
  if (j.contains("name")) s.name = j["name"].get<std::string>();
  if (j.contains("input")) s.input = LengthDist::from_json(j["input"], "workload.input");
  if (j.contains("output")) s.output = LengthDist::from_json(j["output"], "workload.output");
  if (j.contains("scale")) {
    s.scale = positive_number(j["scale"], "workload.scale");
    TESSERA_CHECK(s.scale > 0, "workload.scale must be positive");
  }
  if (j.contains("shared_prefix")) {
    const auto& sp = j["shared_prefix"];
    TESSERA_CHECK(sp.is_object(), "workload.shared_prefix must be an object");
    check_keys(sp, {"num_prefixes", "questions_per_prefix", "prefix"}, "workload.shared_prefix");
    if (sp.contains("num_prefixes")) s.num_prefixes = sp["num_prefixes"].get<int>();
    if (sp.contains("questions_per_prefix")) s.questions_per_prefix = sp["questions_per_prefix"].get<int>();
    if (sp.contains("prefix")) s.prefix = LengthDist::from_json(sp["prefix"], "workload.shared_prefix.prefix");
    TESSERA_CHECK(s.num_prefixes >= 1 && s.questions_per_prefix >= 1,
                  "workload.shared_prefix: num_prefixes and questions_per_prefix must be positive");
  }
  if (j.contains("multi_turn")) {
    const auto& mt = j["multi_turn"];
    TESSERA_CHECK(mt.is_object(), "workload.multi_turn must be an object");
    check_keys(mt, {"turns", "think_time_s"}, "workload.multi_turn");
    if (mt.contains("turns")) s.turns = LengthDist::from_json(mt["turns"], "workload.multi_turn.turns");
    if (mt.contains("think_time_s"))
      s.think_time_s = positive_number(mt["think_time_s"], "workload.multi_turn.think_time_s");
  }
  if (j.contains("trace")) s.trace_path = j["trace"].get<std::string>();
  if (j.contains("corpus")) s.corpus_path = j["corpus"].get<std::string>();
  if (j.contains("num_requests")) {
    TESSERA_CHECK(j["num_requests"].is_number_integer() && j["num_requests"].get<int64_t>() >= 1,
                  "workload.num_requests must be a positive integer");
    s.num_requests = j["num_requests"].get<int64_t>();
  }
  if (j.contains("duration_s")) s.duration_s = positive_number(j["duration_s"], "workload.duration_s");
  if (j.contains("arrival")) {
    const auto& a = j["arrival"];
    TESSERA_CHECK(a.is_object(), "workload.arrival must be an object");
    check_keys(a, {"process", "rate", "burstiness"}, "workload.arrival");
    if (a.contains("process")) s.arrival.kind = ArrivalProcess::parse_kind(a["process"].get<std::string>());
    if (a.contains("rate")) {
      if (a["rate"].is_string() && a["rate"] == "inf")
        s.arrival.rate = std::numeric_limits<double>::infinity();
      else
        s.arrival.rate = positive_number(a["rate"], "workload.arrival.rate");
    }
    if (a.contains("burstiness"))
      s.arrival.burstiness = positive_number(a["burstiness"], "workload.arrival.burstiness");
    if (s.arrival.kind == ArrivalProcess::Kind::Gamma && !a.contains("burstiness"))
      fail("workload.arrival: gamma needs \"burstiness\"");
  }
  if (j.contains("slo")) {
    const auto& slo = j["slo"];
    TESSERA_CHECK(slo.is_object(), "workload.slo must be an object");
    check_keys(slo, {"ttft_ms", "tpot_ms"}, "workload.slo");
    if (slo.contains("ttft_ms")) s.slo_ttft_ms = positive_number(slo["ttft_ms"], "workload.slo.ttft_ms");
    if (slo.contains("tpot_ms")) s.slo_tpot_ms = positive_number(slo["tpot_ms"], "workload.slo.tpot_ms");
  }
  if (s.kind == "trace") {
    TESSERA_CHECK(!s.trace_path.empty(), "workload: kind \"trace\" needs \"trace\": \"file.jsonl\"");
    s.arrival.kind = ArrivalProcess::Kind::Trace;
  }
  return s;
}

WorkloadSpec WorkloadSpec::from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read workload file '", path, "'");
  const auto j = nlohmann::json::parse(in, nullptr, false, /*ignore_comments=*/true);
  TESSERA_CHECK(!j.is_discarded(), "workload file '", path, "' is not valid JSON");
  WorkloadSpec s = from_json(j);
  if (s.name.empty()) s.name = path;
  return s;
}

nlohmann::json WorkloadSpec::to_json() const {
  nlohmann::json j = {
      {"kind", kind}, {"name", name}, {"input", input.to_json()}, {"output", output.to_json()}, {"scale", scale}};
  if (kind == "shared_prefix")
    j["shared_prefix"] = {
        {"num_prefixes", num_prefixes}, {"questions_per_prefix", questions_per_prefix}, {"prefix", prefix.to_json()}};
  if (kind == "multi_turn") j["multi_turn"] = {{"turns", turns.to_json()}, {"think_time_s", think_time_s}};
  if (kind == "trace") j["trace"] = trace_path;
  j["corpus"] = corpus_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(corpus_path);
  if (num_requests) j["num_requests"] = *num_requests;
  if (duration_s) j["duration_s"] = *duration_s;
  j["arrival"] = {{"process", arrival.name()}, {"burstiness", arrival.burstiness}};
  j["arrival"]["rate"] = std::isinf(arrival.rate) ? nlohmann::json("inf") : nlohmann::json(arrival.rate);
  nlohmann::json slo = nlohmann::json::object();
  if (slo_ttft_ms) slo["ttft_ms"] = *slo_ttft_ms;
  if (slo_tpot_ms) slo["tpot_ms"] = *slo_tpot_ms;
  j["slo"] = slo;
  return j;
}

std::vector<TraceEntry> read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("cannot read trace '", path, "'");
  std::vector<TraceEntry> out;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    const std::string where = path + ":" + std::to_string(line_no);
    TESSERA_CHECK(!j.is_discarded() && j.is_object(), where, ": not a JSON object");
    TraceEntry e;
    if (j.contains("timestamp"))
      e.timestamp_s = positive_number(j["timestamp"], where + ": timestamp");
    else if (j.contains("timestamp_ms"))
      e.timestamp_s = positive_number(j["timestamp_ms"], where + ": timestamp_ms") / 1000.0;
    else
      fail(where, ": missing \"timestamp\" (seconds) or \"timestamp_ms\"");
    auto length = [&](const char* a, const char* b) -> int64_t {
      const char* key = j.contains(a) ? a : b;
      TESSERA_CHECK(j.contains(key) && j[key].is_number_integer() && j[key].get<int64_t>() >= 1, where,
                    ": missing or bad \"", a, "\"");
      return j[key].get<int64_t>();
    };
    e.input_tokens = length("input_tokens", "input_length");
    e.output_tokens = length("output_tokens", "output_length");
    TESSERA_CHECK(out.empty() || e.timestamp_s >= out.back().timestamp_s, where, ": timestamps go backwards");
    out.push_back(e);
  }
  TESSERA_CHECK(!out.empty(), "trace '", path, "' has no requests");
  return out;
}

WorkloadPlan plan_workload(const WorkloadSpec& spec, TokenCounter& counter, const TextSource& text, uint64_t seed) {
  WorkloadPlan plan;
  plan.exact_token_counts = counter.exact();
  plan.token_counter = counter.describe();
  plan.text_source = text.describe();
  plan.think_time_s = spec.think_time_s;
  // Separate streams: lengths and texts never shift when only the arrival process changes.
  Rng len_rng(seed * 0x9E3779B97F4A7C15ULL + 1), text_rng(seed * 0x9E3779B97F4A7C15ULL + 2);
  auto draw = [&](const LengthDist& d) { return scaled(d.sample(len_rng), spec.scale); };
  auto make_turn = [&](int64_t in_tokens, int64_t out_tokens) {
    PlannedTurn t;
    t.user_tokens = in_tokens;
    t.output_tokens = out_tokens;
    t.user_text = make_text_with_tokens(text, counter, in_tokens, text_rng);
    return t;
  };

  if (spec.kind == "trace") {
    const auto trace = read_trace(spec.trace_path);
    const size_t n = std::min<size_t>(trace.size(), spec.num_requests.value_or(trace.size()));
    for (size_t i = 0; i < n; ++i) {
      if (spec.duration_s && trace[i].timestamp_s - trace[0].timestamp_s > *spec.duration_s) break;
      PlannedConversation c;
      c.id = static_cast<int64_t>(i);
      c.arrival_s = trace[i].timestamp_s - trace[0].timestamp_s;
      c.turns.push_back(
          make_turn(scaled(trace[i].input_tokens, spec.scale), scaled(trace[i].output_tokens, spec.scale)));
      plan.conversations.push_back(std::move(c));
    }
  } else if (spec.kind == "shared_prefix") {
    std::vector<std::string> prefixes;
    std::vector<int64_t> prefix_tokens;
    for (int p = 0; p < spec.num_prefixes; ++p) {
      prefix_tokens.push_back(draw(spec.prefix));
      prefixes.push_back(make_text_with_tokens(text, counter, prefix_tokens.back(), text_rng));
    }
    const int64_t n = spec.num_requests.value_or(int64_t{spec.num_prefixes} * spec.questions_per_prefix);
    // Every prefix gets its questions; the order is shuffled so groups interleave in time.
    std::vector<int> groups(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) groups[i] = static_cast<int>(i % spec.num_prefixes);
    for (int64_t i = n - 1; i > 0; --i) std::swap(groups[i], groups[len_rng.uniform_int(0, i)]);
    for (int64_t i = 0; i < n; ++i) {
      PlannedConversation c;
      c.id = i;
      c.prefix_group = groups[i];
      c.system_text = prefixes[groups[i]];
      c.system_tokens = prefix_tokens[groups[i]];
      const int64_t in = draw(spec.input), out = draw(spec.output);
      c.turns.push_back(make_turn(in, out));
      plan.conversations.push_back(std::move(c));
    }
  } else {
    const int64_t n = spec.num_requests.value_or(kDefaultRequests);
    const bool multi = spec.kind == "multi_turn";
    for (int64_t i = 0; i < n; ++i) {
      PlannedConversation c;
      c.id = i;
      const int64_t n_turns = multi ? std::max<int64_t>(1, spec.turns.sample(len_rng)) : 1;
      for (int64_t t = 0; t < n_turns; ++t) {
        const int64_t in = draw(spec.input), out = draw(spec.output);
        c.turns.push_back(make_turn(in, out));
      }
      plan.conversations.push_back(std::move(c));
    }
  }
  // The duration limit is applied when the plan is timed for a run (retime_plan per rate), so
  // a sweep's fast rates are not cut to what the spec's own rate would send in time.
  if (spec.kind != "trace") retime_plan(plan, spec.arrival, seed, std::nullopt);
  plan.n_requests = 0;
  for (const auto& c : plan.conversations) plan.n_requests += static_cast<int64_t>(c.turns.size());
  return plan;
}

void retime_plan(WorkloadPlan& plan, const ArrivalProcess& arrival, uint64_t seed, std::optional<double> duration_s) {
  if (arrival.kind == ArrivalProcess::Kind::Trace) return;  // a trace keeps its own times
  Rng arrival_rng(seed * 0x9E3779B97F4A7C15ULL + 3);
  const auto times = arrival.times(plan.conversations.size(), arrival_rng, duration_s.value_or(0));
  // With a duration limit, conversations past it are dropped.
  plan.conversations.resize(times.size());
  for (size_t i = 0; i < times.size(); ++i) plan.conversations[i].arrival_s = times[i];
  plan.n_requests = 0;
  for (const auto& c : plan.conversations) plan.n_requests += static_cast<int64_t>(c.turns.size());
}

}  // namespace tessera::bench
