// Workload specs, plans and prompt text of exact token counts (word counter without a model;
// SmolLM2's real tokenizer when the model is in the cache).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>

#include "benchharness/workload.h"
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "unit/benchharness/fake_openai_server.h"

namespace tessera::bench {
namespace {

using testing::WordCounter;

std::string smollm2_path() {
  const char* cache = std::getenv("TESSERA_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = cache && *cache ? cache : std::string(home ? home : ".") + "/.cache/tessera/models";
  return dir + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(BenchWorkload, TextHasExactWordCountsAndDiffers) {
  WordCounter counter;
  const TextSource text = TextSource::from_file(std::string(TESSERA_FIXTURES_DIR) + "/text/licenses_gpl3_apache2.txt");
  Rng rng(11);
  std::set<std::string> seen;
  for (int n : {1, 2, 3, 50, 333, 4000}) {
    const std::string t = make_text_with_tokens(text, counter, n, rng);
    EXPECT_EQ(counter.count(t), n);
    seen.insert(t);
  }
  EXPECT_EQ(seen.size(), 6u);
  // 4000 words is longer than the corpus window at many offsets: the text wraps around.
}

TEST(BenchWorkload, ExactTokenCountsWithTheModelTokenizer) {
  const std::string path = smollm2_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "no " << path;
  auto counter = make_local_token_counter(path);
  const TextSource text = TextSource::from_file(std::string(TESSERA_FIXTURES_DIR) + "/text/licenses_gpl3_apache2.txt");
  Rng rng(3);
  for (int n : {1, 7, 64, 129, 512, 1500}) {
    const std::string t = make_text_with_tokens(text, *counter, n, rng);
    EXPECT_EQ(counter->count(t), n) << t.substr(0, 80);
  }
}

TEST(BenchWorkload, SharedPrefixPlan) {
  WordCounter counter;
  const auto spec = WorkloadSpec::from_json(nlohmann::json::parse(R"({
      "kind": "shared_prefix", "input": {"dist": "uniform", "min": 5, "max": 9}, "output": 8,
      "shared_prefix": {"num_prefixes": 3, "questions_per_prefix": 4, "prefix": 40},
      "arrival": {"process": "constant", "rate": 10}})"));
  const auto plan = plan_workload(spec, counter, TextSource::builtin(2), 42);
  ASSERT_EQ(plan.conversations.size(), 12u);
  std::map<int, std::set<std::string>> prefixes;
  std::map<int, int> per_group;
  for (size_t i = 0; i < plan.conversations.size(); ++i) {
    const auto& c = plan.conversations[i];
    prefixes[c.prefix_group].insert(c.system_text);
    ++per_group[c.prefix_group];
    EXPECT_EQ(counter.count(c.system_text), 40);
    EXPECT_EQ(c.system_tokens, 40);
    ASSERT_EQ(c.turns.size(), 1u);
    EXPECT_GE(c.turns[0].user_tokens, 5);
    EXPECT_LE(c.turns[0].user_tokens, 9);
    EXPECT_EQ(counter.count(c.turns[0].user_text), c.turns[0].user_tokens);
    EXPECT_DOUBLE_EQ(c.arrival_s, (i + 1) * 0.1);
  }
  ASSERT_EQ(prefixes.size(), 3u);
  for (const auto& [g, texts] : prefixes) EXPECT_EQ(texts.size(), 1u) << "group " << g << " has one system prompt";
  for (const auto& [g, n] : per_group) EXPECT_EQ(n, 4);
  EXPECT_NE(*prefixes[0].begin(), *prefixes[1].begin());
}

TEST(BenchWorkload, SameSeedSamePlanAndRetimeKeepsPrompts) {
  WordCounter counter;
  const auto spec = WorkloadSpec::from_json(
      nlohmann::json::parse(R"({"kind": "sharegpt", "scale": 0.1, "num_requests": 20, "arrival": {"rate": 2}})"));
  const auto a = plan_workload(spec, counter, TextSource::builtin(1), 9);
  const auto b = plan_workload(spec, counter, TextSource::builtin(1), 9);
  ASSERT_EQ(a.conversations.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(a.conversations[i].turns[0].user_text, b.conversations[i].turns[0].user_text);
    EXPECT_EQ(a.conversations[i].arrival_s, b.conversations[i].arrival_s);
  }
  WorkloadPlan faster = a;
  ArrivalProcess p;
  p.rate = 20;
  retime_plan(faster, p, 9, std::nullopt);
  for (size_t i = 0; i < 20; ++i)
    EXPECT_EQ(faster.conversations[i].turns[0].user_text, a.conversations[i].turns[0].user_text);
  // Ten times the rate: the same exponential draws, a tenth of the time.
  EXPECT_NEAR(faster.conversations.back().arrival_s * 10, a.conversations.back().arrival_s, 1e-9);
  // A duration limit drops the conversations past it.
  WorkloadPlan cut = a;
  retime_plan(cut, p, 9, 0.3);
  EXPECT_LT(cut.conversations.size(), 20u);
  for (const auto& c : cut.conversations) EXPECT_LE(c.arrival_s, 0.3);
}

TEST(BenchWorkload, ShareGptMixHasTheDocumentedShape) {
  LengthDist in, out;
  WorkloadSpec::sharegpt_defaults(in, out);
  Rng rng(1);
  double sum_in = 0, sum_out = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) sum_in += in.sample(rng), sum_out += out.sample(rng);
  // Means of the clamped log-normals: close to 100 e^0.5 = 165 and 150 e^0.32 = 207.
  EXPECT_NEAR(sum_in / n, 165, 8);
  EXPECT_NEAR(sum_out / n, 207, 8);
}

TEST(BenchWorkload, TraceReplay) {
  const std::string path = ::testing::TempDir() + "/bench_trace.jsonl";
  {
    std::ofstream f(path);
    f << R"({"timestamp": 10.0, "input_tokens": 12, "output_tokens": 5})"
      << "\n\n"
      << R"({"timestamp_ms": 10500, "input_length": 3, "output_length": 7})"
      << "\n"
      << R"({"timestamp": 12.25, "input_tokens": 30, "output_tokens": 1})"
      << "\n";
  }
  WordCounter counter;
  nlohmann::json j = {{"kind", "trace"}, {"trace", path}};
  const auto plan = plan_workload(WorkloadSpec::from_json(j), counter, TextSource::builtin(1), 1);
  ASSERT_EQ(plan.conversations.size(), 3u);
  EXPECT_DOUBLE_EQ(plan.conversations[1].arrival_s, 0.5);
  EXPECT_DOUBLE_EQ(plan.conversations[2].arrival_s, 2.25);
  EXPECT_EQ(plan.conversations[1].turns[0].user_tokens, 3);
  EXPECT_EQ(plan.conversations[1].turns[0].output_tokens, 7);
  EXPECT_EQ(counter.count(plan.conversations[2].turns[0].user_text), 30);
  {
    std::ofstream f(path);
    f << R"({"timestamp": 2, "input_tokens": 1, "output_tokens": 1})"
      << "\n"
      << R"({"timestamp": 1, "input_tokens": 1, "output_tokens": 1})"
      << "\n";
  }
  EXPECT_THROW(read_trace(path), Error);
  std::remove(path.c_str());
}

TEST(BenchWorkload, BadSpecsNameTheField) {
  auto msg = [](const char* text) {
    try {
      WorkloadSpec::from_json(nlohmann::json::parse(text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg(R"({"kind": "chatty"})").find("unknown kind 'chatty'"), std::string::npos);
  EXPECT_NE(msg(R"({"inputs": 5})").find("unknown key \"inputs\""), std::string::npos);
  EXPECT_NE(msg(R"({"arrival": {"process": "gamma", "rate": 2}})").find("burstiness"), std::string::npos);
  EXPECT_NE(msg(R"({"kind": "trace"})").find("needs \"trace\""), std::string::npos);
  EXPECT_NE(msg(R"({"num_requests": 0})").find("num_requests"), std::string::npos);
}

}  // namespace
}  // namespace tessera::bench
