#include "server/exposition.h"

#include <charconv>
#include <cmath>

#include "core/error.h"

namespace tessera {

std::string format_prometheus_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Shortest text that reads back to the same double, like Python's repr().
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  TESSERA_CHECK(ec == std::errc(), "cannot format metric value ", value);
  std::string text(buf, end);
  // Python's prometheus_client writes integral floats as "1.0"; do the same so both
  // expositions read alike (Prometheus accepts either).
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

void ExpositionWriter::family(std::string_view name, std::string_view type, std::string_view help) {
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  out_ += escape_help(help);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += ' ';
  out_ += type;
  out_ += '\n';
}

void ExpositionWriter::sample(std::string_view name, std::string_view extra_labels, double value) {
  out_ += name;
  if (!common_.empty() || !extra_labels.empty()) {
    out_ += '{';
    out_ += common_;
    if (!common_.empty() && !extra_labels.empty()) out_ += ',';
    out_ += extra_labels;
    out_ += '}';
  }
  out_ += ' ';
  out_ += format_prometheus_value(value);
  out_ += '\n';
}

void ExpositionWriter::gauge(std::string_view name, std::string_view help, double value) {
  family(name, "gauge", help);
  sample(name, "", value);
}

void ExpositionWriter::counter(std::string_view name, std::string_view help, double value) {
  family(name, "counter", help);
  sample(name, "", value);
}

}  // namespace tessera
