// ServerMetrics: the exposition parses under a strict 0.0.4 reader, carries vLLM's names,
// types and buckets, and counts exactly what was recorded.
#include <gtest/gtest.h>

#include <cmath>
#include <thread>

#include "unit/metrics/prom_text_parser.h"
#include "core/error.h"
#include "server/metrics.h"

namespace tessera {
namespace {

using test::parse_prometheus_text;
using test::PromFamily;
using test::PromParseError;
using test::PromSample;

const PromFamily& family(const std::vector<PromFamily>& families, const std::string& name) {
  for (const PromFamily& f : families)
    if (f.name == name) return f;
  throw std::runtime_error("no family " + name);
}

// The one sample of `name` whose labels include `labels`.
double value_of(const std::vector<PromFamily>& families, const std::string& family_name, const std::string& name,
                const std::map<std::string, std::string>& labels = {}) {
  const PromFamily& f = family(families, family_name);
  const PromSample* found = nullptr;
  for (const PromSample& s : f.samples) {
    if (s.name != name) continue;
    bool match = true;
    for (const auto& [k, v] : labels) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) match = false;
    }
    if (!match) continue;
    if (found) throw std::runtime_error("several samples match " + name);
    found = &s;
  }
  if (!found) throw std::runtime_error("no sample " + name);
  return found->value;
}

double bucket(const std::vector<PromFamily>& families, const std::string& hist, const std::string& le) {
  return value_of(families, hist, hist + "_bucket", {{"le", le}});
}

std::vector<double> bucket_bounds(const PromFamily& f) {
  std::vector<double> bounds;
  for (const PromSample& s : f.samples)
    if (s.name == f.name + "_bucket" && s.labels.at("le") != "+Inf") bounds.push_back(std::stod(s.labels.at("le")));
  return bounds;
}

TEST(ServerMetricsFormat, ValuesAreWrittenAsPrometheusClientWritesThem) {
  EXPECT_EQ(format_prometheus_value(1.0), "1.0");
  EXPECT_EQ(format_prometheus_value(0.0), "0.0");
  EXPECT_EQ(format_prometheus_value(0.025), "0.025");
  EXPECT_EQ(format_prometheus_value(2560.0), "2560.0");
  EXPECT_EQ(format_prometheus_value(1e-05), "1e-05");
  EXPECT_EQ(format_prometheus_value(0.1 + 0.2), "0.30000000000000004");  // round-trips, not rounded
  EXPECT_EQ(format_prometheus_value(INFINITY), "+Inf");
  EXPECT_EQ(format_prometheus_value(-INFINITY), "-Inf");
  EXPECT_EQ(format_prometheus_value(NAN), "NaN");
  EXPECT_EQ(std::stod(format_prometheus_value(123456789.125)), 123456789.125);
}

TEST(ServerMetricsFormat, OneTwoFiveBucketsMatchVllm) {
  EXPECT_EQ(buckets_1_2_5(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(buckets_1_2_5(1), (std::vector<double>{1}));
  EXPECT_EQ(buckets_1_2_5(4), (std::vector<double>{1, 2}));
  const auto b8192 = buckets_1_2_5(8192);
  EXPECT_EQ(b8192.size(), 12u);  // 1 2 5 10 20 50 100 200 500 1000 2000 5000
  EXPECT_EQ(b8192.back(), 5000);
  EXPECT_FALSE(buckets_1_2_5(INT64_MAX).empty());  // terminates without overflow
}

TEST(ServerMetricsParser, RejectsMalformedExpositions) {
  // The reader is only worth something if it refuses what Prometheus refuses.
  EXPECT_NO_THROW(parse_prometheus_text("# HELP a x\n# TYPE a gauge\na 1\n"));
  EXPECT_THROW(parse_prometheus_text("# HELP a x\n# TYPE a gauge\na 1"), PromParseError);    // no final newline
  EXPECT_THROW(parse_prometheus_text("# TYPE a gauge\na 1\n"), PromParseError);              // no HELP
  EXPECT_THROW(parse_prometheus_text("# HELP a x\n# TYPE a gauge\nb 1\n"), PromParseError);  // wrong family
  EXPECT_THROW(parse_prometheus_text("# HELP a x\n# TYPE a gauge\na{l=\"x} 1\n"), PromParseError);
  EXPECT_THROW(parse_prometheus_text("# HELP a x\n# TYPE a gauge\na one\n"), PromParseError);
  EXPECT_THROW(parse_prometheus_text("# HELP a x\n# TYPE a counter\na -1\n"), PromParseError);
  const std::string hist_head = "# HELP h x\n# TYPE h histogram\n";
  EXPECT_NO_THROW(
      parse_prometheus_text(hist_head + "h_bucket{le=\"1.0\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_count 2\nh_sum 3\n"));
  EXPECT_THROW(
      parse_prometheus_text(hist_head + "h_bucket{le=\"1.0\"} 3\nh_bucket{le=\"+Inf\"} 2\nh_count 2\nh_sum 3\n"),
      PromParseError);  // not cumulative
  EXPECT_THROW(parse_prometheus_text(hist_head + "h_bucket{le=\"1.0\"} 1\nh_count 1\nh_sum 3\n"), PromParseError);
  EXPECT_THROW(parse_prometheus_text(hist_head + "h_bucket{le=\"+Inf\"} 2\nh_count 3\nh_sum 3\n"), PromParseError);
}

TEST(ServerMetrics, EmptyExpositionHasEveryVllmFamilyWithItsType) {
  ServerMetrics metrics("SmolLM2");
  const auto families = parse_prometheus_text(metrics.render(EngineStats{}));
  const std::map<std::string, std::string> expected = {
      {"vllm:num_requests_running", "gauge"},
      {"vllm:num_requests_waiting", "gauge"},
      {"vllm:kv_cache_usage_perc", "gauge"},
      {"vllm:prefix_cache_queries_total", "counter"},
      {"vllm:prefix_cache_hits_total", "counter"},
      {"vllm:num_preemptions_total", "counter"},
      {"vllm:prompt_tokens_total", "counter"},
      {"vllm:generation_tokens_total", "counter"},
      {"vllm:request_success_total", "counter"},
      {"vllm:time_to_first_token_seconds", "histogram"},
      {"vllm:inter_token_latency_seconds", "histogram"},
      {"vllm:time_per_output_token_seconds", "histogram"},
      {"vllm:e2e_request_latency_seconds", "histogram"},
      {"vllm:request_queue_time_seconds", "histogram"},
      {"vllm:request_inference_time_seconds", "histogram"},
      {"vllm:request_prefill_time_seconds", "histogram"},
      {"vllm:request_decode_time_seconds", "histogram"},
      {"vllm:request_prompt_tokens", "histogram"},
      {"vllm:request_generation_tokens", "histogram"},
      {"vllm:request_params_max_tokens", "histogram"},
      {"vllm:request_params_n", "histogram"},
      {"tessera:requests_rejected_total", "counter"},
      {"tessera:preemptions_total", "counter"},
      {"tessera:swap_fallbacks_total", "counter"},
      {"tessera:kv_swaps_total", "counter"},
      {"tessera:kv_swap_bytes_total", "counter"},
      {"tessera:kv_block_copies_total", "counter"},
      {"tessera:prefix_cache_evictions_total", "counter"},
      {"tessera:kv_leased_blocks", "gauge"},
      {"tessera:kv_leases_total", "counter"},
      {"tessera:kv_exported_blocks_total", "counter"},
      {"tessera:kv_import_reserved_blocks", "gauge"},
      {"tessera:kv_imports_total", "counter"},
      {"tessera:kv_imported_blocks_total", "counter"},
  };
  EXPECT_EQ(families.size(), expected.size());
  for (const auto& [name, type] : expected) EXPECT_EQ(family(families, name).type, type) << name;
  // Every series is labelled with the model and vLLM's engine index.
  for (const PromFamily& f : families) {
    for (const PromSample& s : f.samples) {
      EXPECT_EQ(s.labels.at("model_name"), "SmolLM2") << s.name;
      EXPECT_EQ(s.labels.at("engine"), "0") << s.name;
    }
  }
  // vLLM creates the finish reasons' series up front, at 0.
  for (const char* reason : {"stop", "length", "abort", "error"})
    EXPECT_EQ(
        value_of(families, "vllm:request_success_total", "vllm:request_success_total", {{"finished_reason", reason}}),
        0.0);
  EXPECT_EQ(value_of(families, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc"), 0.0);
}

TEST(ServerMetrics, BucketBoundariesAreVllms) {
  ServerMetrics metrics("m", 100);
  const auto families = parse_prometheus_text(metrics.render(EngineStats{}));
  EXPECT_EQ(bucket_bounds(family(families, "vllm:time_to_first_token_seconds")),
            (std::vector<double>{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                 1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}));
  const std::vector<double> gap = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                   0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
  EXPECT_EQ(bucket_bounds(family(families, "vllm:inter_token_latency_seconds")), gap);
  EXPECT_EQ(bucket_bounds(family(families, "vllm:time_per_output_token_seconds")), gap);
  const std::vector<double> latency = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                       30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  for (const char* name :
       {"vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_inference_time_seconds",
        "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds"})
    EXPECT_EQ(bucket_bounds(family(families, name)), latency) << name;
  for (const char* name :
       {"vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_params_max_tokens"})
    EXPECT_EQ(bucket_bounds(family(families, name)), (std::vector<double>{1, 2, 5, 10, 20, 50, 100})) << name;
  EXPECT_EQ(bucket_bounds(family(families, "vllm:request_params_n")), (std::vector<double>{1, 2, 5, 10, 20}));
}

TEST(ServerMetrics, RecordsLandInTheRightBucketsWithBoundsInclusive) {
  ServerMetrics metrics("m", 100);
  RequestRecord a;
  a.finish = FinishReason::Stop;
  a.prompt_tokens = 10;  // exactly on the le="10" bound
  a.generation_tokens = 3;
  a.ttft_s = 0.001;  // exactly on the first bound
  a.inter_token_s = {0.02, 0.05};
  a.e2e_s = 0.3;
  a.queue_s = 0.0;
  a.prefill_s = 0.25;
  a.decode_s = 0.05;
  a.max_tokens_param = 16;
  a.n_param = 1;
  metrics.record(a);

  RequestRecord b;
  b.finish = FinishReason::Length;
  b.prompt_tokens = 500;  // past the last token bucket (100)
  b.generation_tokens = 100;
  b.ttft_s = 3000;  // past 2560
  b.inter_token_s = {0.0100001};
  b.e2e_s = 9000;
  b.queue_s = 2.0;
  b.prefill_s = 4.0;
  b.decode_s = 3.0;
  b.max_tokens_param = 0;  // not set by the client: not observed, as in vLLM
  b.n_param = 3;
  metrics.record(b);

  RequestRecord c;  // aborted before its first token
  c.finish = FinishReason::Abort;
  c.prompt_tokens = 7;
  c.e2e_s = 0.1;
  c.n_param = 1;
  c.max_tokens_param = 5;
  metrics.record(c);

  // The token totals come from the engine (counted as tokens are computed), not from records.
  EngineStats engine;
  engine.prompt_tokens = 510;  // a and b: c ended before its prefill completed
  engine.generated_tokens = 103;
  const auto f = parse_prometheus_text(metrics.render(engine));

  const std::string ttft = "vllm:time_to_first_token_seconds";
  EXPECT_EQ(bucket(f, ttft, "0.001"), 1);
  EXPECT_EQ(bucket(f, ttft, "2560.0"), 1);
  EXPECT_EQ(bucket(f, ttft, "+Inf"), 2);
  EXPECT_EQ(value_of(f, ttft, ttft + "_count"), 2);  // c had no token: no TTFT
  EXPECT_DOUBLE_EQ(value_of(f, ttft, ttft + "_sum"), 3000.001);

  const std::string itl = "vllm:inter_token_latency_seconds";
  EXPECT_EQ(bucket(f, itl, "0.01"), 0);
  EXPECT_EQ(bucket(f, itl, "0.025"), 2);  // 0.0100001 and 0.02
  EXPECT_EQ(bucket(f, itl, "0.05"), 3);
  EXPECT_EQ(value_of(f, itl, itl + "_count"), 3);
  EXPECT_DOUBLE_EQ(value_of(f, itl, itl + "_sum"), 0.02 + 0.05 + 0.0100001);
  EXPECT_EQ(value_of(f, "vllm:time_per_output_token_seconds", "vllm:time_per_output_token_seconds_count"), 3);

  const std::string e2e = "vllm:e2e_request_latency_seconds";
  EXPECT_EQ(bucket(f, e2e, "0.3"), 2);  // 0.1 and 0.3
  EXPECT_EQ(bucket(f, e2e, "7680.0"), 2);
  EXPECT_EQ(bucket(f, e2e, "+Inf"), 3);
  EXPECT_EQ(bucket(f, "vllm:request_queue_time_seconds", "2.0"), 3);
  EXPECT_EQ(bucket(f, "vllm:request_queue_time_seconds", "1.5"), 2);
  EXPECT_EQ(bucket(f, "vllm:request_prefill_time_seconds", "0.3"), 2);
  EXPECT_EQ(bucket(f, "vllm:request_prefill_time_seconds", "5.0"), 3);
  EXPECT_EQ(bucket(f, "vllm:request_decode_time_seconds", "2.5"), 2);
  EXPECT_DOUBLE_EQ(value_of(f, "vllm:request_inference_time_seconds", "vllm:request_inference_time_seconds_sum"),
                   0.25 + 0.05 + 4.0 + 3.0);

  const std::string prompt = "vllm:request_prompt_tokens";
  EXPECT_EQ(bucket(f, prompt, "5.0"), 0);
  EXPECT_EQ(bucket(f, prompt, "10.0"), 2);  // 7 and 10
  EXPECT_EQ(bucket(f, prompt, "100.0"), 2);
  EXPECT_EQ(bucket(f, prompt, "+Inf"), 3);
  EXPECT_EQ(value_of(f, prompt, prompt + "_sum"), 517);
  EXPECT_EQ(bucket(f, "vllm:request_generation_tokens", "1.0"), 1);  // c: 0 tokens
  EXPECT_EQ(bucket(f, "vllm:request_generation_tokens", "100.0"), 3);
  EXPECT_EQ(value_of(f, "vllm:request_params_max_tokens", "vllm:request_params_max_tokens_count"), 2);
  EXPECT_EQ(bucket(f, "vllm:request_params_max_tokens", "5.0"), 1);
  EXPECT_EQ(bucket(f, "vllm:request_params_n", "1.0"), 2);
  EXPECT_EQ(bucket(f, "vllm:request_params_n", "5.0"), 3);

  EXPECT_EQ(value_of(f, "vllm:prompt_tokens_total", "vllm:prompt_tokens_total"), 510);
  EXPECT_EQ(value_of(f, "vllm:generation_tokens_total", "vllm:generation_tokens_total"), 103);
  const std::string success = "vllm:request_success_total";
  EXPECT_EQ(value_of(f, success, success, {{"finished_reason", "stop"}}), 1);
  EXPECT_EQ(value_of(f, success, success, {{"finished_reason", "length"}}), 1);
  EXPECT_EQ(value_of(f, success, success, {{"finished_reason", "abort"}}), 1);
  EXPECT_EQ(value_of(f, success, success, {{"finished_reason", "error"}}), 0);
}

TEST(ServerMetrics, EngineGaugesAndCountersComeFromTheSnapshot) {
  ServerMetrics metrics("m");
  EngineStats engine;
  engine.running = 3;
  engine.waiting = 2;
  engine.kv_total_blocks = 100;
  engine.kv_free_blocks = 25;
  engine.prefix.queried_tokens = 640;
  engine.prefix.hit_tokens = 320;
  engine.preemptions = 4;
  const auto f = parse_prometheus_text(metrics.render(engine));
  EXPECT_EQ(value_of(f, "vllm:num_requests_running", "vllm:num_requests_running"), 3);
  EXPECT_EQ(value_of(f, "vllm:num_requests_waiting", "vllm:num_requests_waiting"), 2);
  EXPECT_DOUBLE_EQ(value_of(f, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc"), 0.75);
  EXPECT_EQ(value_of(f, "vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries_total"), 640);
  EXPECT_EQ(value_of(f, "vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits_total"), 320);
  EXPECT_EQ(value_of(f, "vllm:num_preemptions_total", "vllm:num_preemptions_total"), 4);

  EXPECT_EQ(metrics.render(engine).find("kv_window_cache"), std::string::npos);  // no window pool, no gauge

  engine.kv_free_blocks = 100;  // idle: cached but unreferenced blocks count as free
  const auto idle = parse_prometheus_text(metrics.render(engine));
  EXPECT_EQ(value_of(idle, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc"), 0.0);

  engine.kv_window_total_blocks = 40;  // a sliding-window pool: its own usage beside the main one
  engine.kv_window_free_blocks = 30;
  const auto windowed = parse_prometheus_text(metrics.render(engine));
  EXPECT_DOUBLE_EQ(value_of(windowed, "tessera:kv_window_cache_usage_perc", "tessera:kv_window_cache_usage_perc"),
                   0.25);
  EXPECT_EQ(value_of(windowed, "tessera:kv_window_cache_blocks", "tessera:kv_window_cache_blocks"), 40);
}

TEST(ServerMetrics, CacheConfigShowsTheKvFormatAndCapacity) {
  ServerMetrics metrics("m");
  EXPECT_EQ(metrics.render(EngineStats{}).find("cache_config_info"), std::string::npos);  // not set yet
  metrics.set_cache_config({16, "turbo3.5", 1000, 64, 3.69});
  const auto f = parse_prometheus_text(metrics.render(EngineStats{}));
  EXPECT_EQ(
      value_of(
          f, "vllm:cache_config_info", "vllm:cache_config_info",
          {{"block_size", "16"}, {"cache_dtype", "turbo3.5"}, {"num_gpu_blocks", "1000"}, {"num_cpu_blocks", "64"}}),
      1);
  EXPECT_EQ(value_of(f, "tessera:kv_cache_capacity_tokens", "tessera:kv_cache_capacity_tokens"), 16000);
  EXPECT_DOUBLE_EQ(value_of(f, "tessera:kv_cache_bits_per_element", "tessera:kv_cache_bits_per_element"), 3.69);
}

TEST(ServerMetrics, EngineCountersVllmLacksAreExportedUnderTessera) {
  ServerMetrics metrics("m");
  EngineStats engine;
  engine.preemptions = 7;  // 5 recompute (1 of them a swap fallback) + 2 swapped
  engine.swaps_out = 2;
  engine.swaps_in = 1;
  engine.swap_fallbacks = 1;
  engine.swap_out_bytes = 4096;
  engine.swap_in_bytes = 2048;
  engine.block_copies = 9;
  engine.prefix.evictions = 11;
  const auto f = parse_prometheus_text(metrics.render(engine));
  const std::string pre = "tessera:preemptions_total";
  EXPECT_EQ(value_of(f, pre, pre, {{"cause", "kv_cache_full"}, {"mode", "recompute"}}), 5);
  EXPECT_EQ(value_of(f, pre, pre, {{"cause", "kv_cache_full"}, {"mode", "swap"}}), 2);
  EXPECT_EQ(value_of(f, "vllm:num_preemptions_total", "vllm:num_preemptions_total"), 7);  // the sum
  EXPECT_EQ(value_of(f, "tessera:swap_fallbacks_total", "tessera:swap_fallbacks_total"), 1);
  const std::string swaps = "tessera:kv_swaps_total", bytes = "tessera:kv_swap_bytes_total";
  EXPECT_EQ(value_of(f, swaps, swaps, {{"direction", "out"}}), 2);
  EXPECT_EQ(value_of(f, swaps, swaps, {{"direction", "in"}}), 1);
  EXPECT_EQ(value_of(f, bytes, bytes, {{"direction", "out"}}), 4096);
  EXPECT_EQ(value_of(f, bytes, bytes, {{"direction", "in"}}), 2048);
  EXPECT_EQ(value_of(f, "tessera:kv_block_copies_total", "tessera:kv_block_copies_total"), 9);
  EXPECT_EQ(value_of(f, "tessera:prefix_cache_evictions_total", "tessera:prefix_cache_evictions_total"), 11);
}

TEST(ServerMetrics, LabelValuesAreEscapedAndReadBack) {
  const std::string awkward = "org/model \"q4\" \\ v1\nnext";
  ServerMetrics metrics(awkward);
  metrics.record_rejection(429, "queue \"full\"");
  const auto f = parse_prometheus_text(metrics.render(EngineStats{}));
  for (const PromFamily& fam : f)
    for (const PromSample& s : fam.samples) EXPECT_EQ(s.labels.at("model_name"), awkward);
  EXPECT_EQ(value_of(f, "tessera:requests_rejected_total", "tessera:requests_rejected_total",
                     {{"status", "429"}, {"reason", "queue \"full\""}}),
            1);
}

TEST(ServerMetrics, RejectionsAreCountedByStatusAndReason) {
  ServerMetrics metrics("m");
  metrics.record_rejection(429, "queue_full");
  metrics.record_rejection(429, "queue_full");
  metrics.record_rejection(503, "draining");
  metrics.record_rejection(400, "invalid_request");
  const auto f = parse_prometheus_text(metrics.render(EngineStats{}));
  const std::string name = "tessera:requests_rejected_total";
  EXPECT_EQ(value_of(f, name, name, {{"status", "429"}, {"reason", "queue_full"}}), 2);
  EXPECT_EQ(value_of(f, name, name, {{"status", "503"}, {"reason", "draining"}}), 1);
  EXPECT_EQ(value_of(f, name, name, {{"status", "400"}, {"reason", "invalid_request"}}), 1);
  EXPECT_EQ(family(f, name).samples.size(), 3u);
}

TEST(ServerMetrics, ConcurrentRecordsAndScrapesLoseNothing) {
  ServerMetrics metrics("m");
  constexpr int kThreads = 4, kPerThread = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      RequestRecord r;
      r.finish = FinishReason::Stop;
      r.prompt_tokens = 2;
      r.ttft_s = 0.5;
      r.inter_token_s = {0.125};
      for (int i = 0; i < kPerThread; ++i) metrics.record(r);
    });
  }
  // Scrapes while recording must always parse.
  threads.emplace_back([&] {
    for (int i = 0; i < 20; ++i) EXPECT_NO_THROW(parse_prometheus_text(metrics.render(EngineStats{})));
  });
  for (auto& t : threads) t.join();
  const auto f = parse_prometheus_text(metrics.render(EngineStats{}));
  const double total = kThreads * kPerThread;
  EXPECT_EQ(value_of(f, "vllm:request_success_total", "vllm:request_success_total", {{"finished_reason", "stop"}}),
            total);
  EXPECT_EQ(value_of(f, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum"), 2 * total);
  EXPECT_EQ(value_of(f, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count"), total);
  EXPECT_EQ(value_of(f, "vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum"), 0.5 * total);
  EXPECT_EQ(value_of(f, "vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_sum"), 0.125 * total);
}

TEST(ServerMetrics, RejectsAZeroContextLength) { EXPECT_THROW(ServerMetrics("m", 0), Error); }

}  // namespace
TEST(ServerMetrics, SpeculativeDecodingCountersUnderVllmNames) {
  ServerMetrics metrics("m");
  // No speculation: no spec_decode families at all.
  EXPECT_EQ(metrics.render(EngineStats{}).find("spec_decode"), std::string::npos);
  EngineStats engine;
  engine.spec.drafts = 10;
  engine.spec.draft_tokens = 35;
  engine.spec.accepted_tokens = 21;
  engine.spec.accepted_per_pos = {9, 7, 5};
  const auto f = parse_prometheus_text(metrics.render(engine));
  for (const auto& [name, want] :
       std::vector<std::pair<std::string, double>>{{"vllm:spec_decode_num_drafts_total", 10},
                                                   {"vllm:spec_decode_num_draft_tokens_total", 35},
                                                   {"vllm:spec_decode_num_accepted_tokens_total", 21}})
    EXPECT_EQ(value_of(f, name, name), want) << name;
  const std::string per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total";
  EXPECT_EQ(value_of(f, per_pos, per_pos, {{"position", "0"}}), 9);
  EXPECT_EQ(value_of(f, per_pos, per_pos, {{"position", "1"}}), 7);
  EXPECT_EQ(value_of(f, per_pos, per_pos, {{"position", "2"}}), 5);
}

// What the Kubernetes Gateway API Inference Extension's endpoint picker (and llm-d's) scrapes
// by default from a vLLM-compatible server (docs/deploy.md): queue depth, running requests and
// KV usage as gauges, and the cache configuration with block_size and num_gpu_blocks labels
// (its prefix-cache scorer). The fifth, vllm:lora_requests_info, has no meaning without LoRA
// adapters; the picker is started with --lora-info-metric "" for tessera.
TEST(ServerMetrics, EndpointPickerFindsWhatItScrapes) {
  ServerMetrics metrics("m");
  metrics.set_cache_config({16, "f16", 2048, 0, 16.0});
  EngineStats engine;
  engine.running = 2;
  engine.waiting = 5;
  engine.kv_total_blocks = 2048;
  engine.kv_free_blocks = 1536;
  const auto f = parse_prometheus_text(metrics.render(engine));
  for (const char* gauge : {"vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"})
    EXPECT_EQ(family(f, gauge).type, "gauge") << gauge;
  EXPECT_EQ(value_of(f, "vllm:num_requests_waiting", "vllm:num_requests_waiting"), 5);
  EXPECT_EQ(value_of(f, "vllm:num_requests_running", "vllm:num_requests_running"), 2);
  const double usage = value_of(f, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc");
  EXPECT_DOUBLE_EQ(usage, 0.25);  // a fraction 0..1, as the picker's flag says
  EXPECT_EQ(family(f, "vllm:cache_config_info").type, "gauge");
  EXPECT_EQ(value_of(f, "vllm:cache_config_info", "vllm:cache_config_info",
                     {{"block_size", "16"}, {"num_gpu_blocks", "2048"}}),
            1);
}

}  // namespace tessera
