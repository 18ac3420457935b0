#include "benchharness/html_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace tessera::bench {

namespace {

constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                   "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string num(double v) {
  char buf[32];
  if (v != 0 && (std::fabs(v) >= 1e7 || std::fabs(v) < 1e-3))
    std::snprintf(buf, sizeof buf, "%.2g", v);
  else
    std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// "Nice" tick step: 1, 2 or 5 times a power of ten, about `target` ticks over the span.
double nice_step(double span, int target) {
  const double raw = span / target;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  const double m = raw / p;
  return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<SvgSeries>& series, bool step, bool log_x) {
  const double W = 640, H = 380, L = 70, R = 20, T = 36, B = 56;
  double x0 = INFINITY, x1 = -INFINITY, y0 = 0, y1 = -INFINITY;
  for (const auto& s : series)
    for (auto [x, y] : s.points) {
      if (log_x && x <= 0) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  std::ostringstream os;
  os << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W
     << " " << H << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  os << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  os << "<text x=\"" << W / 2 << "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">" << html_escape(title)
     << "</text>\n";
  if (!std::isfinite(x0) || !std::isfinite(y1)) {
    os << "<text x=\"" << W / 2 << "\" y=\"" << H / 2 << "\" text-anchor=\"middle\">no data</text></svg>\n";
    return os.str();
  }
  if (!log_x) x0 = std::min(x0, 0.0);  // linear axes start at zero: shapes compare at a glance
  auto fx = [&](double x) { return log_x ? std::log10(x) : x; };
  double lx0 = fx(x0), lx1 = fx(x1);
  if (lx1 - lx0 < 1e-12) lx0 -= 0.5, lx1 += 0.5;
  if (y1 - y0 < 1e-12) y1 = y0 + 1;
  const double ystep = nice_step(y1 - y0, 5);
  y1 = std::ceil(y1 / ystep) * ystep;
  auto px = [&](double x) { return L + (fx(x) - lx0) / (lx1 - lx0) * (W - L - R); };
  auto py = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };
  // Grid and ticks.
  os << "<g stroke=\"#ddd\">\n";
  for (double y = y0; y <= y1 + ystep * 1e-9; y += ystep)
    os << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << py(y) << "\" y2=\"" << py(y) << "\"/>\n";
  os << "</g>\n";
  for (double y = y0; y <= y1 + ystep * 1e-9; y += ystep)
    os << "<text x=\"" << L - 6 << "\" y=\"" << py(y) + 4 << "\" text-anchor=\"end\">" << num(y) << "</text>\n";
  if (log_x) {
    for (double d = std::floor(lx0); d <= std::ceil(lx1); d += 1) {
      const double x = std::pow(10.0, d);
      if (d < lx0 - 1e-9 || d > lx1 + 1e-9) continue;
      os << "<line x1=\"" << px(x) << "\" x2=\"" << px(x) << "\" y1=\"" << T << "\" y2=\"" << H - B
         << "\" stroke=\"#ddd\"/>\n<text x=\"" << px(x) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">"
         << num(x) << "</text>\n";
    }
  } else {
    const double xstep = nice_step(x1 - x0 > 0 ? x1 - x0 : 1, 6);
    for (double x = std::ceil(lx0 / xstep) * xstep; x <= lx1 + xstep * 1e-9; x += xstep)
      os << "<line x1=\"" << px(x) << "\" x2=\"" << px(x) << "\" y1=\"" << T << "\" y2=\"" << H - B
         << "\" stroke=\"#ddd\"/>\n<text x=\"" << px(x) << "\" y=\"" << H - B + 16 << "\" text-anchor=\"middle\">"
         << num(x) << "</text>\n";
  }
  os << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\"" << H - T - B
     << "\" fill=\"none\" stroke=\"#333\"/>\n";
  os << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 14 << "\" text-anchor=\"middle\">" << html_escape(x_label)
     << "</text>\n";
  os << "<text transform=\"translate(16," << (T + H - B) / 2 << ") rotate(-90)\" text-anchor=\"middle\">"
     << html_escape(y_label) << "</text>\n";
  auto color_of = [](size_t i) { return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))]; };
  for (size_t i = 0; i < series.size(); ++i) {
    std::ostringstream pts;
    bool first = true;
    double prev_y = 0;
    for (auto [x, y] : series[i].points) {
      if (log_x && x <= 0) continue;
      if (step && !first) pts << px(x) << "," << py(prev_y) << " ";
      pts << px(x) << "," << py(y) << " ";
      prev_y = y;
      first = false;
    }
    os << "<polyline fill=\"none\" stroke=\"" << color_of(i) << "\" stroke-width=\"1.8\" points=\"" << pts.str()
       << "\"/>\n";
    if (!step)
      for (auto [x, y] : series[i].points)
        if (!log_x || x > 0)
          os << "<circle cx=\"" << px(x) << "\" cy=\"" << py(y) << "\" r=\"3\" fill=\"" << color_of(i) << "\"/>\n";
  }
  // The legend, on a translucent box over the lines.
  size_t longest = 0;
  for (const auto& s : series) longest = std::max(longest, s.name.size());
  if (!series.empty())
    os << "<rect x=\"" << L + 4 << "\" y=\"" << T + 3 << "\" width=\"" << 34 + 6.5 * static_cast<double>(longest)
       << "\" height=\"" << 15 * series.size() + 4 << "\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\"/>\n";
  for (size_t i = 0; i < series.size(); ++i) {
    const double ly = T + 14 + 15 * static_cast<double>(i);
    os << "<line x1=\"" << L + 10 << "\" x2=\"" << L + 28 << "\" y1=\"" << ly - 4 << "\" y2=\"" << ly - 4
       << "\" stroke=\"" << color_of(i) << "\" stroke-width=\"2\"/><text x=\"" << L + 32 << "\" y=\"" << ly << "\">"
       << html_escape(series[i].name) << "</text>\n";
  }
  os << "</svg>\n";
  return os.str();
}

namespace {

std::string cell(const Summary& s, double Summary::*f) {
  if (s.count == 0 || std::isnan(s.*f)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", s.*f);
  return buf;
}

std::string metrics_table(const std::vector<std::pair<std::string, const Metrics*>>& rows) {
  std::ostringstream os;
  os << "<table><tr><th></th><th>ok</th><th>failed</th><th>req/s</th><th>out tok/s</th><th>total tok/s</th>"
        "<th>goodput req/s</th><th>goodput %</th>";
  for (const char* m : {"TTFT", "TPOT", "ITL", "E2E"})
    for (const char* s : {"mean", "P50", "P90", "P99", "max"}) os << "<th>" << m << " " << s << " ms</th>";
  os << "<th>queue P50 ms</th></tr>\n";
  for (const auto& [label, m] : rows) {
    char buf[256];
    std::snprintf(buf, sizeof buf, "<td>%lld</td><td>%lld</td><td>%.3f</td><td>%.1f</td><td>%.1f</td>",
                  static_cast<long long>(m->n_ok), static_cast<long long>(m->n_failed), m->request_throughput,
                  m->output_throughput, m->total_token_throughput);
    os << "<tr><td>" << html_escape(label) << "</td>" << buf;
    os << "<td>" << (m->goodput_rps ? num(*m->goodput_rps) : "-") << "</td><td>"
       << (m->goodput_fraction ? num(*m->goodput_fraction * 100) : "-") << "</td>";
    for (const Summary* s : {&m->ttft_ms, &m->tpot_ms, &m->itl_ms, &m->e2e_ms})
      for (auto f : {&Summary::mean, &Summary::p50, &Summary::p90, &Summary::p99, &Summary::max})
        os << "<td>" << cell(*s, f) << "</td>";
    os << "<td>" << cell(m->queue_ms, &Summary::p50) << "</td></tr>\n";
  }
  os << "</table>\n";
  return os.str();
}

}  // namespace

std::string html_report(const BenchReport& report) {
  std::ostringstream os;
  const std::string title = "tessera bench serve: " + report.config.value("workload_name", std::string("report"));
  os << "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>" << html_escape(title) << "</title>\n"
     << "<style>body{font-family:sans-serif;margin:24px;max-width:1400px}table{border-collapse:collapse;"
        "font-size:12px;margin:8px 0 20px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}pre{background:#f6f6f6;padding:8px;font-size:12px;"
        "overflow-x:auto}.plots svg{margin:6px;border:1px solid #eee}</style></head><body>\n";
  os << "<h1>" << html_escape(title) << "</h1>\n";
  os << "<h2>Configuration</h2><pre>" << html_escape(report.config.dump(2)) << "</pre>\n";
  std::vector<std::pair<std::string, const Metrics*>> rows;
  for (const auto& r : report.runs) rows.emplace_back(r.label, &r.summary);
  os << "<h2>Summary</h2>\n" << metrics_table(rows);
  os << "<p>Latencies over successful requests; TTFT from sending the request to the first chunk with text; "
        "ITL between consecutive chunks with text; TPOT = (E2E - TTFT) / (output tokens - 1); percentiles "
        "interpolate linearly like numpy's default.</p>\n";

  os << "<h2>Plots</h2><div class=\"plots\">\n";
  std::vector<SvgSeries> ttft_cdf, itl_cdf;
  for (const auto& r : report.runs) {
    std::vector<double> ttft, itl;
    for (const auto& rec : r.records) {
      if (!rec.ok) continue;
      if (rec.ttft_s >= 0) ttft.push_back(rec.ttft_s * 1000);
      for (double g : rec.itl_s()) itl.push_back(g * 1000);
    }
    SvgSeries a{r.label, {}}, b{r.label, {}};
    for (const auto& p : empirical_cdf(ttft)) a.points.emplace_back(p.value, p.fraction);
    for (const auto& p : empirical_cdf(itl)) b.points.emplace_back(p.value, p.fraction);
    ttft_cdf.push_back(std::move(a));
    itl_cdf.push_back(std::move(b));
  }
  os << svg_line_chart("CDF of TTFT", "TTFT (ms)", "fraction of requests", ttft_cdf, true);
  os << svg_line_chart("CDF of ITL", "inter-token latency (ms)", "fraction of gaps", itl_cdf, true);
  if (report.runs.size() > 1) {
    // Load = the offered request rate; runs at infinite rate sit at the measured rate instead.
    auto load_of = [](const RunReport& r) {
      return std::isinf(r.offered_rate) ? r.summary.request_throughput : r.offered_rate;
    };
    SvgSeries ttft50{"TTFT P50", {}}, ttft99{"TTFT P99", {}}, tpot50{"TPOT P50", {}}, tpot99{"TPOT P99", {}};
    SvgSeries e2e50{"E2E P50", {}}, out_tps{"output tok/s", {}}, req{"request throughput", {}}, good{"goodput", {}};
    for (const auto& r : report.runs) {
      const double x = load_of(r);
      const Metrics& m = r.summary;
      if (m.ttft_ms.count) ttft50.points.emplace_back(x, m.ttft_ms.p50), ttft99.points.emplace_back(x, m.ttft_ms.p99);
      if (m.tpot_ms.count) tpot50.points.emplace_back(x, m.tpot_ms.p50), tpot99.points.emplace_back(x, m.tpot_ms.p99);
      if (m.e2e_ms.count) e2e50.points.emplace_back(x, m.e2e_ms.p50);
      out_tps.points.emplace_back(x, m.output_throughput);
      req.points.emplace_back(x, m.request_throughput);
      if (m.goodput_rps) good.points.emplace_back(x, *m.goodput_rps);
    }
    os << svg_line_chart("TTFT against load", "offered load (req/s)", "ms", {ttft50, ttft99});
    os << svg_line_chart("TPOT and E2E against load", "offered load (req/s)", "ms", {tpot50, tpot99, e2e50});
    os << svg_line_chart("Output throughput against load", "offered load (req/s)", "tokens/s", {out_tps});
    std::vector<SvgSeries> rps = {req};
    if (!good.points.empty()) rps.push_back(good);
    os << svg_line_chart("Request throughput and goodput against load", "offered load (req/s)", "req/s", rps);
  }
  os << "</div>\n";
  for (const auto& r : report.runs) {
    os << "<h2>" << html_escape(r.label) << ": by input / output length</h2>\n";
    std::vector<std::string> labels;
    for (const auto& b : r.buckets) labels.push_back("in " + b.input_range + " out " + b.output_range);
    std::vector<std::pair<std::string, const Metrics*>> brows;
    for (size_t i = 0; i < r.buckets.size(); ++i) brows.emplace_back(labels[i], &r.buckets[i].metrics);
    os << metrics_table(brows);
    if (!r.failures.empty()) {
      os << "<h3>Failures</h3><table><tr><th>reason</th><th>count</th></tr>\n";
      for (const auto& [reason, count] : r.failures)
        os << "<tr><td>" << html_escape(reason) << "</td><td>" << count << "</td></tr>\n";
      os << "</table>\n";
    }
  }
  os << "</body></html>\n";
  return os.str();
}

}  // namespace tessera::bench
