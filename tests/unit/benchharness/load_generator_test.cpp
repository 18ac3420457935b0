// The load generator against a fake OpenAI-compatible server with injected delays.
//
// Timing method (the one timed test of the suite): the fake server sends the first text chunk
// at (request fully read + 50 ms) and chunk k at (+ 50 ms + k * 10 ms) using sleep_until on
// absolute times, so a late wake-up delays one chunk without shifting the next. The client's
// TTFT starts before it connects, so it includes connect + send + the server's read (~0.1-0.3 ms
// on loopback). On a loaded 2-core machine single samples can be late by milliseconds, so the
// test compares medians (P50 over 24 requests for TTFT, over 24 x 19 gaps for ITL) with the
// injected values, within 1 ms.
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "benchharness/load_generator.h"
#include "benchharness/report.h"
#include "core/error.h"
#include "unit/benchharness/fake_openai_server.h"

namespace tessera::bench {
namespace {

using testing::FakeOpenAIServer;
using testing::FakeServerConfig;
using testing::WordCounter;

WorkloadPlan plan_of(const std::string& json, WordCounter& counter, uint64_t seed = 7) {
  const WorkloadSpec spec = WorkloadSpec::from_json(nlohmann::json::parse(json));
  return plan_workload(spec, counter, TextSource::builtin(1), seed);
}

LoadOptions options_for(const FakeOpenAIServer& server, const std::string& api = "chat") {
  LoadOptions o;
  o.endpoint = Endpoint::parse(server.base_url() + "/v1");
  o.model = "fake-model";
  o.api = api;
  o.timeout_s = 30;
  return o;
}

TEST(BenchLoadGenerator, RecoversInjectedTtftAndItlWithinOneMillisecond) {
  FakeServerConfig cfg;
  cfg.ttft = std::chrono::milliseconds(50);
  cfg.itl = std::chrono::milliseconds(10);
  FakeOpenAIServer server(cfg);
  WordCounter counter;
  // 24 requests of 20 tokens, Poisson at 20/s: several streams overlap on the client thread.
  const auto plan = plan_of(R"({"input": 32, "output": 20, "num_requests": 24,
                               "arrival": {"process": "poisson", "rate": 20}})",
                            counter);
  const LoadResult result = run_load(plan, options_for(server));
  ASSERT_EQ(result.records.size(), 24u);
  Slo slo;
  const RunReport rep = make_run_report("rate 20", 20, result, slo, Buckets{});
  const Metrics& m = rep.summary;
  ASSERT_EQ(m.n_ok, 24) << (rep.failures.empty() ? "" : rep.failures.front().first);
  std::printf("[timing] TTFT P50 %.3f ms (P90 %.3f), ITL P50 %.3f ms (P90 %.3f), first byte P50 %.3f ms\n",
              m.ttft_ms.p50, m.ttft_ms.p90, m.itl_ms.p50, m.itl_ms.p90, m.first_byte_ms.p50);
  // The harness must recover the delays within 1 ms (medians). The server's sleep_until
  // overshoots when this shared machine is loaded, so the reference is the delay the server
  // actually produced (its own clock, the same steady clock), which equals the injected one
  // on a quiet machine; the injected values are checked loosely too.
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  const double real_ttft = median(server.realized_ttft_ms()), real_itl = median(server.realized_itl_ms());
  std::printf("[timing] server realized TTFT P50 %.3f ms, ITL P50 %.3f ms\n", real_ttft, real_itl);
  EXPECT_NEAR(m.ttft_ms.p50, real_ttft, 1.0);
  EXPECT_NEAR(m.itl_ms.p50, real_itl, 1.0);
  EXPECT_NEAR(m.ttft_ms.p50, 50.0, 10.0);
  EXPECT_NEAR(m.itl_ms.p50, 10.0, 5.0);
  EXPECT_EQ(m.itl_ms.count, 24u * 19u);
  EXPECT_NEAR(m.tpot_ms.p50, real_itl, 1.0);
  // The role-only chunk arrives at once: first byte well before the first token.
  EXPECT_LT(m.first_byte_ms.p50, 25.0);
  for (const auto& r : result.records) {
    EXPECT_EQ(r.output_tokens, 20);
    EXPECT_TRUE(r.output_from_usage);
    EXPECT_EQ(r.prompt_tokens, 32);
    EXPECT_EQ(r.input_tokens, 32);
    EXPECT_DOUBLE_EQ(r.queue_s, 0.0015);
    EXPECT_EQ(r.token_s.size(), 20u);
    EXPECT_GE(r.send_s, r.scheduled_s);
  }
  EXPECT_EQ(m.queue_ms.count, 24u);
}

TEST(BenchLoadGenerator, RequestBodiesAreStreamingWithIgnoreEos) {
  FakeServerConfig cfg;
  cfg.ttft = std::chrono::milliseconds(1);
  cfg.itl = std::chrono::milliseconds(0);
  FakeOpenAIServer server(cfg);
  WordCounter counter;
  const auto plan = plan_of(R"({"input": 5, "output": 3, "num_requests": 2, "arrival": {"rate": "inf"}})", counter);
  LoadOptions o = options_for(server, "completions");
  o.extra_body = {{"logit_bias", {{"2", -100}}}};
  const LoadResult result = run_load(plan, o);
  ASSERT_EQ(result.records.size(), 2u);
  for (const auto& b : server.bodies()) {
    EXPECT_EQ(b["model"], "fake-model");
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    EXPECT_EQ(b["ignore_eos"], true);
    EXPECT_EQ(b["max_tokens"], 3);
    EXPECT_EQ(FakeOpenAIServer::count_words(b["prompt"]), 5);
    EXPECT_EQ(b["logit_bias"]["2"], -100);
  }
  for (const auto& r : result.records) EXPECT_TRUE(r.ok) << r.error;
}

TEST(BenchLoadGenerator, OpenLoopSendsWithoutWaitingAndTheCapHolds) {
  FakeServerConfig cfg;
  // Long enough that all six are surely at the server together even on a loaded machine.
  cfg.ttft = std::chrono::milliseconds(400);
  cfg.itl = std::chrono::milliseconds(1);
  WordCounter counter;
  const std::string workload = R"({"input": 4, "output": 4, "num_requests": 6, "arrival": {"rate": "inf"}})";
  {
    // Open loop: all six are sent at t = 0 and are in flight at the server together.
    FakeOpenAIServer server(cfg);
    const auto r = run_load(plan_of(workload, counter), options_for(server));
    EXPECT_EQ(server.max_concurrent(), 6);
    EXPECT_EQ(r.records.size(), 6u);
  }
  {
    // A concurrency cap of 2: never more than two at the server, and the rest waited.
    FakeOpenAIServer server(cfg);
    LoadOptions o = options_for(server);
    o.max_concurrency = 2;
    const auto r = run_load(plan_of(workload, counter), o);
    EXPECT_LE(server.max_concurrent(), 2);
    ASSERT_EQ(r.records.size(), 6u);
    int waited = 0;
    for (const auto& rec : r.records) waited += rec.send_s > rec.scheduled_s + 0.3;
    EXPECT_GE(waited, 4);
  }
}

TEST(BenchLoadGenerator, FailuresAreRecordedWithStatusAndMessage) {
  FakeServerConfig cfg;
  cfg.fail_status = 503;
  cfg.fail_message = "engine overloaded";
  FakeOpenAIServer server(cfg);
  WordCounter counter;
  const auto plan = plan_of(R"({"input": 4, "output": 4, "num_requests": 3, "arrival": {"rate": "inf"}})", counter);
  const auto result = run_load(plan, options_for(server));
  const RunReport rep = make_run_report("x", 1, result, Slo{}, Buckets{});
  EXPECT_EQ(rep.summary.n_failed, 3);
  EXPECT_EQ(rep.summary.n_ok, 0);
  ASSERT_EQ(rep.failures.size(), 1u);
  EXPECT_EQ(rep.failures[0].first, "HTTP 503: engine overloaded");
  EXPECT_EQ(rep.failures[0].second, 3);
  EXPECT_EQ(result.records[0].http_status, 503);
}

TEST(BenchLoadGenerator, ConnectionRefusedIsAFailureNotACrash) {
  uint16_t port = 0;
  {
    FakeOpenAIServer server(FakeServerConfig{});
    port = static_cast<uint16_t>(std::stoi(server.base_url().substr(server.base_url().rfind(':') + 1)));
  }
  WordCounter counter;
  const auto plan = plan_of(R"({"input": 4, "output": 4, "num_requests": 2, "arrival": {"rate": "inf"}})", counter);
  LoadOptions o;
  o.endpoint = Endpoint::parse("http://127.0.0.1:" + std::to_string(port));
  o.timeout_s = 5;
  const auto result = run_load(plan, o);
  ASSERT_EQ(result.records.size(), 2u);
  for (const auto& r : result.records) {
    EXPECT_FALSE(r.ok);
    EXPECT_EQ(r.http_status, 0);
    EXPECT_NE(r.error.find("connect"), std::string::npos) << r.error;
  }
}

TEST(BenchLoadGenerator, MultiTurnHistoryCarriesTheReplies) {
  FakeServerConfig cfg;
  cfg.ttft = std::chrono::milliseconds(1);
  cfg.itl = std::chrono::milliseconds(0);
  cfg.reply_word = "answer";
  FakeOpenAIServer server(cfg);
  WordCounter counter;
  const auto plan = plan_of(R"({"kind": "multi_turn", "input": 6, "output": 3, "num_requests": 2,
                               "multi_turn": {"turns": 3}, "arrival": {"rate": 100}})",
                            counter);
  EXPECT_EQ(plan.n_requests, 6);
  const auto result = run_load(plan, options_for(server));
  ASSERT_EQ(result.records.size(), 6u);
  size_t max_messages = 0;
  for (const auto& b : server.bodies()) max_messages = std::max(max_messages, b["messages"].size());
  EXPECT_EQ(max_messages, 5u);  // user, assistant, user, assistant, user
  for (const auto& b : server.bodies()) {
    if (b["messages"].size() != 5) continue;
    EXPECT_EQ(b["messages"][1]["role"], "assistant");
    EXPECT_EQ(b["messages"][1]["content"], "answer answer answer ");
  }
  for (const auto& r : result.records) {
    EXPECT_TRUE(r.ok) << r.error;
    // Planned input of turn k: k * (6 user + 3 reply) + 6; the server counted the same words.
    EXPECT_EQ(r.input_tokens, r.turn * 9 + 6);
    EXPECT_EQ(r.prompt_tokens, r.input_tokens);
  }
}

TEST(BenchLoadGenerator, ServerTokenizeGivesExactCounts) {
  FakeOpenAIServer server(FakeServerConfig{});
  auto counter = make_server_token_counter(Endpoint::parse(server.base_url()), "m", "");
  EXPECT_EQ(counter->count("one two three"), 3);
  Rng rng(5);
  const TextSource text = TextSource::builtin(3);
  for (int n : {1, 17, 200}) EXPECT_EQ(FakeOpenAIServer::count_words(make_text_with_tokens(text, *counter, n, rng)), n);
}

TEST(BenchEndpoint, BaseUrlParsing) {
  const Endpoint a = Endpoint::parse("http://localhost:8000/v1");
  EXPECT_EQ(a.host, "localhost");
  EXPECT_EQ(a.port, "8000");
  EXPECT_EQ(a.prefix, "");
  const Endpoint b = Endpoint::parse("127.0.0.1:9000/proxy/");
  EXPECT_EQ(b.port, "9000");
  EXPECT_EQ(b.prefix, "/proxy");
  EXPECT_EQ(Endpoint::parse("http://example").port, "80");
  EXPECT_THROW(Endpoint::parse("https://x:1"), Error);
  EXPECT_THROW(Endpoint::parse("http://x:abc"), Error);
}

}  // namespace
}  // namespace tessera::bench
