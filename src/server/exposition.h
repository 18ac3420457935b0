#pragma once
// The Prometheus text exposition format (0.0.4): families, samples and the escaping rules,
// shared by the server's metrics (metrics.h) and the router's (router/router.h).
#include <string>
#include <string_view>

namespace tessera {

// A sample value or `le` bound as Prometheus and Python's prometheus_client write it:
// "1.0", "0.025", "1e-05", "+Inf", "-Inf", "NaN".
std::string format_prometheus_value(double value);

// Label values escape \ " and newline; help texts \ and newline.
std::string escape_label_value(std::string_view value);
std::string escape_help(std::string_view text);

// Writes families in the text format with every series carrying the common labels.
class ExpositionWriter {
 public:
  explicit ExpositionWriter(std::string common_labels) : common_(std::move(common_labels)) {}

  void family(std::string_view name, std::string_view type, std::string_view help);
  // extra_labels: `key="escaped value"` pairs joined by commas, or "".
  void sample(std::string_view name, std::string_view extra_labels, double value);
  void gauge(std::string_view name, std::string_view help, double value);
  // name ends in _total already: prometheus_client names the family after the sample.
  void counter(std::string_view name, std::string_view help, double value);
  std::string take() { return std::move(out_); }

 private:
  std::string common_;
  std::string out_;
};

}  // namespace tessera
