#pragma once
// A self-contained HTML page for a benchmark report: tables, and plots drawn as inline SVG
// here (no scripts, no external files): CDFs of TTFT and ITL per run, and for sweeps latency
// against load and throughput against load.
#include <string>
#include <vector>

#include "benchharness/report.h"

namespace tessera::bench {

struct SvgSeries {
  std::string name;
  std::vector<std::pair<double, double>> points;  // (x, y), drawn in order
};

// A line chart with axes, ticks and a legend; `step` draws a staircase (for CDFs).
std::string svg_line_chart(const std::string& title, const std::string& x_label, const std::string& y_label,
                           const std::vector<SvgSeries>& series, bool step = false, bool log_x = false);

std::string html_report(const BenchReport& report);

// Escapes &, <, >, " for HTML text and attributes.
std::string html_escape(const std::string& s);

}  // namespace tessera::bench
