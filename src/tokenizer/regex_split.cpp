#include "tokenizer/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace tessera {

// ------------------------------------------------------------------------------------------
// PCRE2 wrapper

struct PcreRegex::Impl {
  pcre2_code* code = nullptr;
  bool utf = false;
  ~Impl() { pcre2_code_free(code); }
};

PcreRegex::PcreRegex(std::string_view pattern, Mode mode) : impl_(std::make_unique<Impl>()), pattern_(pattern) {
  uint32_t options = PCRE2_DOLLAR_ENDONLY;  // `$` only at the end, as in ECMAScript and Rust
  if (mode == Mode::Unicode) options |= PCRE2_UTF | PCRE2_UCP;
  if (mode == Mode::UnicodeAscii) options |= PCRE2_UTF;
  impl_->utf = mode != Mode::Bytes;
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  impl_->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err, &err_offset, nullptr);
  if (!impl_->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    fail("tokenizer: cannot compile regex '", pattern, "' at offset ", err_offset, ": ",
         reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation only: when it is unavailable the interpreter gives the same result.
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);
}

PcreRegex::~PcreRegex() = default;

std::vector<std::pair<size_t, size_t>> PcreRegex::find_all(std::string_view subject, size_t begin, size_t end) const {
  // The window is passed as its own subject, so `^`, `$` and lookarounds stop at its edges,
  // like std::regex_iterator over a sub-range.
  const auto* window = reinterpret_cast<PCRE2_SPTR>(subject.data() + begin);
  const size_t length = end - begin;
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(impl_->code, nullptr), &pcre2_match_data_free);
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> ctx(pcre2_match_context_create(nullptr),
                                                                                &pcre2_match_context_free);
  std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)> stack(
      pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr), &pcre2_jit_stack_free);
  if (stack) pcre2_jit_stack_assign(ctx.get(), nullptr, stack.get());
  // Megabyte-long runs must not hit the interpreter's default 20 MB backtracking heap.
  pcre2_set_heap_limit(ctx.get(), 4u * 1024 * 1024);  // KiB: 4 GiB
  std::vector<std::pair<size_t, size_t>> out;
  size_t pos = 0;
  while (pos <= length) {
    const int rc = pcre2_match(impl_->code, window, length, pos, PCRE2_NO_UTF_CHECK, md.get(), ctx.get());
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      fail("tokenizer: regex '", pattern_, "' failed: ", reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t s = ov[0], e = ov[1];
    if (e > s) {
      out.emplace_back(begin + s, begin + e);
      pos = e;
    } else {  // empty match: step over one character
      pos = e + 1;
      if (impl_->utf)
        while (pos < length && (window[pos] & 0xC0) == 0x80) ++pos;
    }
  }
  return out;
}

// ------------------------------------------------------------------------------------------
// llama.cpp's hand-written matchers. They work on code points inside one piece [ini, end) and
// append the lengths of the words they cut.

namespace {

constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

struct Flags {
  bool any = false;  // false only past the piece's end (llama.cpp's "no flags")
  bool number = false, letter = false, mark = false, whitespace = false;
};

class Piece {
 public:
  Piece(const std::vector<uint32_t>& cps, size_t ini, size_t end) : cps_(cps), ini_(ini), end_(end) {}
  uint32_t cpt(size_t pos) const { return pos >= ini_ && pos < end_ ? cps_[pos] : kOutOfRange; }
  Flags flags(size_t pos) const {
    Flags f;
    if (pos < ini_ || pos >= end_) return f;
    const uint32_t cp = cps_[pos];
    const UnicodeClass c = unicode_class(cp);
    f.any = true;
    f.number = c == UnicodeClass::Number;
    f.letter = c == UnicodeClass::Letter;
    f.mark = c == UnicodeClass::Mark;
    f.whitespace = unicode_is_whitespace(cp);
    return f;
  }

 private:
  const std::vector<uint32_t>& cps_;
  size_t ini_, end_;
};

// Emits the word [prev, end) when non-empty; returns its length.
struct WordSink {
  std::vector<size_t>& out;
  size_t prev;
  size_t add(size_t end) {
    const size_t len = end - prev;
    if (len > 0) out.push_back(len);
    prev = end;
    return len;
  }
};

uint32_t ascii_lower(uint32_t cp) { return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp; }

// 's 't 're 've 'm 'll 'd at `pos`: length of the contraction (2 or 3), or 0.
size_t contraction_length(const Piece& p, size_t pos, size_t end, bool ignore_case) {
  if (p.cpt(pos) != '\'' || pos + 1 >= end) return 0;
  const auto low = [&](size_t i) { return ignore_case ? ascii_lower(p.cpt(i)) : p.cpt(i); };
  const uint32_t a = low(pos + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 < end) {
    const uint32_t b = low(pos + 2);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(const std::vector<uint32_t>& cps, size_t ini, size_t end, std::vector<size_t>& out) {
  const Piece p(cps, ini, end);
  WordSink sink{out, ini};
  for (size_t pos = ini; pos < end;) {
    const uint32_t cpt = p.cpt(pos);
    if (const size_t n = contraction_length(p, pos, end, false)) {
      pos += sink.add(pos + n);
      continue;
    }
    const Flags f2 = cpt == ' ' ? p.flags(pos + 1) : p.flags(pos);
    if (f2.letter) {
      pos += cpt == ' ';
      while (p.flags(pos).letter) ++pos;
      sink.add(pos);
      continue;
    }
    if (f2.number) {
      pos += cpt == ' ';
      while (p.flags(pos).number) ++pos;
      sink.add(pos);
      continue;
    }
    const auto other = [](const Flags& f) { return f.any && !(f.whitespace || f.letter || f.number); };
    if (other(f2)) {
      pos += cpt == ' ';
      while (other(p.flags(pos))) ++pos;
      sink.add(pos);
      continue;
    }
    size_t n_ws = 0;
    while (p.flags(pos + n_ws).whitespace) ++n_ws;
    if (n_ws > 1 && p.cpt(pos + n_ws) != kOutOfRange) {  // \s+(?!\S): leave one for the next word
      pos += n_ws - 1;
      sink.add(pos);
      continue;
    }
    if (n_ws > 0) {
      pos += n_ws;
      sink.add(pos);
      continue;
    }
    sink.add(++pos);
  }
}

// Llama-3 family:
// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// Qwen2 takes \p{N} one at a time; Qwen3.5 also lets letter runs take marks (\p{M}).
struct Llama3Style {
  size_t max_digits;
  bool marks_are_letters;
};

void split_llama3_style(const std::vector<uint32_t>& cps, size_t ini, size_t end, Llama3Style style,
                        std::vector<size_t>& out) {
  const Piece p(cps, ini, end);
  WordSink sink{out, ini};
  const auto wordish = [&](const Flags& f) { return f.letter || (style.marks_are_letters && f.mark); };
  for (size_t pos = ini; pos < end;) {
    const uint32_t cpt = p.cpt(pos);
    const Flags flags = p.flags(pos);
    if (const size_t n = contraction_length(p, pos, end, true)) {
      pos += sink.add(pos + n);
      continue;
    }
    if (!(cpt == '\r' || cpt == '\n' || flags.number)) {
      if (wordish(flags) || wordish(p.flags(pos + 1))) {  // one optional lead, then letters
        ++pos;
        while (wordish(p.flags(pos))) ++pos;
        sink.add(pos);
        continue;
      }
    }
    if (flags.number) {
      size_t group_start = pos;
      while (p.flags(pos).number) {
        if (++pos - group_start >= style.max_digits) {
          sink.add(pos);
          group_start = pos;
        }
      }
      sink.add(pos);
      continue;
    }
    const Flags f2 = cpt == ' ' ? p.flags(pos + 1) : flags;
    const auto other = [&](const Flags& f) { return !(f.whitespace || wordish(f) || f.number); };
    // llama.cpp tests the *current* code point's flags here, so a lone trailing space
    // becomes a word of its own through this branch.
    if (other(f2) && flags.any) {
      pos += cpt == ' ';
      while (other(p.flags(pos)) && p.flags(pos).any) ++pos;
      while (p.cpt(pos) == '\r' || p.cpt(pos) == '\n') ++pos;
      sink.add(pos);
      continue;
    }
    size_t n_ws = 0, last_newline_end = 0;
    while (p.flags(pos + n_ws).whitespace) {
      const uint32_t c = p.cpt(pos + n_ws);
      if (c == '\r' || c == '\n') last_newline_end = pos + n_ws + 1;
      ++n_ws;
    }
    if (last_newline_end > 0) {  // \s*[\r\n]+
      pos = last_newline_end;
      sink.add(pos);
      continue;
    }
    if (n_ws > 1 && p.cpt(pos + n_ws) != kOutOfRange) {
      pos += n_ws - 1;
      sink.add(pos);
      continue;
    }
    if (n_ws > 0) {
      pos += n_ws;
      sink.add(pos);
      continue;
    }
    sink.add(++pos);
  }
}

const char* const kGpt2Regex = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
const char* const kLlama3RegexOriginal =
    R"re((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kLlama3Regex =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kQwen2Regex =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const kQwen35Regex =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

// The category escapes llama.cpp collapses, and the byte each collapses to.
struct CategoryEscape {
  const char* escape;
  UnicodeClass cls;
};
constexpr CategoryEscape kCategoryEscapes[] = {
    {"\\p{N}", UnicodeClass::Number},  {"\\p{L}", UnicodeClass::Letter},  {"\\p{P}", UnicodeClass::Punctuation},
    {"\\p{M}", UnicodeClass::Mark},    {"\\p{S}", UnicodeClass::Symbol},  {"\\p{Lu}", UnicodeClass::Letter},
    {"\\p{Ll}", UnicodeClass::Letter}, {"\\p{Lt}", UnicodeClass::Letter}, {"\\p{Lm}", UnicodeClass::Letter},
    {"\\p{Lo}", UnicodeClass::Letter},
};

char collapsed_byte(UnicodeClass c) {
  switch (c) {
    case UnicodeClass::Number:
      return static_cast<char>(0xD1);
    case UnicodeClass::Letter:
      return static_cast<char>(0xD2);
    case UnicodeClass::Punctuation:
      return static_cast<char>(0xD3);
    case UnicodeClass::Mark:
      return static_cast<char>(0xD4);
    case UnicodeClass::Symbol:
      return static_cast<char>(0xD5);
    default:
      return static_cast<char>(0xD0);
  }
}

// The ASCII members of each class, spelled for a character class.
const char* ascii_members(UnicodeClass c) {
  switch (c) {
    case UnicodeClass::Number:
      return "0-9";
    case UnicodeClass::Letter:
      return "A-Za-z";
    case UnicodeClass::Punctuation:
      return "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}";
    case UnicodeClass::Symbol:
      return "\\$\\+<->^`\\|\\~";
    default:
      return "";
  }
}

bool uses_categories(std::string_view regex) {
  for (const auto& e : kCategoryEscapes)
    if (regex.find(e.escape) != std::string_view::npos) return true;
  return false;
}

// Rewrites \p{..} into classes over the collapsed alphabet (llama.cpp's translation).
std::string collapse_regex(std::string_view regex) {
  std::string out;
  bool inside = false;
  for (size_t i = 0; i < regex.size(); ++i) {
    if (regex[i] == '[' && (i == 0 || regex[i - 1] != '\\')) {
      out += '[';
      inside = true;
      continue;
    }
    if (inside && regex[i] == ']' && regex[i - 1] != '\\') {
      out += ']';
      inside = false;
      continue;
    }
    if (regex[i] == '\\' && i + 3 < regex.size() && regex[i + 1] == 'p' && regex[i + 2] == '{') {
      const size_t close = regex.find('}', i + 3);
      if (close != std::string_view::npos && close <= i + 10) {
        const std::string_view esc = regex.substr(i, close - i + 1);
        const auto* hit = std::find_if(std::begin(kCategoryEscapes), std::end(kCategoryEscapes),
                                       [&](const CategoryEscape& e) { return esc == e.escape; });
        if (hit != std::end(kCategoryEscapes)) {
          if (!inside) out += '[';
          out += collapsed_byte(hit->cls);
          out += ascii_members(hit->cls);
          if (!inside) out += ']';
          i = close;
          continue;
        }
      }
    }
    out += regex[i];
  }
  return out;
}

}  // namespace

struct LlamaSplitter::Step {
  enum class Kind { Gpt2, Llama3, Qwen2, Qwen35, Collapsed, Wide } kind;
  std::unique_ptr<PcreRegex> regex;
};

LlamaSplitter::LlamaSplitter(std::vector<std::string> regexes) {
  for (const auto& r : regexes) {
    auto step = std::make_unique<Step>();
    if (r == kGpt2Regex) {
      step->kind = Step::Kind::Gpt2;
    } else if (r == kLlama3Regex || r == kLlama3RegexOriginal) {
      step->kind = Step::Kind::Llama3;
    } else if (r == kQwen2Regex) {
      step->kind = Step::Kind::Qwen2;
    } else if (r == kQwen35Regex) {
      step->kind = Step::Kind::Qwen35;
    } else if (uses_categories(r)) {
      for (unsigned char c : r)
        if (c >= 0x80) fail("tokenizer: regex mixes Unicode categories and non-ASCII characters: ", r);
      step->kind = Step::Kind::Collapsed;
      step->regex = std::make_unique<PcreRegex>(collapse_regex(r), PcreRegex::Mode::Bytes);
    } else {
      step->kind = Step::Kind::Wide;
      step->regex = std::make_unique<PcreRegex>(r, PcreRegex::Mode::UnicodeAscii);
    }
    need_collapse_ = need_collapse_ || uses_categories(r);
    steps_.push_back(std::move(step));
  }
}

LlamaSplitter::~LlamaSplitter() = default;

std::vector<size_t> LlamaSplitter::split_lengths(const std::vector<uint32_t>& cps) const {
  std::vector<size_t> lengths{cps.size()};
  if (cps.empty()) return {};
  // One byte per code point: ASCII stays, other code points become their class's byte.
  std::string collapsed;
  if (need_collapse_) {
    collapsed.resize(cps.size());
    for (size_t i = 0; i < cps.size(); ++i) {
      const uint32_t cp = cps[i];
      if (cp < 128)
        collapsed[i] = static_cast<char>(cp);
      else if (unicode_is_whitespace(cp))
        collapsed[i] = '\v';
      else
        collapsed[i] = collapsed_byte(unicode_class(cp));
    }
  }
  // UTF-8 text for std::wregex-style patterns: non-ASCII whitespace folds to \v (std::wregex's
  // \s is ASCII-only) and non-scalar values (surrogates) to U+FFFF, which no supported
  // pattern can match either; byte_of[i] is the offset of code point i.
  std::string wide;
  std::vector<size_t> byte_of;
  const auto build_wide = [&] {
    byte_of.resize(cps.size() + 1);
    for (size_t i = 0; i < cps.size(); ++i) {
      byte_of[i] = wide.size();
      uint32_t cp = cps[i];
      if (cp >= 128 && unicode_is_whitespace(cp)) cp = '\v';
      if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFF;
      append_utf8(wide, cp);
    }
    byte_of[cps.size()] = wide.size();
  };

  for (const auto& step : steps_) {
    std::vector<size_t> next;
    next.reserve(lengths.size());
    size_t start = 0;
    for (const size_t len : lengths) {
      const size_t ini = start, end = start + len;
      start = end;
      switch (step->kind) {
        case Step::Kind::Gpt2:
          split_gpt2(cps, ini, end, next);
          break;
        case Step::Kind::Llama3:
          split_llama3_style(cps, ini, end, {3, false}, next);
          break;
        case Step::Kind::Qwen2:
          split_llama3_style(cps, ini, end, {1, false}, next);
          break;
        case Step::Kind::Qwen35:
          split_llama3_style(cps, ini, end, {1, true}, next);
          break;
        case Step::Kind::Collapsed:
        case Step::Kind::Wide: {
          const bool is_wide = step->kind == Step::Kind::Wide;
          if (is_wide && byte_of.empty()) build_wide();
          const auto to_cp = [&](size_t off) {
            if (!is_wide) return off;
            return static_cast<size_t>(std::lower_bound(byte_of.begin(), byte_of.end(), off) - byte_of.begin());
          };
          const auto matches = is_wide ? step->regex->find_all(wide, byte_of[ini], byte_of[end])
                                       : step->regex->find_all(collapsed, ini, end);
          size_t prev = ini;
          for (const auto& [s_off, e_off] : matches) {
            const size_t s = to_cp(s_off), e = to_cp(e_off);
            if (s > prev) next.push_back(s - prev);
            next.push_back(e - s);
            prev = e;
          }
          if (prev < end) next.push_back(end - prev);
          break;
        }
      }
    }
    lengths = std::move(next);
  }
  return lengths;
}

std::vector<std::string> LlamaSplitter::split(std::string_view text, bool byte_encode) const {
  const std::vector<uint32_t> cps = decode_utf8_lenient(text);
  const std::vector<size_t> lengths = split_lengths(cps);
  std::vector<std::string> words;
  words.reserve(lengths.size());
  size_t start = 0;
  std::string utf8;
  for (const size_t len : lengths) {
    utf8.clear();
    for (size_t i = start; i < start + len; ++i) append_utf8(utf8, cps[i]);
    start += len;
    if (!byte_encode) {
      words.push_back(utf8);
      continue;
    }
    std::string encoded;
    encoded.reserve(utf8.size() * 2);
    for (unsigned char b : utf8) append_utf8(encoded, byte_to_unicode(b));
    words.push_back(std::move(encoded));
  }
  return words;
}

}  // namespace tessera
