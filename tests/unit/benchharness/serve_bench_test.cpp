// `bench serve` as a library call against the fake server: a rate sweep gives one run per
// rate with the same prompts; token counts come from /tokenize, or are estimated (and marked
// so) when the server has none.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "benchharness/html_report.h"
#include "benchharness/serve_bench.h"
#include "core/error.h"
#include "unit/benchharness/fake_openai_server.h"

namespace tessera::bench {
namespace {

using testing::FakeOpenAIServer;
using testing::FakeServerConfig;

ServeBenchOptions options_for(const FakeOpenAIServer& server) {
  ServeBenchOptions o;
  o.workload = WorkloadSpec::from_json(nlohmann::json::parse(
      R"({"kind": "sharegpt", "scale": 0.05, "num_requests": 6, "slo": {"ttft_ms": 1000, "tpot_ms": 50}})"));
  o.load.endpoint = Endpoint::parse(server.base_url());
  o.load.model = "m";
  o.load.timeout_s = 30;
  o.seed = 4;
  return o;
}

FakeServerConfig fast() {
  FakeServerConfig c;
  c.ttft = std::chrono::milliseconds(2);
  c.itl = std::chrono::microseconds(200);
  return c;
}

TEST(BenchServe, RateSweepGivesOneRunPerRateWithTheSamePrompts) {
  FakeOpenAIServer server(fast());
  ServeBenchOptions o = options_for(server);
  o.rates = parse_rate_list("50,inf");
  int progress_calls = 0;
  o.on_progress = [&](const std::string&, const Progress&) { ++progress_calls; };
  const BenchReport rep = run_serve_bench(o);
  ASSERT_EQ(rep.runs.size(), 2u);
  EXPECT_EQ(rep.runs[0].label, "rate 50/s");
  EXPECT_EQ(rep.runs[1].label, "rate inf");
  EXPECT_TRUE(std::isinf(rep.runs[1].offered_rate));
  EXPECT_GE(progress_calls, 2);  // at least the final line of each run
  for (const auto& run : rep.runs) {
    EXPECT_EQ(run.summary.n_ok, 6);
    EXPECT_EQ(*run.summary.goodput_fraction, 1.0);
  }
  // Same prompts in both runs: the server saw each user text twice.
  const auto bodies = server.bodies();
  ASSERT_EQ(bodies.size(), 12u);
  std::map<std::string, int> seen;
  for (const auto& b : bodies) ++seen[b["messages"].back()["content"].get<std::string>()];
  for (const auto& [text, n] : seen) EXPECT_EQ(n, 2) << text.substr(0, 40);
  // Planned input tokens are exact: the fake server counts words the same way /tokenize does.
  for (const auto& r : rep.runs[0].records) EXPECT_EQ(r.prompt_tokens, r.input_tokens);
  EXPECT_EQ(rep.config["exact_token_counts"], true);
  EXPECT_EQ(rep.config["rates"], nlohmann::json::parse(R"([50.0, "inf"])"));
  const auto j = rep.to_json();
  EXPECT_EQ(j["runs"][0]["requests"].size(), 6u);
  EXPECT_NE(html_report(rep).find("TTFT against load"), std::string::npos);
}

TEST(BenchServe, WithoutTokenizeTheCountsAreEstimatedAndSaySo) {
  FakeServerConfig cfg = fast();
  cfg.tokenize = false;
  FakeOpenAIServer server(cfg);
  ServeBenchOptions o = options_for(server);
  o.rates = {std::numeric_limits<double>::infinity()};
  std::vector<std::string> notes;
  o.log = [&](const std::string& s) { notes.push_back(s); };
  const BenchReport rep = run_serve_bench(o);
  EXPECT_EQ(rep.config["exact_token_counts"], false);
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes.front().find("estimated"), std::string::npos) << notes.front();
  o.allow_estimated_counts = false;
  EXPECT_THROW(run_serve_bench(o), Error);
}

TEST(BenchServe, DurationAppliesPerRate) {
  FakeOpenAIServer server(fast());
  ServeBenchOptions o = options_for(server);
  o.workload.num_requests.reset();
  o.workload.duration_s = 0.5;
  o.workload.arrival.kind = ArrivalProcess::Kind::Constant;
  o.rates = {10, 40};
  const BenchReport rep = run_serve_bench(o);
  ASSERT_EQ(rep.runs.size(), 2u);
  // Constant arrivals at 1/rate, 2/rate, ... up to 0.5 s: 5 and 20 requests.
  EXPECT_EQ(rep.runs[0].records.size(), 5u);
  EXPECT_EQ(rep.runs[1].records.size(), 20u);
  EXPECT_THROW(parse_rate_list("1,x"), Error);
  EXPECT_THROW(parse_rate_list("0"), Error);
}

}  // namespace
}  // namespace tessera::bench
