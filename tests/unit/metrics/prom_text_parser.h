#pragma once
// A small, strict reader of the Prometheus text exposition format 0.0.4, for tests: it
// rejects (throws) anything a Prometheus server would reject or that our exposition should
// never contain, and checks histogram structure (ascending `le`, cumulative counts, a
// final +Inf bucket equal to _count).
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::test {

struct PromSample {
  std::string name;
  std::map<std::string, std::string> labels;  // unescaped values
  double value = 0;
};

struct PromFamily {
  std::string name;
  std::string type;  // counter, gauge, histogram, summary, untyped
  std::string help;  // unescaped
  std::vector<PromSample> samples;
};

class PromParseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace prom_detail {

inline bool is_name_start(char c, bool allow_colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (allow_colon && c == ':');
}
inline bool is_name_char(char c, bool allow_colon) { return is_name_start(c, allow_colon) || (c >= '0' && c <= '9'); }

[[noreturn]] inline void fail(size_t line_no, const std::string& what, std::string_view line) {
  throw PromParseError("line " + std::to_string(line_no) + ": " + what + ": '" + std::string(line) + "'");
}

// Reads a metric (allow_colon) or label name at pos.
inline std::string read_name(std::string_view s, size_t& pos, bool allow_colon) {
  const size_t start = pos;
  if (pos >= s.size() || !is_name_start(s[pos], allow_colon)) return {};
  while (pos < s.size() && is_name_char(s[pos], allow_colon)) ++pos;
  return std::string(s.substr(start, pos - start));
}

// Go's strconv.ParseFloat as Prometheus uses it, minus hex: finite decimals, +Inf, -Inf, NaN.
inline std::optional<double> parse_value(std::string_view text) {
  if (text == "+Inf" || text == "Inf") return INFINITY;
  if (text == "-Inf") return -INFINITY;
  if (text == "NaN") return NAN;
  if (text.empty()) return std::nullopt;
  for (char c : text)
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')) return std::nullopt;
  const std::string owned(text);
  char* end = nullptr;
  const double v = std::strtod(owned.c_str(), &end);
  if (end != owned.c_str() + owned.size()) return std::nullopt;
  return v;
}

}  // namespace prom_detail

// Families in exposition order. Throws PromParseError naming the line on any violation.
inline std::vector<PromFamily> parse_prometheus_text(std::string_view text) {
  using namespace prom_detail;
  std::vector<PromFamily> families;
  std::map<std::string, size_t> index;  // family name -> position
  if (!text.empty() && text.back() != '\n') throw PromParseError("exposition does not end with a newline");
  size_t line_no = 0;
  std::optional<std::string> pending_help_name;
  std::string pending_help;
  size_t start = 0;
  while (start < text.size()) {
    const size_t nl = text.find('\n', start);
    const std::string_view line = text.substr(start, nl - start);
    start = nl + 1;
    ++line_no;
    if (line.empty()) fail(line_no, "empty line", line);
    if (line.back() == ' ' || line.back() == '\r') fail(line_no, "trailing whitespace", line);
    if (line.rfind("# HELP ", 0) == 0) {
      size_t pos = 7;
      const std::string name = read_name(line, pos, true);
      if (name.empty() || pos >= line.size() || line[pos] != ' ') fail(line_no, "bad HELP", line);
      if (index.count(name)) fail(line_no, "HELP after the family's samples", line);
      std::string help;
      for (size_t i = pos + 1; i < line.size(); ++i) {
        if (line[i] != '\\') {
          help += line[i];
          continue;
        }
        if (++i >= line.size()) fail(line_no, "dangling escape in HELP", line);
        if (line[i] == '\\')
          help += '\\';
        else if (line[i] == 'n')
          help += '\n';
        else
          fail(line_no, "bad escape in HELP", line);
      }
      pending_help_name = name;
      pending_help = help;
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      size_t pos = 7;
      const std::string name = read_name(line, pos, true);
      if (name.empty() || pos >= line.size() || line[pos] != ' ') fail(line_no, "bad TYPE", line);
      const std::string type(line.substr(pos + 1));
      if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" && type != "untyped")
        fail(line_no, "unknown type", line);
      if (index.count(name)) fail(line_no, "family declared twice", line);
      if (pending_help_name != name) fail(line_no, "TYPE without a HELP just before it", line);
      index[name] = families.size();
      families.push_back({name, type, pending_help, {}});
      pending_help_name.reset();
      continue;
    }
    if (line[0] == '#') fail(line_no, "unexpected comment", line);

    PromSample sample;
    size_t pos = 0;
    sample.name = read_name(line, pos, true);
    if (sample.name.empty()) fail(line_no, "bad metric name", line);
    if (pos < line.size() && line[pos] == '{') {
      ++pos;
      while (true) {
        if (pos < line.size() && line[pos] == '}') {
          ++pos;
          break;
        }
        const std::string label = read_name(line, pos, false);
        if (label.empty()) fail(line_no, "bad label name", line);
        if (pos + 1 >= line.size() || line[pos] != '=' || line[pos + 1] != '"') fail(line_no, "bad label", line);
        pos += 2;
        std::string value;
        while (true) {
          if (pos >= line.size()) fail(line_no, "unterminated label value", line);
          const char c = line[pos++];
          if (c == '"') break;
          if (c != '\\') {
            value += c;
            continue;
          }
          if (pos >= line.size()) fail(line_no, "dangling escape", line);
          const char e = line[pos++];
          if (e == '\\')
            value += '\\';
          else if (e == '"')
            value += '"';
          else if (e == 'n')
            value += '\n';
          else
            fail(line_no, "bad escape in label value", line);
        }
        if (!sample.labels.emplace(label, value).second) fail(line_no, "duplicate label", line);
        if (pos < line.size() && line[pos] == ',')
          ++pos;
        else if (pos < line.size() && line[pos] == '}') {
          ++pos;
          break;
        } else
          fail(line_no, "expected , or }", line);
      }
    }
    if (pos >= line.size() || line[pos] != ' ') fail(line_no, "expected one space before the value", line);
    const std::string_view value_text = line.substr(pos + 1);
    if (value_text.find(' ') != std::string_view::npos) fail(line_no, "timestamps are not expected", line);
    const auto value = parse_value(value_text);
    if (!value) fail(line_no, "bad value", line);
    sample.value = *value;

    // The sample must belong to the family declared last.
    if (families.empty()) fail(line_no, "sample before any TYPE", line);
    PromFamily& family = families.back();
    bool belongs = sample.name == family.name;
    if (family.type == "histogram") {
      belongs = sample.name == family.name + "_bucket" || sample.name == family.name + "_sum" ||
                sample.name == family.name + "_count";
      if ((sample.name == family.name + "_bucket") != (sample.labels.count("le") == 1))
        fail(line_no, "le label on a histogram sample other than _bucket, or missing", line);
    }
    if (!belongs) fail(line_no, "sample not of family " + family.name, line);
    if (family.type == "counter" && !(sample.value >= 0)) fail(line_no, "negative or NaN counter", line);
    family.samples.push_back(std::move(sample));
  }
  if (pending_help_name) throw PromParseError("HELP without TYPE at the end");

  // Histogram structure, per label set (all labels but le).
  for (const PromFamily& family : families) {
    if (family.type != "histogram") continue;
    std::map<std::map<std::string, std::string>, std::vector<const PromSample*>> series;
    for (const PromSample& s : family.samples) {
      auto key = s.labels;
      key.erase("le");
      series[key].push_back(&s);
    }
    for (const auto& [key, samples] : series) {
      double last_le = -INFINITY, last_count = 0, inf_count = -1, count = -1;
      bool have_sum = false;
      for (const PromSample* s : samples) {
        if (s->name == family.name + "_bucket") {
          const auto le = parse_value(s->labels.at("le"));
          if (!le || std::isnan(*le)) throw PromParseError(family.name + ": bad le '" + s->labels.at("le") + "'");
          if (!(*le > last_le)) throw PromParseError(family.name + ": le not ascending");
          if (s->value < last_count) throw PromParseError(family.name + ": buckets not cumulative");
          last_le = *le;
          last_count = s->value;
          if (std::isinf(*le)) inf_count = s->value;
        } else if (s->name == family.name + "_count") {
          count = s->value;
        } else {
          have_sum = true;
        }
      }
      if (inf_count < 0) throw PromParseError(family.name + ": no +Inf bucket");
      if (count != inf_count) throw PromParseError(family.name + ": _count differs from the +Inf bucket");
      if (!have_sum) throw PromParseError(family.name + ": no _sum");
    }
  }
  return families;
}

}  // namespace tessera::test
