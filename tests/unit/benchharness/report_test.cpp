// Metrics from hand-made records (TPOT, ITL, goodput, buckets, failures), the JSON report's
// round trip, the compare table and the HTML page.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "benchharness/html_report.h"
#include "benchharness/offline_report.h"
#include "benchharness/report.h"

namespace tessera::bench {
namespace {

RequestRecord rec(int64_t id, int64_t in, int64_t out, double ttft, double gap, bool ok = true) {
  RequestRecord r;
  r.id = id;
  r.input_tokens = in;
  r.max_tokens = out;
  r.output_tokens = ok ? out : 0;
  r.ok = ok;
  r.http_status = ok ? 200 : 500;
  if (!ok) {
    r.error = "HTTP 500: boom";
    r.e2e_s = 0.01;
    return r;
  }
  for (int64_t k = 0; k < out; ++k) r.token_s.push_back(ttft + gap * k);
  r.ttft_s = ttft;
  r.e2e_s = r.token_s.back() + 0.001;
  r.first_byte_s = ttft / 2;
  return r;
}

LoadResult sample_result() {
  LoadResult res;
  res.duration_s = 10.0;
  res.records = {rec(0, 100, 10, 0.05, 0.010), rec(1, 100, 10, 0.30, 0.010), rec(2, 1000, 300, 0.05, 0.050),
                 rec(3, 1000, 300, 0.05, 0.010, false)};
  return res;
}

TEST(BenchReport, MetricsAndGoodput) {
  Slo slo;
  slo.ttft_ms = 100;
  slo.tpot_ms = 20;
  const RunReport rep = make_run_report("rate 1", 1.0, sample_result(), slo, Buckets{});
  const Metrics& m = rep.summary;
  EXPECT_EQ(m.n_requests, 4);
  EXPECT_EQ(m.n_ok, 3);
  EXPECT_EQ(m.n_failed, 1);
  // Good: #0 only (#1 misses TTFT, #2 misses TPOT 50 ms > 20 ms, #3 failed).
  EXPECT_EQ(m.n_good, 1);
  EXPECT_DOUBLE_EQ(*m.goodput_fraction, 0.25);
  EXPECT_DOUBLE_EQ(*m.goodput_rps, 0.1);
  EXPECT_DOUBLE_EQ(m.request_throughput, 0.3);
  EXPECT_DOUBLE_EQ(m.output_throughput, 32.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, (1200 + 320) / 10.0);
  // TPOT of #0: (e2e - ttft) / 9 = (0.09 + 0.001) / 9.
  EXPECT_NEAR(rec(0, 100, 10, 0.05, 0.010).tpot_s(), 0.091 / 9, 1e-15);
  EXPECT_EQ(m.itl_ms.count, 9u + 9u + 299u);
  EXPECT_NEAR(m.itl_ms.max, 50.0, 1e-9);
  EXPECT_NEAR(m.ttft_ms.max, 300.0, 1e-9);
  EXPECT_NEAR(m.ttft_ms.p50, 50.0, 1e-9);
  ASSERT_EQ(rep.failures.size(), 1u);
  EXPECT_EQ(rep.failures[0].first, "HTTP 500: boom");
  // Buckets: in [0,128) x out [0,64) holds #0 and #1; in [512,2048) x out [256,1024) #2 and #3.
  ASSERT_EQ(rep.buckets.size(), 2u);
  EXPECT_EQ(rep.buckets[0].input_range, "[0, 128)");
  EXPECT_EQ(rep.buckets[0].output_range, "[0, 64)");
  EXPECT_EQ(rep.buckets[0].metrics.n_ok, 2);
  EXPECT_DOUBLE_EQ(*rep.buckets[0].metrics.goodput_fraction, 0.5);
  EXPECT_EQ(rep.buckets[1].input_range, "[512, 2048)");
  EXPECT_EQ(rep.buckets[1].output_range, "[256, 1024)");
  EXPECT_EQ(rep.buckets[1].metrics.n_failed, 1);
  EXPECT_DOUBLE_EQ(*rep.buckets[1].metrics.goodput_fraction, 0.0);
  // Without an SLO there is no goodput.
  EXPECT_FALSE(make_run_report("x", 1, sample_result(), Slo{}, Buckets{}).summary.goodput_rps.has_value());
}

TEST(BenchReport, SloEdgesAndSingleTokenRequests) {
  Slo slo;
  slo.ttft_ms = 50;
  slo.tpot_ms = 10;
  EXPECT_TRUE(slo.met_by(rec(0, 1, 1, 0.05, 0.0)));  // TTFT exactly at the limit; no TPOT
  EXPECT_FALSE(slo.met_by(rec(0, 1, 1, 0.0501, 0.0)));
  EXPECT_FALSE(slo.met_by(rec(0, 1, 5, 0.01, 0.0, false)));
  EXPECT_EQ(rec(0, 1, 1, 0.05, 0).tpot_s(), -1);
}

TEST(BenchReport, JsonRoundTripAndCompare) {
  Slo slo;
  slo.ttft_ms = 100;
  BenchReport a;
  a.config = {{"workload_name", "unit"}, {"base_url", "http://x"}};
  a.runs.push_back(make_run_report("rate 1", 1.0, sample_result(), slo, Buckets{}));
  const std::string path = ::testing::TempDir() + "/bench_report_a.json";
  { std::ofstream(path) << a.to_json().dump(1); }
  const BenchReport back = read_report(path);
  ASSERT_EQ(back.runs.size(), 1u);
  const Metrics& m = back.runs[0].summary;
  EXPECT_EQ(m.n_ok, 3);
  EXPECT_DOUBLE_EQ(m.output_throughput, 32.0);
  EXPECT_DOUBLE_EQ(m.ttft_ms.p99, a.runs[0].summary.ttft_ms.p99);
  EXPECT_DOUBLE_EQ(*m.goodput_rps, *a.runs[0].summary.goodput_rps);
  ASSERT_EQ(back.runs[0].records.size(), 4u);
  EXPECT_EQ(back.runs[0].records[2].token_s, a.runs[0].records[2].token_s);
  EXPECT_EQ(back.runs[0].records[3].error, "HTTP 500: boom");
  EXPECT_EQ(back.runs[0].buckets.size(), 2u);

  // B is twice as fast in throughput; the table shows the ratio B / A.
  BenchReport b = back;
  b.runs[0].summary.output_throughput = 64.0;
  const std::string table = format_compare(back, b, "llama.cpp", "tessera");
  EXPECT_NE(table.find("| output throughput (tok/s) | 32.00 | 64.00 | 2.00x |"), std::string::npos) << table;
  EXPECT_NE(table.find("tessera / llama.cpp"), std::string::npos);
  EXPECT_NE(table.find("TTFT P99 (ms)"), std::string::npos);
  std::remove(path.c_str());
}

TEST(BenchReport, HtmlIsSelfContainedWithPlots) {
  BenchReport r;
  r.config = {{"workload_name", "<sweep>"}};
  for (double rate : {1.0, 2.0, 4.0})
    r.runs.push_back(make_run_report("rate " + std::to_string(rate), rate, sample_result(), Slo{}, Buckets{}));
  const std::string html = html_report(r);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://cdn"), std::string::npos);
  EXPECT_NE(html.find("&lt;sweep&gt;"), std::string::npos);  // escaped
  size_t svgs = 0;
  for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) ++svgs;
  EXPECT_EQ(svgs, 6u);  // 2 CDFs + 4 load plots for a sweep
  EXPECT_NE(html.find("CDF of TTFT"), std::string::npos);
  EXPECT_NE(html.find("TTFT against load"), std::string::npos);
  EXPECT_NE(html.find("<polyline"), std::string::npos);
}

TEST(BenchReport, SvgChartMapsPointsInsideThePlotArea) {
  const std::string svg = svg_line_chart("t", "x", "y", {{"s", {{0, 0}, {10, 5}}}});
  // Plot area: x in [70, 620], y in [36, 324]; (0,0) is the lower left and (10,5) the upper right.
  EXPECT_NE(svg.find("points=\"70,324 620,36 \""), std::string::npos) << svg;
  EXPECT_NE(svg_line_chart("t", "x", "y", {}).find("no data"), std::string::npos);
}

}  // namespace
}  // namespace tessera::bench

namespace tessera::bench {
namespace {

TEST(BenchReport, OfflineRowsReadAsAReportAndCompare) {
  OfflineBenchRow row;
  row.concurrency = 8;
  row.prefix_cache = true;
  row.n_requests = 64;
  row.seconds = 16;
  row.requests_per_s = 4;
  row.output_tokens_per_s = 256;
  row.total_tokens_per_s = 768;
  row.ttft_s = {0.5, 0.25, 1.25};  // seconds from t = 0, one per request
  row.itl_s = {0.010, 0.030};
  row.tpot_s = {0.020};
  row.e2e_s = {2.0, 3.0, 4.0};
  const std::string path = ::testing::TempDir() + "/bench_offline.json";
  std::ofstream(path) << offline_report_json({row}, {{"model", "m"}}).dump();
  const BenchReport r = read_report(path);
  ASSERT_EQ(r.runs.size(), 1u);
  EXPECT_EQ(r.runs[0].label, "concurrency 8 (prefix cache)");
  EXPECT_TRUE(std::isinf(r.runs[0].offered_rate));
  EXPECT_DOUBLE_EQ(r.runs[0].summary.output_throughput, 256);
  EXPECT_DOUBLE_EQ(r.runs[0].summary.ttft_ms.max, 1250);
  EXPECT_DOUBLE_EQ(r.runs[0].summary.ttft_ms.p50, 500);
  EXPECT_EQ(r.runs[0].summary.ttft_ms.count, 3u);
  EXPECT_NEAR(r.runs[0].summary.itl_ms.mean, 20, 1e-9);
  EXPECT_NEAR(r.runs[0].summary.tpot_ms.p50, 20, 1e-9);
  EXPECT_NEAR(r.runs[0].summary.e2e_ms.mean, 3000, 1e-9);
  EXPECT_EQ(r.runs[0].summary.queue_ms.count, 0u);  // not measured offline
  EXPECT_EQ(r.config["tool"], "tessera bench offline");
  const std::string table = format_compare(r, r, "a", "b");
  EXPECT_NE(table.find("| TTFT P50 (ms) | 500.00 | 500.00 | 1.00x (lower is better) |"), std::string::npos) << table;
  // The printed table reads the same summaries: TTFT mean / p50 / p99 in s, ITL in ms.
  const std::string printed = format_offline_table({row});
  EXPECT_NE(printed.find("| 8 | on | 64 | 16.00 | 4.00 | 256.0 | 768.0 | 0.667 | 0.500 | 1.235 | 20.0 | 20.0 | 29.8 |"),
            std::string::npos)
      << printed;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace tessera::bench
