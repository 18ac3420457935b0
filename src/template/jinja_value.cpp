#include "template/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/error.h"

namespace tessera::jinja {

namespace {

uint32_t check_depth(uint32_t depth) {
  TESSERA_CHECK(depth <= kMaxValueDepth, "value nested deeper than ", kMaxValueDepth, " levels");
  return depth;
}

// Decodes one UTF-8 sequence at s[i]; ill-formed bytes come back one at a time as themselves.
uint32_t decode_utf8(std::string_view s, size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
  if (len == 0 || i + len > s.size()) return s[i++] & 0xFFu;
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) {
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc >> 6) != 2) return s[i++] & 0xFFu;
    cp = (cp << 6) | (cc & 0x3F);
  }
  i += len;
  return cp;
}

// Code points Python's repr() escapes beyond ASCII controls (an approximation of
// str.isprintable: the separators, format characters, surrogates and private use).
bool unicode_printable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp >= 0x80 && cp <= 0xA0) return false;
  if (cp == 0xAD || cp == 0x1680 || cp == 0x180E || cp == 0x3000 || cp == 0xFEFF) return false;
  if ((cp >= 0x2000 && cp <= 0x200F) || (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x206F)) return false;
  if ((cp >= 0xD800 && cp <= 0xF8FF) || (cp >= 0xFFF9 && cp <= 0xFFFB) || cp >= 0xF0000) return false;
  return true;
}

void append_hex(std::string& out, const char* prefix, uint32_t v, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%s%0*x", prefix, digits, v);
  out += buf;
}

void dump_json_string(std::string& out, std::string_view s, const JsonDumpOptions& o) {
  out.push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80 && o.ensure_ascii) {
      const uint32_t cp = decode_utf8(s, i);
      if (cp >= 0x10000) {
        append_hex(out, "\\u", 0xD800 + ((cp - 0x10000) >> 10), 4);
        append_hex(out, "\\u", 0xDC00 + ((cp - 0x10000) & 0x3FF), 4);
      } else {
        append_hex(out, "\\u", cp, 4);
      }
      continue;
    }
    ++i;
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20)
          append_hex(out, "\\u", c, 4);
        else if (o.html_safe && (c == '<' || c == '>' || c == '&' || c == '\''))
          append_hex(out, "\\u", c, 4);
        else
          out.push_back(static_cast<char>(c));
    }
  }
  out.push_back('"');
}

std::string json_float(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return format_float(d);
}

void dump_json(std::string& out, const Value& v, const JsonDumpOptions& o, int level) {
  auto newline = [&](int lvl) {
    out.push_back('\n');
    out.append(static_cast<size_t>(o.indent) * static_cast<size_t>(lvl), ' ');
  };
  switch (v.kind()) {
    case Kind::None:
      out += "null";
      return;
    case Kind::Bool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Kind::Float:
      out += json_float(v.as_double());
      return;
    case Kind::String:
      dump_json_string(out, v.as_string(), o);
      return;
    case Kind::List: {
      const auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out.push_back('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        if (o.indent >= 0) newline(level + 1);
        dump_json(out, items[i], o, level + 1);
      }
      if (o.indent >= 0) newline(level);
      out.push_back(']');
      return;
    }
    case Kind::Dict: {
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.as_dict().items) items.push_back(&kv);
      if (items.empty()) {
        out += "{}";
        return;
      }
      auto key_text = [](const Value& k) -> std::string {
        switch (k.kind()) {
          case Kind::String:
            return k.as_string();
          case Kind::Int:
            return std::to_string(k.as_int());
          case Kind::Float:
            return json_float(k.as_double());
          case Kind::Bool:
            return k.as_bool() ? "true" : "false";
          case Kind::None:
            return "null";
          default:
            fail("keys must be str, int, float, bool or None, not ", k.type_name());
        }
      };
      if (o.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return py_less(a->first, b->first); });
      out.push_back('{');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_sep;
        if (o.indent >= 0) newline(level + 1);
        dump_json_string(out, key_text(items[i]->first), o);
        out += o.key_sep;
        dump_json(out, items[i]->second, o, level + 1);
      }
      if (o.indent >= 0) newline(level);
      out.push_back('}');
      return;
    }
    case Kind::Undefined:
      fail("Object of type Undefined is not JSON serializable");
    default:
      fail("Object of type ", v.type_name(), " is not JSON serializable");
  }
}

void append_repr(std::string& out, const Value& v);

void append_str(std::string& out, const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return;
    case Kind::None:
      out += "None";
      return;
    case Kind::Bool:
      out += v.as_bool() ? "True" : "False";
      return;
    case Kind::Int:
      out += std::to_string(v.as_int());
      return;
    case Kind::Float:
      out += format_float(v.as_double());
      return;
    case Kind::String:
      out += v.as_string();
      return;
    case Kind::List: {
      const auto& l = v.as_list();
      out.push_back(l.is_tuple ? '(' : '[');
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i) out += ", ";
        append_repr(out, l.items[i]);
      }
      if (l.is_tuple && l.items.size() == 1) out.push_back(',');
      out.push_back(l.is_tuple ? ')' : ']');
      return;
    }
    case Kind::Dict: {
      out.push_back('{');
      bool first = true;
      for (const auto& [k, val] : v.as_dict().items) {
        if (!first) out += ", ";
        first = false;
        append_repr(out, k);
        out += ": ";
        append_repr(out, val);
      }
      out.push_back('}');
      return;
    }
    case Kind::Namespace: {
      out += "<Namespace {";
      bool first = true;
      for (const auto& [k, val] : v.as_namespace().attrs) {
        if (!first) out += ", ";
        first = false;
        out += repr_string(k) + ": ";
        append_repr(out, val);
      }
      out += "}>";
      return;
    }
    case Kind::Callable:
      out += "<function " + v.as_callable().name + ">";
      return;
  }
}

void append_repr(std::string& out, const Value& v) {
  if (v.is_string())
    out += repr_string(v.as_string());
  else if (v.is_undefined())
    out += "Undefined";
  else
    append_str(out, v);
}

}  // namespace

const Value* Dict::find(const Value& key) const {
  for (const auto& kv : items)
    if (py_equal(kv.first, key)) return &kv.second;
  return nullptr;
}

const Value* Dict::find(std::string_view key) const {
  for (const auto& kv : items)
    if (kv.first.is_string() && kv.first.as_string() == key) return &kv.second;
  return nullptr;
}

void Dict::set(Value key, Value value) {
  depth = std::max(depth, check_depth(value.depth() + 1));
  for (auto& kv : items)
    if (py_equal(kv.first, key)) {
      kv.second = std::move(value);
      return;
    }
  items.emplace_back(std::move(key), std::move(value));
}

const Value* CallArgs::kwarg(std::string_view name) const {
  for (const auto& [k, v] : kwargs)
    if (k == name) return &v;
  return nullptr;
}

Value Value::trusted_string(std::string s, bool safe) {
  TrustSpans spans;
  if (!s.empty()) spans.emplace_back(0, s.size());
  return with_spans(std::move(s), std::move(spans), safe);
}

Value Value::with_spans(std::string s, TrustSpans spans, bool safe) {
  Value v(std::move(s), safe);
  if (!spans.empty()) std::get<Str>(v.v_).trusted = std::make_shared<const TrustSpans>(std::move(spans));
  return v;
}

bool Value::fully_trusted() const {
  if (!is_string()) return false;
  const size_t n = as_string().size();
  if (n == 0) return true;
  const TrustSpans* t = trust_spans();
  return t && t->size() == 1 && (*t)[0].first == 0 && (*t)[0].second == n;
}

void append_spans(TrustSpans& dst, size_t offset, const TrustSpans* src) {
  if (!src) return;
  for (const auto& [b, e] : *src) {
    if (b == e) continue;
    if (!dst.empty() && dst.back().second == b + offset)
      dst.back().second = e + offset;
    else
      dst.emplace_back(b + offset, e + offset);
  }
}

Value concat_strings(const Value& a, const Value& b) {
  const std::string& x = a.as_string();
  TrustSpans spans;
  append_spans(spans, 0, a.trust_spans());
  append_spans(spans, x.size(), b.trust_spans());
  return Value::with_spans(x + b.as_string(), std::move(spans));
}

void append_text(std::string& out, TrustSpans& spans, const Value& piece) {
  if (!piece.is_string()) {
    out += to_str(piece);
    return;
  }
  append_spans(spans, out.size(), piece.trust_spans());
  out += piece.as_string();
}

bool trusted_input(const Value& v) {
  switch (v.kind()) {
    case Kind::String:
      return v.fully_trusted();
    case Kind::Undefined:
    case Kind::None:
    case Kind::Bool:
    case Kind::Int:
    case Kind::Float:
      return true;
    default:
      return false;
  }
}

Value mark_trusted(const Value& v) {
  if (v.is_string()) return v.fully_trusted() ? v : Value::trusted_string(v.as_string(), v.is_safe());
  if (!v.is_list()) return v;
  std::vector<Value> items;
  items.reserve(v.as_list().items.size());
  for (const Value& item : v.as_list().items) items.push_back(mark_trusted(item));
  return Value::list(std::move(items), v.as_list().is_tuple);
}

Value Value::list(std::vector<Value> items, bool tuple) {
  auto l = std::make_shared<List>();
  uint32_t depth = 1;
  for (const auto& item : items) depth = std::max(depth, item.depth() + 1);
  l->depth = check_depth(depth);
  l->items = std::move(items);
  l->is_tuple = tuple;
  return Value(ListPtr(std::move(l)));
}

Value Value::dict(Dict d) {
  uint32_t depth = 1;
  for (const auto& kv : d.items) depth = std::max(depth, kv.second.depth() + 1);
  d.depth = check_depth(depth);
  return Value(DictPtr(std::make_shared<const Dict>(std::move(d))));
}

Value Value::function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn) {
  return Value(CallablePtr(std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)})));
}

const std::string& Value::undefined_hint() const {
  static const std::string none;
  const auto& u = std::get<Undefined>(v_);
  return u.hint ? *u.hint : none;
}

uint32_t Value::depth() const {
  if (is_list()) return as_list().depth;
  if (is_dict()) return as_dict().depth;
  return 0;
}

bool Value::truthy() const {
  switch (kind()) {
    case Kind::Undefined:
    case Kind::None:
      return false;
    case Kind::Bool:
      return as_bool();
    case Kind::Int:
      return as_int() != 0;
    case Kind::Float:
      return as_double() != 0.0;
    case Kind::String:
      return !as_string().empty();
    case Kind::List:
      return !as_list().items.empty();
    case Kind::Dict:
      return !as_dict().items.empty();
    default:
      return true;
  }
}

std::string Value::type_name() const {
  switch (kind()) {
    case Kind::Undefined:
      return "Undefined";
    case Kind::None:
      return "NoneType";
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "int";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "str";
    case Kind::List:
      return as_list().is_tuple ? "tuple" : "list";
    case Kind::Dict:
      return "dict";
    case Kind::Namespace:
      return "Namespace";
    case Kind::Callable:
      return "function";
  }
  return "?";
}

bool py_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Kind::Undefined:
    case Kind::None:
      return true;
    case Kind::String:
      return a.as_string() == b.as_string();
    case Kind::List: {
      const auto &x = a.as_list(), &y = b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!py_equal(x.items[i], y.items[i])) return false;
      return true;
    }
    case Kind::Dict: {
      const auto &x = a.as_dict(), &y = b.as_dict();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.find(k);
        if (!other || !py_equal(v, *other)) return false;
      }
      return true;
    }
    case Kind::Namespace:
      return &a.as_namespace() == &b.as_namespace();
    case Kind::Callable:
      return &a.as_callable() == &b.as_callable();
    default:
      return false;
  }
}

bool py_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 keeps code point order
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto &x = a.as_list().items, &y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (py_equal(x[i], y[i])) continue;
      return py_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  fail("'<' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
}

std::string to_str(const Value& v) {
  if (v.is_string()) return v.as_string();
  std::string out;
  append_str(out, v);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  append_repr(out, v);
  return out;
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);  // "-1.2345e+02": shortest digits that round-trip
  std::string out;
  size_t p = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    p = 1;
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = p; i < e_pos; ++i)
    if (sci[i] != '.') digits.push_back(sci[i]);
  const int exp = std::stoi(sci.substr(e_pos + 1));
  if (exp >= -5 + 1 && exp < 16) {
    const int decpt = exp + 1;  // digits before the decimal point
    if (decpt <= 0) {
      out += "0." + std::string(static_cast<size_t>(-decpt), '0') + digits;
    } else if (static_cast<size_t>(decpt) >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(decpt) - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(decpt)) + "." + digits.substr(static_cast<size_t>(decpt));
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) {
    out.push_back('.');
    out.append(digits, 1);
  }
  char ebuf[16];
  std::snprintf(ebuf, sizeof ebuf, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return out + ebuf;
}

std::string repr_string(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const uint32_t cp = decode_utf8(s, i);
    if (cp == '\\')
      out += "\\\\";
    else if (cp == static_cast<uint32_t>(quote))
      (out += '\\') += quote;
    else if (cp == '\n')
      out += "\\n";
    else if (cp == '\r')
      out += "\\r";
    else if (cp == '\t')
      out += "\\t";
    else if (unicode_printable(cp))
      out.append(s.substr(start, i - start));
    else if (cp < 0x100)
      append_hex(out, "\\x", cp, 2);
    else if (cp < 0x10000)
      append_hex(out, "\\u", cp, 4);
    else
      append_hex(out, "\\U", cp, 8);
  }
  out.push_back(quote);
  return out;
}

std::string to_json(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  dump_json(out, v, options, 0);
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size();) {
    decode_utf8(s, i);
    ++n;
  }
  return n;
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    decode_utf8(s, i);
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

}  // namespace tessera::jinja
