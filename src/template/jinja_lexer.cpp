#include "template/jinja_lexer.h"

#include <cstring>

#include "core/error.h"
#include "tokenizer/unicode.h"  // append_utf8

namespace tessera::jinja {

void fail_at(SourcePos pos, const std::string& message) { throw TemplateError(pos, message); }

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || static_cast<unsigned char>(c) >= 0x80;
}
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& options) : opt_(options) {
    // jinja2 turns \r\n, \r and \n into \n and drops one trailing newline unless told not to.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_.push_back('\n');
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_.push_back(source[i]);
      }
    }
    if (!opt_.keep_trailing_newline && !src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_data(pos_, src_.size());
        break;
      }
      const char type = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
      size_t raw_body = 0;
      const bool raw = type == '%' && match_raw_begin(tag, raw_body);
      size_t text_end = strip_before(pos_, tag, sign, type != '{', line_starting);
      emit_data(pos_, text_end);
      const size_t after_open = tag + 2 + (sign ? 1 : 0);
      if (raw) {
        line_starting = lex_raw(raw_body);
      } else if (type == '#') {
        line_starting = lex_comment(tag, after_open);
      } else {
        line_starting = lex_tag(tag, after_open, type == '{');
      }
    }
    tokens_.push_back(Token{TokenKind::End, position(src_.size()), {}});
    return std::move(tokens_);
  }

 private:
  SourcePos position(size_t offset) {
    if (offset < cursor_off_) {
      cursor_off_ = 0;
      cursor_ = SourcePos{};
    }
    for (; cursor_off_ < offset; ++cursor_off_) {
      const char c = src_[cursor_off_];
      if (c == '\n') {
        ++cursor_.line;
        cursor_.column = 1;
      } else if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) {
        ++cursor_.column;  // columns count code points
      }
    }
    return cursor_;
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos && i + 1 < src_.size(); i = src_.find('{', i + 1)) {
      const char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
    }
    return std::string::npos;
  }

  // Where the data before a tag ends after `-` (strip all whitespace) or lstrip_blocks (strip
  // spaces and tabs back to the line start, block and comment tags only).
  size_t strip_before(size_t begin, size_t end, char sign, bool block_like, bool line_starting) const {
    if (sign == '-') {
      while (end > begin && is_space(src_[end - 1])) --end;
      return end;
    }
    if (sign == '+' || !opt_.lstrip_blocks || !block_like) return end;
    size_t line_begin = end;
    while (line_begin > begin && src_[line_begin - 1] != '\n') --line_begin;
    if (line_begin == begin && !line_starting) return end;
    for (size_t i = line_begin; i < end; ++i)
      if (!is_space(src_[i])) return end;
    return line_begin;
  }

  void emit_data(size_t begin, size_t end) {
    if (end > begin) tokens_.push_back(Token{TokenKind::Data, position(begin), src_.substr(begin, end - begin)});
    pos_ = std::max(pos_, end);
  }

  // After a closing `%}` / `#}`: `-` eats all following whitespace, trim_blocks one newline.
  // Returns whether what was consumed ends with a newline (jinja2's "line starting").
  bool finish_close(size_t close_end, char sign) {
    size_t p = close_end;
    if (sign == '-') {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (sign != '+' && opt_.trim_blocks && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    pos_ = p;
    return p > 0 && src_[p - 1] == '\n';
  }

  bool match_raw_begin(size_t tag, size_t& body) const {
    size_t p = tag + 2;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ++p;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      p += 3;
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (src_.compare(p, 2, "%}") == 0) {
      p += 2;
    } else {
      return false;
    }
    body = p;
    return true;
  }

  bool lex_raw(size_t body) {
    for (size_t tag = src_.find("{%", body); tag != std::string::npos; tag = src_.find("{%", tag + 1)) {
      size_t p = tag + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (sign) ++p;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) continue;
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      char close_sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) close_sign = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) continue;
      pos_ = body;
      emit_data(body, strip_before(body, tag, sign, true, false));
      return finish_close(p + 2, close_sign);
    }
    fail_at(position(body), "Missing end of raw directive");
  }

  bool lex_comment(size_t tag, size_t from) {
    const size_t end = src_.find("#}", from);
    if (end == std::string::npos) fail_at(position(tag), "Missing end of comment tag");
    const char sign = end > from && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    return finish_close(end + 2, sign);
  }

  bool lex_tag(size_t tag, size_t p, bool variable) {
    tokens_.push_back(Token{variable ? TokenKind::VarBegin : TokenKind::BlockBegin, position(tag), {}});
    std::vector<char> balance;
    const char close = variable ? '}' : '%';
    while (true) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size())
        fail_at(position(tag), variable ? "unexpected end of template, expected 'end of print statement'"
                                        : "unexpected end of template, expected 'end of statement block'");
      if (balance.empty()) {
        char sign = 0;
        size_t q = p;
        if (src_[q] == '-' || (src_[q] == '+' && !variable)) sign = src_[q++];
        if (src_.compare(q, 2, std::string{close, '}'}) == 0) {
          tokens_.push_back(Token{variable ? TokenKind::VarEnd : TokenKind::BlockEnd, position(p), {}});
          if (variable) {
            size_t e = q + 2;
            if (sign == '-')
              while (e < src_.size() && is_space(src_[e])) ++e;
            pos_ = e;
            return e > 0 && src_[e - 1] == '\n' && sign == '-';
          }
          return finish_close(q + 2, sign);
        }
      }
      p = lex_one(p, balance);
    }
  }

  size_t lex_one(size_t p, std::vector<char>& balance) {
    const SourcePos at = position(p);
    const char c = src_[p];
    if (is_digit(c)) return lex_number(p, at);
    if (is_name_start(c)) {
      size_t e = p;
      while (e < src_.size() && is_name_char(src_[e])) ++e;
      tokens_.push_back(Token{TokenKind::Name, at, src_.substr(p, e - p)});
      return e;
    }
    if (c == '\'' || c == '"') return lex_string(p, at);
    static const char* const kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[",
                                       "]",  "(",  ")",  "{",  "}",  ">",  "<", "=", ".", ":", "|", ",", ";"};
    for (const char* op : kOps) {
      const size_t len = std::strlen(op);
      if (src_.compare(p, len, op) != 0) continue;
      if (len == 1 && (c == '(' || c == '[' || c == '{')) {
        balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
      } else if (len == 1 && (c == ')' || c == ']' || c == '}')) {
        if (balance.empty()) fail_at(at, std::string("unexpected '") + c + "'");
        if (balance.back() != c) fail_at(at, std::string("unexpected '") + c + "', expected '" + balance.back() + "'");
        balance.pop_back();
      }
      tokens_.push_back(Token{TokenKind::Op, at, op});
      return p + len;
    }
    fail_at(at, std::string("unexpected char '") + c + "'");
  }

  size_t digits(size_t p, bool (*ok)(char)) const {
    // digits with single '_' separators between them
    while (p < src_.size() && (ok(src_[p]) || (src_[p] == '_' && p + 1 < src_.size() && ok(src_[p + 1])))) ++p;
    return p;
  }

  size_t lex_number(size_t p, SourcePos at) {
    auto clean = [](std::string s) {
      std::erase(s, '_');
      return s;
    };
    const char next = p + 1 < src_.size() ? static_cast<char>(src_[p + 1] | 0x20) : 0;
    if (src_[p] == '0' && (next == 'x' || next == 'o' || next == 'b')) {
      static bool (*const hex)(char) = [](char ch) {
        return is_digit(ch) || ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'f');
      };
      static bool (*const oct)(char) = [](char ch) { return ch >= '0' && ch <= '7'; };
      static bool (*const bin)(char) = [](char ch) { return ch == '0' || ch == '1'; };
      const int base = next == 'x' ? 16 : next == 'o' ? 8 : 2;
      size_t s = p + 2;
      if (s < src_.size() && src_[s] == '_') ++s;
      const size_t e = digits(s, base == 16 ? hex : base == 8 ? oct : bin);
      if (e == s) fail_at(at, "invalid integer literal");
      Token t{TokenKind::Int, at, src_.substr(p, e - p)};
      try {
        t.int_value = std::stoll(clean(src_.substr(s, e - s)), nullptr, base);
      } catch (const std::exception&) {
        fail_at(at, "integer literal too large");
      }
      tokens_.push_back(std::move(t));
      return e;
    }
    size_t e = digits(p, is_digit);
    bool is_float = false;
    if (e + 1 < src_.size() && src_[e] == '.' && is_digit(src_[e + 1])) {
      is_float = true;
      e = digits(e + 1, is_digit);
    }
    if (e < src_.size() && (src_[e] | 0x20) == 'e') {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && is_digit(src_[x])) {
        is_float = true;
        e = digits(x, is_digit);
      }
    }
    Token t{is_float ? TokenKind::Float : TokenKind::Int, at, src_.substr(p, e - p)};
    const std::string text = clean(t.text);
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      try {
        t.int_value = std::stoll(text);
      } catch (const std::exception&) {
        fail_at(at, "integer literal too large");
      }
    }
    tokens_.push_back(std::move(t));
    return e;
  }

  // Python's unicode-escape decoding of a quoted literal.
  size_t lex_string(size_t p, SourcePos at) {
    const char quote = src_[p];
    std::string out;
    size_t i = p + 1;
    while (true) {
      if (i >= src_.size()) fail_at(at, "unexpected end of string literal");
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) fail_at(at, "unexpected end of string literal");
      const char e = src_[i + 1];
      i += 2;
      auto hex_escape = [&](int n) {
        uint32_t cp = 0;
        for (int k = 0; k < n; ++k, ++i) {
          const char h = i < src_.size() ? static_cast<char>(src_[i] | 0x20) : 0;
          if (!(is_digit(h) || (h >= 'a' && h <= 'f')))
            fail_at(at, "truncated \\x, \\u or \\U escape in string literal");
          cp = cp * 16 + static_cast<uint32_t>(is_digit(h) ? h - '0' : h - 'a' + 10);
        }
        if (cp > 0x10FFFF) fail_at(at, "illegal Unicode character in string literal");
        append_utf8(out, cp);
      };
      switch (e) {
        case '\n':
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'x':
          hex_escape(2);
          break;
        case 'u':
          hex_escape(4);
          break;
        case 'U':
          hex_escape(8);
          break;
        case 'N':
          fail_at(at, "\\N{...} escapes are not supported");
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i)
              cp = cp * 8 + static_cast<uint32_t>(src_[i] - '0');
            append_utf8(out, cp);
          } else {
            out.push_back('\\');  // unknown escapes stay as written
            out.push_back(e);
          }
      }
    }
    tokens_.push_back(Token{TokenKind::String, at, std::move(out)});
    return i + 1;
  }

  LexerOptions opt_;
  std::string src_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
  size_t cursor_off_ = 0;
  SourcePos cursor_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  return Lexer(source, options).run();
}

}  // namespace tessera::jinja
