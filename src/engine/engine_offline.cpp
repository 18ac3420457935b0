#include "engine/engine_offline.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <istream>
#include <map>
#include <nlohmann/json.hpp>
#include <ostream>
#include <random>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Strict field readers: a wrong type is an error naming the field, never a silent default.
template <typename T>
void read_number(const json& j, const char* key, T& out) {
  const auto it = j.find(key);
  if (it == j.end()) return;
  if constexpr (std::is_integral_v<T>) {
    TESSERA_CHECK(it->is_number_integer(), "'", key, "' must be an integer");
    const auto v = it->get<int64_t>();
    TESSERA_CHECK(v >= std::numeric_limits<T>::min() && v <= std::numeric_limits<T>::max(), "'", key, "' = ", v,
                  " is out of range");
    out = static_cast<T>(v);
  } else {
    TESSERA_CHECK(it->is_number(), "'", key, "' must be a number");
    out = it->get<T>();
  }
}

Request parse_request(const json& j, const Tokenizer& tok, const OfflineBatchOptions& o) {
  TESSERA_CHECK(j.is_object(), "a request line must be a JSON object");
  Request r;
  const auto p = j.find("prompt");
  const auto pt = j.find("prompt_tokens");
  TESSERA_CHECK((p != j.end()) != (pt != j.end()), "give exactly one of 'prompt' and 'prompt_tokens'");
  if (p != j.end()) {
    TESSERA_CHECK(p->is_string(), "'prompt' must be a string");
    r.prompt = tok.encode(p->get<std::string>(), true, o.parse_special);
  } else {
    TESSERA_CHECK(pt->is_array(), "'prompt_tokens' must be an array of token ids");
    for (const json& t : *pt) {
      TESSERA_CHECK(t.is_number_integer(), "'prompt_tokens' must hold integers");
      const int64_t v = t.get<int64_t>();
      TESSERA_CHECK(v >= 0 && v < tok.vocab_size(), "prompt token ", v, " is outside the vocabulary [0, ",
                    tok.vocab_size(), ")");
      r.prompt.push_back(static_cast<int32_t>(v));
    }
  }
  r.sampling = o.defaults;
  SamplingParams& s = r.sampling;
  read_number(j, "max_tokens", s.max_tokens);
  read_number(j, "temperature", s.temperature);
  read_number(j, "top_k", s.top_k);
  read_number(j, "top_p", s.top_p);
  read_number(j, "min_p", s.min_p);
  read_number(j, "repetition_penalty", s.repetition_penalty);
  read_number(j, "presence_penalty", s.presence_penalty);
  read_number(j, "frequency_penalty", s.frequency_penalty);
  read_number(j, "n", r.n);
  read_number(j, "priority", r.priority);
  if (const auto it = j.find("seed"); it != j.end()) {
    TESSERA_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0, "'seed' must be a non-negative integer");
    s.seed = it->get<uint64_t>();
  }
  if (const auto it = j.find("ignore_eos"); it != j.end()) {
    TESSERA_CHECK(it->is_boolean(), "'ignore_eos' must be true or false");
    s.ignore_eos = it->get<bool>();
  }
  if (const auto it = j.find("stop_token_ids"); it != j.end()) {
    TESSERA_CHECK(it->is_array(), "'stop_token_ids' must be an array");
    s.stop_token_ids.clear();
    for (const json& t : *it) {
      TESSERA_CHECK(t.is_number_integer(), "'stop_token_ids' must hold integers");
      s.stop_token_ids.push_back(t.get<int32_t>());
    }
  }
  return r;
}

json error_line(int index, const std::string& message) {
  return json{{"index", index}, {"error", {{"message", message}, {"type", "invalid_request"}}}};
}

}  // namespace

OfflineBatchSummary run_offline_batch(ModelEngine& engine, std::istream& in, std::ostream& out,
                                      const OfflineBatchOptions& options) {
  const Tokenizer& tok = engine.session().tokenizer();
  EngineCore core(engine.config(), engine.executor());
  OfflineBatchSummary summary;
  std::vector<json> lines;  // by input index: an error line, or null while it runs
  std::map<RequestId, RequestOutput> outputs;
  std::map<RequestId, size_t> prompt_sizes;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const int index = static_cast<int>(lines.size());
    lines.emplace_back();
    try {
      const Request r = parse_request(json::parse(line), tok, options);
      if (auto rejection = core.validate(r)) fail(rejection->message);
      const RequestId id = static_cast<RequestId>(index);
      core.add(id, r);
      outputs[id].tokens.resize(r.n);
      outputs[id].finish.assign(r.n, FinishReason::None);
      prompt_sizes[id] = r.prompt.size();
    } catch (const std::exception& e) {  // json::parse_error included
      lines.back() = error_line(index, e.what());
      ++summary.n_errors;
    }
  }
  summary.n_requests = static_cast<int>(lines.size());
  const auto t0 = Clock::now();
  while (core.has_work()) {
    const StepResult step = core.step();
    for (const SeqEvent& e : step.events) {
      RequestOutput& o = outputs.at(e.request);
      if (e.token >= 0) o.tokens[e.choice].push_back(e.token);
      if (e.finish != FinishReason::None) o.finish[e.choice] = e.finish;
      if (e.finish == FinishReason::Error) o.error = step.error;
    }
  }
  summary.seconds = seconds_between(t0, Clock::now());
  for (auto& [id, o] : outputs) {
    if (!o.error.empty()) {
      lines[id] = error_line(static_cast<int>(id), o.error);
      ++summary.n_errors;
      continue;
    }
    json choices = json::array();
    int64_t completion = 0;
    for (size_t c = 0; c < o.tokens.size(); ++c) {
      std::vector<int32_t> visible = o.tokens[c];
      // The end-of-generation token ends the text; it is not part of it.
      if (o.finish[c] == FinishReason::Stop && !visible.empty() && tok.is_eog(visible.back())) visible.pop_back();
      completion += static_cast<int64_t>(o.tokens[c].size());
      choices.push_back({{"index", c},
                         {"text", tok.decode(visible, true)},
                         {"token_ids", o.tokens[c]},
                         {"finish_reason", std::string(finish_reason_name(o.finish[c]))}});
    }
    summary.prompt_tokens += static_cast<int64_t>(prompt_sizes[id]);
    summary.completion_tokens += completion;
    lines[id] = json{{"index", id},
                     {"choices", std::move(choices)},
                     {"usage", {{"prompt_tokens", prompt_sizes[id]}, {"completion_tokens", completion}}}};
  }
  for (const json& j : lines) out << j.dump(-1, ' ', false, json::error_handler_t::replace) << '\n';
  summary.stats = core.stats();
  return summary;
}

std::vector<OfflineBenchRow> bench_offline(ModelEngine& engine, const OfflineBenchOptions& o,
                                           const std::function<void(const OfflineBenchRow&)>& on_row) {
  TESSERA_CHECK(o.n_requests >= 1 && o.prompt_tokens >= 1 && o.gen_tokens >= 1, "bench offline: needs requests, ",
                "prompt and generated tokens (got ", o.n_requests, ", ", o.prompt_tokens, ", ", o.gen_tokens, ")");
  TESSERA_CHECK(o.shared_prefix_tokens >= 0 && o.shared_prefix_tokens <= o.prompt_tokens,
                "bench offline: shared prefix of ", o.shared_prefix_tokens, " tokens in prompts of ", o.prompt_tokens);
  const int32_t vocab = engine.config().vocab_size;
  // Random ids below the vocabulary's end (special tokens usually sit at the end or start;
  // the model's reaction to them does not matter for timing, and end-of-generation is off).
  std::mt19937_64 rng(o.seed);
  const auto random_ids = [&](int n) {
    std::vector<int32_t> ids(n);
    for (auto& t : ids) t = static_cast<int32_t>(100 + rng() % static_cast<uint64_t>(std::max(1, vocab - 200)));
    return ids;
  };
  const std::vector<int32_t> prefix = random_ids(o.shared_prefix_tokens);
  std::vector<Request> requests(o.n_requests);
  for (Request& r : requests) {
    r.prompt = prefix;
    const auto tail = random_ids(o.prompt_tokens - o.shared_prefix_tokens);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.sampling.temperature = 0;
    r.sampling.max_tokens = o.gen_tokens;
    r.sampling.ignore_eos = true;
  }

  // Warm-up, not measured: one short request, so the first timed steps do not pay for
  // first-time allocations and page faults (the serve benchmark sends warm-up requests too).
  {
    EngineCore core(engine.config(), engine.executor());
    Request warm = requests[0];
    warm.sampling.max_tokens = 4;
    warm.prompt.back() =
        static_cast<int32_t>(100 + (warm.prompt.back() + 1) % std::max(1, vocab - 200));  // no cache hit later
    core.add(0, warm);
    while (core.has_work()) {
      const StepResult step = core.step();
      TESSERA_CHECK(step.error.empty(), "bench offline: warm-up: ", step.error);
    }
  }

  std::vector<OfflineBenchRow> rows;
  for (int conc : o.concurrency) {
    TESSERA_CHECK(conc >= 1 && conc <= engine.config().scheduler.max_num_seqs, "bench offline: concurrency ", conc,
                  " is outside [1, ", engine.config().scheduler.max_num_seqs, "] (the engine's max_num_seqs)");
    for (const bool cache : o.compare_prefix_cache ? std::vector<bool>{false, true} : std::vector<bool>{true}) {
      EngineConfig c = engine.config();
      c.scheduler.max_num_seqs = conc;
      c.prefix_caching = cache;
      EngineCore core(c, engine.executor());
      for (size_t i = 0; i < requests.size(); ++i) {
        if (auto rej = core.validate(requests[i])) fail("bench offline: ", rej->message);
        core.add(i, requests[i]);
      }
      std::vector<double> ttft(requests.size(), -1), last(requests.size(), -1), itl;
      std::vector<int64_t> n_out(requests.size(), 0);
      int64_t out_tokens = 0;
      const auto t0 = Clock::now();
      while (core.has_work()) {
        const StepResult step = core.step();
        TESSERA_CHECK(step.error.empty(), "bench offline: ", step.error);
        const double now = seconds_between(t0, Clock::now());
        for (const SeqEvent& e : step.events) {
          if (e.token < 0) continue;
          ++out_tokens;
          ++n_out[e.request];
          if (ttft[e.request] < 0)
            ttft[e.request] = now;
          else
            itl.push_back(now - last[e.request]);
          last[e.request] = now;
        }
      }
      OfflineBenchRow row;
      row.concurrency = conc;
      row.prefix_cache = cache;
      row.n_requests = o.n_requests;
      row.seconds = seconds_between(t0, Clock::now());
      const EngineStats st = core.stats();
      row.requests_per_s = o.n_requests / row.seconds;
      row.output_tokens_per_s = static_cast<double>(out_tokens) / row.seconds;
      row.total_tokens_per_s = static_cast<double>(st.scheduled_tokens) / row.seconds;
      for (size_t i = 0; i < requests.size(); ++i)
        if (n_out[i] > 1) row.tpot_s.push_back((last[i] - ttft[i]) / static_cast<double>(n_out[i] - 1));
      row.ttft_s = ttft;
      row.e2e_s = last;
      row.itl_s = itl;
      row.prefix_hit_tokens = st.prefix.hit_tokens;
      row.preemptions = st.preemptions;
      row.steps = st.steps;
      row.spec = st.spec;
      rows.push_back(row);
      if (on_row) on_row(row);
    }
  }
  return rows;
}

}  // namespace tessera
