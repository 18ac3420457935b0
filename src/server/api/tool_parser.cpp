#include "server/api/tool_parser.h"

#include <nlohmann/json.hpp>
#include <random>

namespace tessera::api {

namespace {

using json = nlohmann::json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view marker(ToolFormat f) {
  switch (f) {
    case ToolFormat::Hermes:
      return kHermesOpen;
    case ToolFormat::Llama3Json:
      return kPythonTag;
    case ToolFormat::Mistral:
      return kMistralCalls;
  }
  return kHermesOpen;
}

// The character a call list may start the output with, without a marker ('\0': none).
char bare_start(ToolFormat f) { return f == ToolFormat::Llama3Json ? '{' : f == ToolFormat::Mistral ? '[' : '\0'; }

// The longest tail of `text` that is a proper prefix of `m`: it may become the marker.
size_t partial_marker_tail(std::string_view text, std::string_view m) {
  for (size_t n = std::min(text.size(), m.size() - 1); n > 0; --n)
    if (text.substr(text.size() - n) == m.substr(0, n)) return n;
  return 0;
}

}  // namespace

std::optional<ToolFormat> tool_format_from_name(std::string_view name) {
  if (name == "hermes") return ToolFormat::Hermes;
  if (name == "llama3_json") return ToolFormat::Llama3Json;
  if (name == "mistral") return ToolFormat::Mistral;
  return std::nullopt;
}

std::string_view tool_format_name(ToolFormat format) {
  switch (format) {
    case ToolFormat::Hermes:
      return "hermes";
    case ToolFormat::Llama3Json:
      return "llama3_json";
    case ToolFormat::Mistral:
      return "mistral";
  }
  return "hermes";
}

std::optional<ToolFormat> detect_tool_format(std::string_view source, bool renders_tools) {
  if (!renders_tools) return std::nullopt;
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolFormat::Hermes;
  if (source.find(kMistralCalls) != std::string_view::npos) return ToolFormat::Mistral;
  // Llama 3.1+ templates write <|python_tag|> for built-in tools and ask for {"name": ...,
  // "parameters": ...} for custom ones, in the ipython role.
  if (source.find(kPythonTag) != std::string_view::npos || source.find("ipython") != std::string_view::npos)
    return ToolFormat::Llama3Json;
  return ToolFormat::Hermes;
}

std::string make_tool_call_id() {
  static constexpr char kAlnum[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, sizeof(kAlnum) - 2);
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlnum[pick(rng)];
  return id;
}

ToolCallParser::ToolCallParser(ToolFormat format) : format_(format) {}

ToolParserOutput ToolCallParser::push(std::string_view text) {
  ToolParserOutput out;
  buf_.append(text);
  step(out, false);
  return out;
}

ToolParserOutput ToolCallParser::finish() {
  ToolParserOutput out;
  step(out, true);
  if (mode_ == Mode::InCall) {
    fail_call(out);  // cut short
    step(out, true);
  } else if (mode_ == Mode::BeforeCall && format_ == ToolFormat::Hermes) {
    malformed_ = true;  // a marker with no call after it
    out.content += raw_;
    raw_.clear();
  }
  pending_ws_.clear();
  mode_ = Mode::Content;
  return out;
}

void ToolCallParser::step(ToolParserOutput& out, bool final) {
  for (;;) {
    bool progressed = false;
    switch (mode_) {
      case Mode::Content:
        progressed = step_content(out, final);
        break;
      case Mode::BeforeCall:
      case Mode::AfterCall:
        progressed = step_between(out, final);
        break;
      case Mode::InCall:
        progressed = step_call(out);
        break;
    }
    if (!progressed) return;
  }
}

bool ToolCallParser::step_content(ToolParserOutput& out, bool final) {
  if (buf_.empty()) return false;
  if (at_start_) {
    const size_t first = buf_.find_first_not_of(" \n\r\t");
    if (first == std::string::npos) {
      if (!final) return false;  // only whitespace yet: what follows decides
    } else {
      const std::string_view rest = std::string_view(buf_).substr(first);
      const std::string_view m = marker(format_);
      // "[" may begin "[TOOL_CALLS]" as well as a bare list: the marker decides first.
      if (!final && rest.size() < m.size() && m.starts_with(rest)) return false;
      at_start_ = false;
      const char bare = bare_start(format_);
      if (bare != '\0' && rest.front() == bare && !rest.starts_with(m)) {
        buf_.erase(0, first);
        enter_calls(out);
        return true;
      }
    }
  }
  const std::string_view m = marker(format_);
  const size_t at = buf_.find(m);
  if (at != std::string::npos) {
    emit_content(out, std::string_view(buf_).substr(0, at), /*before_marker=*/true);
    raw_ = std::string(m);
    buf_.erase(0, at + m.size());
    enter_calls(out);
    return true;
  }
  const size_t hold = final ? 0 : partial_marker_tail(buf_, m);
  emit_content(out, std::string_view(buf_).substr(0, buf_.size() - hold), false);
  buf_.erase(0, buf_.size() - hold);
  return false;
}

void ToolCallParser::emit_content(ToolParserOutput& out, std::string_view text, bool before_marker) {
  if (skip_ws_) {
    while (!text.empty() && is_ws(text.front())) text.remove_prefix(1);
    if (!text.empty()) skip_ws_ = false;
  }
  std::string s = pending_ws_;
  s.append(text);
  pending_ws_.clear();
  size_t n = s.size();
  while (n > 0 && is_ws(s[n - 1])) --n;
  out.content.append(s, 0, n);
  // Whitespace before a call is markup, not content; elsewhere it waits for what follows.
  if (!before_marker) pending_ws_ = s.substr(n);
}

void ToolCallParser::enter_calls(ToolParserOutput& out) {
  (void)out;
  mode_ = Mode::BeforeCall;
  pending_ws_.clear();
  in_list_ = false;
  if (format_ == ToolFormat::Mistral && !buf_.empty() && buf_.front() == '[' && raw_.empty()) {
    // The bare list at the start: '[' opens it.
    raw_.assign(1, '[');
    buf_.erase(0, 1);
    in_list_ = true;
  }
}

void ToolCallParser::end_calls() {
  mode_ = Mode::Content;
  skip_ws_ = true;
  in_list_ = false;
  raw_.clear();
}

bool ToolCallParser::step_between(ToolParserOutput& out, bool final) {
  size_t ws = 0;
  while (ws < buf_.size() && is_ws(buf_[ws])) ++ws;
  raw_.append(buf_, 0, ws);
  buf_.erase(0, ws);
  if (buf_.empty()) return false;
  const char c = buf_.front();
  const bool before = mode_ == Mode::BeforeCall;
  auto start_object = [&] {
    scan_ = ScanState{};
    mode_ = Mode::InCall;
    return true;
  };
  auto fail_here = [&] {
    fail_call(out);
    return true;
  };
  switch (format_) {
    case ToolFormat::Hermes: {
      if (before) return c == '{' ? start_object() : fail_here();
      if (buf_.starts_with(kHermesClose)) {
        buf_.erase(0, kHermesClose.size());
        end_calls();
        return true;
      }
      if (!final && kHermesClose.starts_with(buf_)) return false;  // maybe the end marker
      end_calls();                                                 // no end marker: what follows is content
      return true;
    }
    case ToolFormat::Llama3Json: {
      if (before) {
        if (c == '{') return start_object();
        if (calls_.empty() && raw_.empty()) return fail_here();
        end_calls();
        return true;
      }
      if (c == ';') {
        raw_ += c;
        buf_.erase(0, 1);
        mode_ = Mode::BeforeCall;
        return true;
      }
      end_calls();
      return true;
    }
    case ToolFormat::Mistral: {
      if (before && !in_list_) {
        if (c != '[') return fail_here();
        raw_ += c;
        buf_.erase(0, 1);
        in_list_ = true;
        return true;
      }
      if (before && c == '{') return start_object();
      if (c == ']') {
        buf_.erase(0, 1);
        end_calls();
        return true;
      }
      if (!before && c == ',') {
        raw_ += c;
        buf_.erase(0, 1);
        mode_ = Mode::BeforeCall;
        return true;
      }
      return fail_here();
    }
  }
  return false;
}

bool ToolCallParser::step_call(ToolParserOutput& out) {
  ScanState& s = scan_;
  size_t used = 0;
  bool complete = false;
  while (used < buf_.size() && !complete) {
    const char c = buf_[used++];
    const size_t pos = s.text.size();
    s.text += c;
    if (s.in_str) {
      if (s.esc) {
        s.esc = false;
      } else if (c == '\\') {
        s.esc = true;
      } else if (c == '"') {
        s.in_str = false;
        const json str = json::parse(s.text.substr(s.str_start, pos + 1 - s.str_start), nullptr, false);
        if (!str.is_string()) continue;
        if (s.key_str) {
          s.key = str.get<std::string>();
          s.key_str = false;
        } else if (s.depth == 1 && s.value_of == 1 && !s.name) {
          s.name = str.get<std::string>();
          if (!s.name->empty() && !s.started) {
            s.started = true;
            s.id = make_tool_call_id();
            ToolCallDelta d;
            d.index = static_cast<int>(calls_.size());
            d.first = true;
            d.id = s.id;
            d.name = *s.name;
            out.calls.push_back(std::move(d));
          }
        }
      }
      continue;
    }
    if (is_ws(c)) continue;
    if (s.depth == 1 && s.value_next) {
      s.value_next = false;
      if (s.value_of == 2 && s.args_start == std::string::npos) {
        s.args_start = pos;
        s.args_container = c == '{' || c == '[';
        s.args_open = true;
      }
    }
    // A scalar arguments value ends at the ',' or '}' after it (trailing whitespace aside).
    auto end_scalar_args = [&] {
      if (!s.args_open || s.args_container) return;
      size_t e = pos;
      while (e > s.args_start && is_ws(s.text[e - 1])) --e;
      s.args_end = e;
      s.args_open = false;
    };
    switch (c) {
      case '"':
        s.in_str = true;
        s.str_start = pos;
        s.key_str = s.depth == 1 && s.expect_key;
        if (s.key_str) s.expect_key = false;
        break;
      case '{':
      case '[':
        ++s.depth;
        if (c == '{' && s.depth == 1) s.expect_key = true;
        break;
      case '}':
      case ']':
        if (s.depth == 1) end_scalar_args();
        --s.depth;
        if (s.depth == 1 && s.args_open && s.args_container) {
          s.args_end = pos + 1;
          s.args_open = false;
        }
        if (s.depth <= 0) complete = true;
        break;
      case ',':
        if (s.depth == 1) {
          end_scalar_args();
          s.expect_key = true;
          s.value_of = 0;
        }
        break;
      case ':':
        if (s.depth == 1) {
          s.value_next = true;
          s.value_of = s.key == "name" ? 1 : (s.key == "arguments" || s.key == "parameters") ? 2 : 0;
        }
        break;
      default:
        break;
    }
  }
  buf_.erase(0, used);
  if (complete) {
    finish_call(out);
    return true;
  }
  stream_arguments(out);
  return false;
}

void ToolCallParser::stream_arguments(ToolParserOutput& out) {
  ScanState& s = scan_;
  if (!s.started || s.args_start == std::string::npos || !s.args_container) return;
  const size_t end = s.args_open ? s.text.size() : s.args_end;
  if (end <= s.args_start + s.sent) return;
  std::string piece = s.text.substr(s.args_start + s.sent, end - s.args_start - s.sent);
  s.sent = end - s.args_start;
  const int index = static_cast<int>(calls_.size());
  if (!out.calls.empty() && out.calls.back().index == index && !out.calls.back().first) {
    out.calls.back().arguments += piece;
  } else {
    ToolCallDelta d;
    d.index = index;
    d.arguments = std::move(piece);
    out.calls.push_back(std::move(d));
  }
}

void ToolCallParser::finish_call(ToolParserOutput& out) {
  ScanState& s = scan_;
  const json j = json::parse(s.text, nullptr, false);
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string() || j["name"].get<std::string>().empty())
    return fail_call(out);
  std::string args = "{}";
  const json* a = j.contains("arguments") ? &j["arguments"] : j.contains("parameters") ? &j["parameters"] : nullptr;
  if (a && a->is_object()) {
    args = s.args_container && s.args_end != std::string::npos ? s.text.substr(s.args_start, s.args_end - s.args_start)
                                                               : a->dump();
  } else if (a && a->is_string()) {  // arguments already as a JSON string
    if (!json::parse(a->get<std::string>(), nullptr, false).is_object()) return fail_call(out);
    args = a->get<std::string>();
  } else if (a && !a->is_null()) {
    return fail_call(out);
  }
  ToolCall call;
  call.name = j["name"].get<std::string>();
  const int index = static_cast<int>(calls_.size());
  if (!s.started) {
    s.id = make_tool_call_id();
    ToolCallDelta d;
    d.index = index;
    d.first = true;
    d.id = s.id;
    d.name = call.name;
    out.calls.push_back(std::move(d));
    s.started = true;
  }
  stream_arguments(out);
  if (args.compare(0, s.sent, s.text, s.args_start == std::string::npos ? 0 : s.args_start, s.sent) == 0 &&
      args.size() > s.sent) {
    ToolCallDelta d;
    d.index = index;
    d.arguments = args.substr(s.sent);
    out.calls.push_back(std::move(d));
  }
  call.id = s.id;
  call.arguments = std::move(args);
  calls_.push_back(std::move(call));
  scan_ = ScanState{};
  raw_.clear();
  mode_ = Mode::AfterCall;
}

void ToolCallParser::fail_call(ToolParserOutput& out) {
  malformed_ = true;
  if (scan_.started) {
    broken_ = true;  // its first delta is out: nothing more of it is sent
  } else {
    out.content += pending_ws_ + raw_ + scan_.text;
  }
  pending_ws_.clear();
  scan_ = ScanState{};
  raw_.clear();
  in_list_ = false;
  skip_ws_ = false;
  mode_ = Mode::Content;
}

ParsedToolOutput parse_tool_output(ToolFormat format, std::string_view text) {
  ToolCallParser parser(format);
  ToolParserOutput a = parser.push(text);
  ToolParserOutput b = parser.finish();
  if (parser.malformed()) return {std::string(text), {}};
  return {a.content + b.content, parser.calls()};
}

}  // namespace tessera::api
