#include "template/jinja_strings.h"

#include <algorithm>

#include "core/error.h"
#include "template/jinja_value.h"

namespace tessera::jinja::pystr {

namespace {

uint32_t code_point(std::string_view ch) {
  const auto c = static_cast<unsigned char>(ch[0]);
  if (ch.size() == 1) return c;
  uint32_t cp = ch.size() == 2 ? (c & 0x1F) : ch.size() == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < ch.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(ch[k]) & 0x3F);
  return cp;
}

bool is_ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
char to_upper(char c) { return c >= 'a' && c <= 'z' ? static_cast<char>(c - 32) : c; }
char to_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

}  // namespace

bool is_space(std::string_view ch) {
  const uint32_t cp = code_point(ch);
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  const auto cs = utf8_chars(s);
  std::vector<std::string_view> set;
  if (chars) set = utf8_chars(*chars);
  auto strippable = [&](std::string_view ch) {
    return chars ? std::find(set.begin(), set.end(), ch) != set.end() : is_space(ch);
  };
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strippable(cs[b])) ++b;
  if (right)
    while (e > b && strippable(cs[e - 1])) --e;
  if (b == e) return {};
  return std::string(cs[b].data(), static_cast<size_t>(cs[e - 1].data() + cs[e - 1].size() - cs[b].data()));
}

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right) {
  std::vector<std::string> out;
  if (maxsplit < 0) maxsplit = INT64_MAX;
  if (sep) {
    TESSERA_CHECK(!sep->empty(), "empty separator");
    if (!from_right) {
      size_t pos = 0;
      for (int64_t n = 0; n < maxsplit; ++n) {
        const size_t hit = s.find(*sep, pos);
        if (hit == std::string_view::npos) break;
        out.emplace_back(s.substr(pos, hit - pos));
        pos = hit + sep->size();
      }
      out.emplace_back(s.substr(pos));
    } else {
      size_t end = s.size();
      for (int64_t n = 0; n < maxsplit && end >= sep->size(); ++n) {
        const size_t hit = s.rfind(*sep, end - sep->size());
        if (hit == std::string_view::npos) break;
        out.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
        end = hit;
      }
      out.emplace_back(s.substr(0, end));
      std::reverse(out.begin(), out.end());
    }
    return out;
  }
  // Runs of whitespace separate words; leading/trailing whitespace gives no empty words.
  auto cs = utf8_chars(s);
  if (from_right) std::reverse(cs.begin(), cs.end());
  std::vector<std::pair<size_t, size_t>> words;  // [first, last] char indexes
  size_t i = 0;
  int64_t splits = 0;
  while (i < cs.size()) {
    while (i < cs.size() && is_space(cs[i])) ++i;
    if (i == cs.size()) break;
    if (splits == maxsplit) {
      words.emplace_back(i, cs.size() - 1);  // the rest, trailing whitespace included
      break;
    }
    const size_t start = i;
    while (i < cs.size() && !is_space(cs[i])) ++i;
    words.emplace_back(start, i - 1);
    ++splits;
  }
  for (auto [a, b] : words) {
    if (from_right) std::swap(a, b);
    out.emplace_back(cs[a].data(), static_cast<size_t>(cs[b].data() + cs[b].size() - cs[a].data()));
  }
  if (from_right) std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> splitlines(std::string_view s, bool keepends) {
  std::vector<std::string> out;
  const auto cs = utf8_chars(s);
  std::string line;
  for (size_t i = 0; i < cs.size(); ++i) {
    const uint32_t cp = code_point(cs[i]);
    const bool brk = cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1E) || cp == 0x85 ||
                     cp == 0x2028 || cp == 0x2029;
    if (!brk) {
      line += cs[i];
      continue;
    }
    std::string end(cs[i]);
    if (cp == '\r' && i + 1 < cs.size() && cs[i + 1] == "\n") {
      end += "\n";
      ++i;
    }
    out.push_back(keepends ? line + end : line);
    line.clear();
  }
  if (!line.empty()) out.push_back(line);
  return out;
}

std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count) {
  if (count < 0) count = INT64_MAX;
  std::string out;
  if (old.empty()) {  // Python inserts between every character and at both ends
    const auto cs = utf8_chars(s);
    int64_t n = 0;
    for (size_t i = 0; i <= cs.size(); ++i) {
      if (n < count) {
        out += repl;
        ++n;
      }
      if (i < cs.size()) out += cs[i];
    }
    return out;
  }
  size_t pos = 0;
  for (int64_t n = 0; n < count; ++n) {
    const size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(repl);
    pos = hit + old.size();
  }
  out.append(s.substr(pos));
  return out;
}

std::string upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_upper(c);
  return out;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = to_lower(c);
  return out;
}

std::string capitalize(std::string_view s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = to_upper(out[0]);
  return out;
}

std::string title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    const bool cased = is_ascii_alpha(c);
    c = cased ? (prev_cased ? to_lower(c) : to_upper(c)) : c;
    prev_cased = cased;
  }
  return out;
}

}  // namespace tessera::jinja::pystr
