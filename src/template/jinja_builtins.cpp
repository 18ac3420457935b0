// Filters, tests, attribute/item access, string and dict methods, and globals, with jinja2's
// semantics (and HF's tojson / raise_exception / strftime_now when options.hf_extensions).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <set>

#include "core/error.h"
#include "template/jinja_interp.h"
#include "template/jinja_strings.h"

namespace tessera::jinja {

namespace {

// Argument `pos` given positionally or as `name`; `def` when absent.
Value param(const CallArgs& a, size_t pos, const char* name, Value def = Value()) {
  if (pos < a.args.size()) return a.args[pos];
  if (const Value* v = a.kwarg(name)) return *v;
  return def;
}

std::optional<std::string> opt_string(const Value& v) {
  if (v.is_undefined() || v.is_none()) return std::nullopt;
  return to_str(v);
}

int64_t need_int(const Value& v, const char* what) {
  if (!v.is_number() || v.is_float()) fail(what, " must be an integer, not ", v.type_name());
  return v.as_int();
}

std::string type_object(const Value& v) { return v.is_none() ? "None" : v.type_name() + " object"; }

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined("'" + type_object(obj) + "' has no attribute '" + name + "'");
}

Value unsafe(const Value& obj, const std::string& name) {
  return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
}

Value method(const Value& self, const std::string& name, Value (*fn)(Interpreter&, const Value&, CallArgs&)) {
  return Value::function(self.type_name() + "." + name,
                         [self, fn](Interpreter& in, CallArgs& a) { return fn(in, self, a); });
}

std::vector<Value> strings_to_values(const std::vector<std::string>& parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.emplace_back(p);
  return out;
}

Value str_method(Interpreter& in, const Value& self, const std::string& name) {
  using Fn = Value (*)(Interpreter&, const Value&, CallArgs&);
  static const std::vector<std::pair<std::string, Fn>> methods = {
      {"strip",
       [](Interpreter&, const Value& s, CallArgs& a) {
         return Value(pystr::strip(s.as_string(), opt_string(param(a, 0, "chars")), true, true));
       }},
      {"lstrip",
       [](Interpreter&, const Value& s, CallArgs& a) {
         return Value(pystr::strip(s.as_string(), opt_string(param(a, 0, "chars")), true, false));
       }},
      {"rstrip",
       [](Interpreter&, const Value& s, CallArgs& a) {
         return Value(pystr::strip(s.as_string(), opt_string(param(a, 0, "chars")), false, true));
       }},
      {"split",
       [](Interpreter& in, const Value& s, CallArgs& a) {
         auto parts = pystr::split(s.as_string(), opt_string(param(a, 0, "sep")),
                                   param(a, 1, "maxsplit", Value(-1)).as_int(), false);
         in.charge(static_cast<int64_t>(parts.size()));
         return Value::list(strings_to_values(parts));
       }},
      {"rsplit",
       [](Interpreter& in, const Value& s, CallArgs& a) {
         auto parts = pystr::split(s.as_string(), opt_string(param(a, 0, "sep")),
                                   param(a, 1, "maxsplit", Value(-1)).as_int(), true);
         in.charge(static_cast<int64_t>(parts.size()));
         return Value::list(strings_to_values(parts));
       }},
      {"splitlines",
       [](Interpreter& in, const Value& s, CallArgs& a) {
         auto parts = pystr::splitlines(s.as_string(), param(a, 0, "keepends", Value(false)).truthy());
         in.charge(static_cast<int64_t>(parts.size()));
         return Value::list(strings_to_values(parts));
       }},
      {"startswith",
       [](Interpreter&, const Value& s, CallArgs& a) {
         const Value p = param(a, 0, "prefix");
         auto test = [&](const Value& x) { return x.is_string() && s.as_string().starts_with(x.as_string()); };
         if (p.is_list()) return Value(std::any_of(p.as_list().items.begin(), p.as_list().items.end(), test));
         if (!p.is_string()) fail("startswith first arg must be str or a tuple of str, not ", p.type_name());
         return Value(test(p));
       }},
      {"endswith",
       [](Interpreter&, const Value& s, CallArgs& a) {
         const Value p = param(a, 0, "suffix");
         auto test = [&](const Value& x) { return x.is_string() && s.as_string().ends_with(x.as_string()); };
         if (p.is_list()) return Value(std::any_of(p.as_list().items.begin(), p.as_list().items.end(), test));
         if (!p.is_string()) fail("endswith first arg must be str or a tuple of str, not ", p.type_name());
         return Value(test(p));
       }},
      {"upper", [](Interpreter&, const Value& s, CallArgs&) { return Value(pystr::upper(s.as_string())); }},
      {"lower", [](Interpreter&, const Value& s, CallArgs&) { return Value(pystr::lower(s.as_string())); }},
      {"title", [](Interpreter&, const Value& s, CallArgs&) { return Value(pystr::title(s.as_string())); }},
      {"capitalize", [](Interpreter&, const Value& s, CallArgs&) { return Value(pystr::capitalize(s.as_string())); }},
      {"replace",
       [](Interpreter& in, const Value& s, CallArgs& a) {
         std::string r = pystr::replace(s.as_string(), to_str(param(a, 0, "old")), to_str(param(a, 1, "new")),
                                        param(a, 2, "count", Value(-1)).as_int());
         in.check_size(r.size());
         return Value(std::move(r));
       }},
      {"find",
       [](Interpreter&, const Value& s, CallArgs& a) {
         const size_t hit = s.as_string().find(to_str(param(a, 0, "sub")));
         return Value(hit == std::string::npos
                          ? int64_t{-1}
                          : static_cast<int64_t>(utf8_length(std::string_view(s.as_string()).substr(0, hit))));
       }},
      {"count",
       [](Interpreter&, const Value& s, CallArgs& a) {
         const std::string sub = to_str(param(a, 0, "sub"));
         if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(s.as_string()) + 1));
         int64_t n = 0;
         for (size_t p = s.as_string().find(sub); p != std::string::npos; p = s.as_string().find(sub, p + sub.size()))
           ++n;
         return Value(n);
       }},
      {"join",
       [](Interpreter& in, const Value& s, CallArgs& a) {
         std::string out;
         TrustSpans spans;  // each piece keeps its own trust
         bool first = true;
         for (const auto& item : in.iterate(param(a, 0, "iterable"))) {
           if (!item.is_string()) fail("sequence item: expected str instance, ", item.type_name(), " found");
           if (!first) append_text(out, spans, s);
           first = false;
           append_text(out, spans, item);
           in.check_size(out.size());
         }
         return Value::with_spans(std::move(out), std::move(spans));
       }},
      {"isdigit",
       [](Interpreter&, const Value& s, CallArgs&) {
         const auto& t = s.as_string();
         return Value(!t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; }));
       }},
      {"isalpha",
       [](Interpreter&, const Value& s, CallArgs&) {
         const auto& t = s.as_string();
         return Value(!t.empty() &&
                      std::all_of(t.begin(), t.end(), [](char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z'; }));
       }},
      {"isspace",
       [](Interpreter&, const Value& s, CallArgs&) {
         const auto cs = utf8_chars(s.as_string());
         return Value(!cs.empty() && std::all_of(cs.begin(), cs.end(), pystr::is_space));
       }},
      {"islower",
       [](Interpreter&, const Value& s, CallArgs&) {
         const auto& t = s.as_string();
         return Value(pystr::lower(t) == t && pystr::upper(t) != t);
       }},
      {"isupper",
       [](Interpreter&, const Value& s, CallArgs&) {
         const auto& t = s.as_string();
         return Value(pystr::upper(t) == t && pystr::lower(t) != t);
       }},
  };
  (void)in;
  for (const auto& [n, fn] : methods)
    if (n == name) return method(self, name, fn);
  return missing_attr(self, name);
}

Value dict_items(const Value& d) {
  std::vector<Value> out;
  for (const auto& [k, v] : d.as_dict().items) out.push_back(Value::list({k, v}, true));
  return Value::list(std::move(out));
}

Value dict_method(const Value& self, const std::string& name) {
  if (name == "items") return method(self, name, [](Interpreter&, const Value& d, CallArgs&) { return dict_items(d); });
  if (name == "keys")
    return method(self, name, [](Interpreter& in, const Value& d, CallArgs&) { return Value::list(in.iterate(d)); });
  if (name == "values")
    return method(self, name, [](Interpreter&, const Value& d, CallArgs&) {
      std::vector<Value> out;
      for (const auto& kv : d.as_dict().items) out.push_back(kv.second);
      return Value::list(std::move(out));
    });
  if (name == "get")
    return method(self, name, [](Interpreter&, const Value& d, CallArgs& a) {
      const Value* v = d.as_dict().find(param(a, 0, "key"));
      return v ? *v : param(a, 1, "default", Value::none());
    });
  return Value();
}

bool is_unsafe_mutator(const Value& obj, const std::string& name) {
  static const std::set<std::string> list_mut = {"append", "extend", "insert", "pop",
                                                 "remove", "clear",  "sort",   "reverse"};
  static const std::set<std::string> dict_mut = {"pop", "popitem", "setdefault", "update", "clear"};
  return (obj.is_list() && list_mut.count(name)) || (obj.is_dict() && dict_mut.count(name));
}

std::string html_escape(std::string_view s) {
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
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

// jinja2's make_attrgetter: "a.b.0" walks items/attributes; missing parts give undefined.
Value get_path(Interpreter& in, Value v, const std::string& path) {
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (v.is_undefined()) return v;
    const bool numeric =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = get_item(in, v, numeric ? Value(static_cast<int64_t>(std::stoll(part))) : Value(part));
    if (dot == std::string::npos) return v;
    pos = dot + 1;
  }
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Kind::Undefined:
      return 0;
    case Kind::String:
      return static_cast<int64_t>(utf8_length(v.as_string()));
    case Kind::List:
      return static_cast<int64_t>(v.as_list().items.size());
    case Kind::Dict:
      return static_cast<int64_t>(v.as_dict().items.size());
    default:
      fail("object of type '", v.type_name(), "' has no len()");
  }
}

// Sort key for sort/dictsort/unique: lower-cased strings unless case sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(pystr::lower(v.as_string())) : v;
}

std::optional<int64_t> parse_int(std::string s, int base) {
  s = pystr::strip(s, std::nullopt, true, true);
  std::erase(s, '_');
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, base);
  if (errno || *end) return std::nullopt;
  return v;
}

std::optional<double> parse_float(std::string s) {
  s = pystr::strip(s, std::nullopt, true, true);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end) return std::nullopt;
  return v;
}

Value select_like(Interpreter& in, const Value& value, CallArgs& a, bool by_attr, bool keep_when) {
  std::string attr;
  size_t next = 0;
  if (by_attr) attr = to_str(param(a, next++, "attribute"));
  std::optional<std::string> test;
  if (next < a.args.size()) test = to_str(a.args[next++]);
  CallArgs test_args;
  test_args.args.assign(a.args.begin() + static_cast<std::ptrdiff_t>(std::min(next, a.args.size())), a.args.end());
  std::vector<Value> out;
  for (const auto& item : in.iterate(value)) {
    const Value subject = by_attr ? get_path(in, item, attr) : item;
    CallArgs args = test_args;
    const bool ok = test ? in.apply_test(*test, subject, args) : subject.truthy();
    if (ok == keep_when) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value tojson(Interpreter& in, const Value& v, CallArgs& a) {
  JsonDumpOptions o;
  Value indent;
  if (in.options().hf_extensions) {
    // transformers: json.dumps(x, ensure_ascii=False, indent=indent, separators=separators, sort_keys=False)
    o.ensure_ascii = param(a, 0, "ensure_ascii", Value(false)).truthy();
    indent = param(a, 1, "indent", Value::none());
    o.sort_keys = param(a, 3, "sort_keys", Value(false)).truthy();
    const Value seps = param(a, 2, "separators", Value::none());
    if (!seps.is_none()) {
      if (!seps.is_list() || seps.as_list().items.size() != 2) fail("tojson separators must be a pair of strings");
      o.item_sep = to_str(seps.as_list().items[0]);
      o.key_sep = to_str(seps.as_list().items[1]);
    } else if (!indent.is_none()) {
      o.item_sep = ",";
    }
  } else {
    // jinja2: htmlsafe_json_dumps(sort_keys=True), ASCII only, <>&' escaped
    if (a.args.size() > 1) fail("do_tojson() takes from 2 to 3 positional arguments");
    for (const auto& kv : a.kwargs)
      if (kv.first != "indent") fail("do_tojson() got an unexpected keyword argument '", kv.first, "'");
    indent = param(a, 0, "indent", Value::none());
    o.sort_keys = o.ensure_ascii = o.html_safe = true;
    if (!indent.is_none()) o.item_sep = ",";
  }
  if (!indent.is_none()) o.indent = static_cast<int>(std::clamp<int64_t>(need_int(indent, "indent"), 0, 64));
  std::string out = to_json(v, o);
  in.check_size(out.size());
  return Value(std::move(out), !in.options().hf_extensions);
}

Value indent_filter(const Value& v, CallArgs& a) {
  const Value width = param(a, 0, "width", Value(4));
  const std::string pad =
      width.is_string() ? width.as_string()
                        : std::string(static_cast<size_t>(std::clamp<int64_t>(need_int(width, "width"), 0, 1024)), ' ');
  const bool first = param(a, 1, "first", Value(false)).truthy();
  const bool blank = param(a, 2, "blank", Value(false)).truthy();
  const auto lines = pystr::splitlines(to_str(v) + "\n", false);  // jinja2 appends "\n" first, too
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    if (i > 0 && (blank || !lines[i].empty())) out += pad;
    out += lines[i];
  }
  return Value(first ? pad + out : out);
}

}  // namespace

bool is_builtin_filter(const std::string& name) {
  static const std::set<std::string> names = {
      "abs",    "attr",   "capitalize", "count",      "d",       "default", "dictsort", "e",      "escape",     "first",
      "float",  "indent", "int",        "items",      "join",    "last",    "length",   "list",   "lower",      "map",
      "max",    "min",    "reject",     "rejectattr", "replace", "reverse", "safe",     "select", "selectattr", "sort",
      "string", "sum",    "title",      "tojson",     "trim",    "unique",  "upper"};
  return names.count(name) > 0;
}

bool is_builtin_test(const std::string& name) {
  static const std::set<std::string> names = {
      "boolean",     "callable", "defined", "divisibleby", "eq",   "equalto",   "==",     "escaped",
      "even",        "false",    "filter",  "float",       "ge",   ">=",        "gt",     ">",
      "greaterthan", "in",       "integer", "iterable",    "le",   "<=",        "lower",  "lt",
      "<",           "lessthan", "mapping", "ne",          "!=",   "none",      "number", "odd",
      "sameas",      "sequence", "string",  "test",        "true", "undefined", "upper"};
  return names.count(name) > 0;
}

Value builtin_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  if (name == "trim") return Value(pystr::strip(to_str(v), opt_string(param(a, 0, "chars")), true, true));
  if (name == "length" || name == "count") return Value(length_of(v));
  if (name == "string") return v.is_string() ? v : Value(to_str(v));
  if (name == "upper") return Value(pystr::upper(to_str(v)));
  if (name == "lower") return Value(pystr::lower(to_str(v)));
  if (name == "capitalize") return Value(pystr::capitalize(to_str(v)));
  if (name == "title") {
    // jinja2: words start after runs of [-\s({[<]; each word is capitalized
    const std::string text = to_str(v);
    std::string out;
    bool start = true;
    for (auto ch : utf8_chars(text)) {
      const bool sep = ch == "-" || ch == "(" || ch == "{" || ch == "[" || ch == "<" || pystr::is_space(ch);
      out += sep ? std::string(ch) : start ? pystr::upper(ch) : pystr::lower(ch);
      start = sep;
    }
    return Value(std::move(out));
  }
  if (name == "default" || name == "d") {
    const bool boolean = param(a, 1, "boolean", Value(false)).truthy();
    return v.is_undefined() || (boolean && !v.truthy()) ? param(a, 0, "default_value", Value("")) : v;
  }
  if (name == "replace") {
    const Value count = param(a, 2, "count", Value::none());
    std::string r = pystr::replace(to_str(v), to_str(param(a, 0, "old")), to_str(param(a, 1, "new")),
                                   count.is_none() ? -1 : need_int(count, "count"));
    in.check_size(r.size());
    return Value(std::move(r));
  }
  if (name == "first") {
    if (v.is_list() && !v.as_list().items.empty()) return v.as_list().items.front();
    const auto items = in.iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    const auto items = in.iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "join") {
    const Value attr = param(a, 1, "attribute", Value::none());
    Value sep = param(a, 0, "d", Value::trusted_string(""));
    if (!sep.is_string()) sep = Value(to_str(sep));
    std::string out;
    TrustSpans spans;  // each piece keeps its own trust
    bool first = true;
    for (const auto& item : in.iterate(v)) {
      if (!first) append_text(out, spans, sep);
      first = false;
      append_text(out, spans, attr.is_none() ? item : get_path(in, item, to_str(attr)));
      in.check_size(out.size());
    }
    return Value::with_spans(std::move(out), std::move(spans));
  }
  if (name == "int") {
    const Value def = param(a, 0, "default", Value(0));
    if (v.is_string()) {
      const int base = static_cast<int>(param(a, 1, "base", Value(10)).as_int());
      if (auto i = parse_int(v.as_string(), base)) return Value(*i);
      if (auto f = parse_float(v.as_string()); f && std::isfinite(*f)) return Value(static_cast<int64_t>(*f));
      return def;
    }
    if (v.is_float()) return std::isfinite(v.as_double()) ? Value(static_cast<int64_t>(v.as_double())) : def;
    if (v.is_number()) return Value(v.as_int());
    return def;
  }
  if (name == "float") {
    const Value def = param(a, 0, "default", Value(0.0));
    if (v.is_string()) {
      auto f = parse_float(v.as_string());
      return f ? Value(*f) : def;
    }
    return v.is_number() ? Value(v.as_double()) : def;
  }
  if (name == "list") return Value::list(in.iterate(v));
  if (name == "items") {
    if (v.is_undefined()) return Value::list({});
    if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
    return dict_items(v);
  }
  if (name == "map") {
    std::vector<Value> out;
    if (const Value* attr = a.kwarg("attribute")) {
      const Value* def = a.kwarg("default");
      for (const auto& item : in.iterate(v)) {
        Value x = get_path(in, item, to_str(*attr));
        out.push_back(x.is_undefined() && def ? *def : x);
      }
    } else {
      if (a.args.empty()) fail("map requires a filter argument");
      const std::string filter = to_str(a.args[0]);
      for (const auto& item : in.iterate(v)) {
        CallArgs rest;
        rest.args.assign(a.args.begin() + 1, a.args.end());
        rest.kwargs = a.kwargs;
        out.push_back(in.apply_filter(filter, item, rest));
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "select") return select_like(in, v, a, false, true);
  if (name == "reject") return select_like(in, v, a, false, false);
  if (name == "selectattr") return select_like(in, v, a, true, true);
  if (name == "rejectattr") return select_like(in, v, a, true, false);
  if (name == "dictsort") {
    if (!v.is_dict()) fail("dictsort needs a mapping, got ", v.type_name());
    const bool cs = param(a, 0, "case_sensitive", Value(false)).truthy();
    const std::string by = to_str(param(a, 1, "by", Value("key")));
    if (by != "key" && by != "value") fail("You can only sort by either \"key\" or \"value\"");
    const bool rev = param(a, 2, "reverse", Value(false)).truthy();
    auto items = dict_items(v).as_list().items;
    const size_t idx = by == "key" ? 0 : 1;
    in.charge(static_cast<int64_t>(items.size()));
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      const Value kx = sort_key(x.as_list().items[idx], cs), ky = sort_key(y.as_list().items[idx], cs);
      return rev ? py_less(ky, kx) : py_less(kx, ky);
    });
    return Value::list(std::move(items));
  }
  if (name == "sort") {
    const bool rev = param(a, 0, "reverse", Value(false)).truthy();
    const bool cs = param(a, 1, "case_sensitive", Value(false)).truthy();
    const Value attr = param(a, 2, "attribute", Value::none());
    auto items = in.iterate(v);
    auto key = [&](const Value& x) { return sort_key(attr.is_none() ? x : get_path(in, x, to_str(attr)), cs); };
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      return rev ? py_less(key(y), key(x)) : py_less(key(x), key(y));
    });
    return Value::list(std::move(items));
  }
  if (name == "unique") {
    const bool cs = param(a, 0, "case_sensitive", Value(false)).truthy();
    const Value attr = param(a, 1, "attribute", Value::none());
    std::vector<Value> out, seen;
    for (const auto& item : in.iterate(v)) {
      const Value k = sort_key(attr.is_none() ? item : get_path(in, item, to_str(attr)), cs);
      in.charge(static_cast<int64_t>(seen.size()));
      if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return py_equal(s, k); })) {
        seen.push_back(k);
        out.push_back(item);
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cs = utf8_chars(v.as_string());
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return Value(std::move(out));
    }
    auto items = in.iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "indent") return indent_filter(v, a);
  if (name == "safe") return Value(to_str(v), true);
  if (name == "escape" || name == "e") return v.is_safe() ? v : Value(html_escape(to_str(v)), true);
  if (name == "tojson") return tojson(in, v, a);
  if (name == "abs") {
    if (!v.is_number()) fail("bad operand type for abs(): '", v.type_name(), "'");
    if (v.is_float()) return Value(std::fabs(v.as_double()));
    if (v.as_int() == INT64_MIN) fail("integer overflow");
    return Value(std::abs(v.as_int()));
  }
  if (name == "min" || name == "max") {
    const bool cs = param(a, 0, "case_sensitive", Value(false)).truthy();
    const Value attr = param(a, 1, "attribute", Value::none());
    const auto items = in.iterate(v);
    if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
    auto key = [&](const Value& x) { return sort_key(attr.is_none() ? x : get_path(in, x, to_str(attr)), cs); };
    Value best = items[0];
    for (const auto& item : items)
      if (name == "min" ? py_less(key(item), key(best)) : py_less(key(best), key(item))) best = item;
    return best;
  }
  if (name == "sum") {
    const Value attr = param(a, 0, "attribute", Value::none());
    Value total = param(a, 1, "start", Value(0));
    for (const auto& item : in.iterate(v)) {
      const Value x = attr.is_none() ? item : get_path(in, item, to_str(attr));
      if (!x.is_number() || !total.is_number())
        fail("unsupported operand type(s) for +: '", total.type_name(), "' and '", x.type_name(), "'");
      int64_t r = 0;
      if (total.is_float() || x.is_float())
        total = Value(total.as_double() + x.as_double());
      else if (__builtin_add_overflow(total.as_int(), x.as_int(), &r))
        fail("integer overflow");
      else
        total = Value(r);
    }
    return total;
  }
  if (name == "attr") {  // getattr only: dict keys are not attributes
    const std::string attr = to_str(param(a, 0, "name"));
    if (v.is_dict()) {
      const Value m = dict_method(v, attr);
      return m.is_undefined() ? missing_attr(v, attr) : m;
    }
    return get_attr(in, v, attr);
  }
  fail("No filter named '", name, "'.");
}

bool builtin_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return v.is_safe();
  if (name == "lower") return v.is_string() && pystr::lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && pystr::upper(v.as_string()) == v.as_string();
  if (name == "filter") return is_builtin_filter(to_str(v));
  if (name == "test") return is_builtin_test(to_str(v));
  if (name == "even" || name == "odd" || name == "divisibleby") {
    if (v.is_undefined()) Interpreter::fail_undefined(v);
    Value divisor = name == "divisibleby" ? param(a, 0, "num") : Value(2);
    if (!v.is_number() || !divisor.is_number())
      fail("unsupported operand type(s) for %: '", v.type_name(), "' and '", divisor.type_name(), "'");
    if (divisor.as_double() == 0) fail("integer modulo by zero");
    const bool zero = v.is_float() || divisor.is_float() ? std::fmod(v.as_double(), divisor.as_double()) == 0
                                                         : v.as_int() % divisor.as_int() == 0;
    return name == "odd" ? !zero : zero;
  }
  if (name == "sameas") {
    const Value other = param(a, 0, "other");
    return v.kind() == other.kind() && py_equal(v, other);  // identity approximated by equality
  }
  if (name == "in") {
    const Value seq = param(a, 0, "seq");
    if (seq.is_string()) return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
    if (seq.is_dict()) return seq.as_dict().find(v) != nullptr;
    for (const auto& item : in.iterate(seq))
      if (py_equal(item, v)) return true;
    return false;
  }
  const Value other = param(a, 0, "other");
  if (name == "eq" || name == "equalto" || name == "==") return py_equal(v, other);
  if (name == "ne" || name == "!=") return !py_equal(v, other);
  if (name == "lt" || name == "lessthan" || name == "<" || name == "le" || name == "<=" || name == "gt" ||
      name == "greaterthan" || name == ">" || name == "ge" || name == ">=") {
    if (v.is_undefined()) Interpreter::fail_undefined(v);
    if (other.is_undefined()) Interpreter::fail_undefined(other);
    const bool lt = py_less(v, other), gt = py_less(other, v);
    if (name == "lt" || name == "lessthan" || name == "<") return lt;
    if (name == "le" || name == "<=") return !gt;
    if (name == "gt" || name == "greaterthan" || name == ">") return gt;
    return !lt;
  }
  fail("No test named '", name, "'.");
}

Value get_attr(Interpreter& in, const Value& obj, const std::string& name) {
  if (is_unsafe_mutator(obj, name)) return unsafe(obj, name);
  switch (obj.kind()) {
    case Kind::Undefined:
      Interpreter::fail_undefined(obj);
    case Kind::Dict: {
      Value m = dict_method(obj, name);
      if (!m.is_undefined()) return m;
      const Value* v = obj.as_dict().find(std::string_view(name));
      return v ? *v : missing_attr(obj, name);
    }
    case Kind::String:
      return str_method(in, obj, name);
    case Kind::Namespace:
      for (const auto& [k, v] : obj.as_namespace().attrs)
        if (k == name) return v;
      return missing_attr(obj, name);
    default:
      return missing_attr(obj, name);
  }
}

Value get_item(Interpreter& in, const Value& obj, const Value& key) {
  if (obj.is_undefined()) Interpreter::fail_undefined(obj);
  auto no_element = [&] { return Value::undefined(type_object(obj) + " has no element " + repr(key)); };
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().find(key)) return *v;
    return key.is_string() ? get_attr(in, obj, key.as_string()) : no_element();
  }
  if ((obj.is_list() || obj.is_string()) && key.is_number() && !key.is_float()) {
    const bool str = obj.is_string();
    std::vector<std::string_view> chars;
    if (str) chars = utf8_chars(obj.as_string());
    const auto n = static_cast<int64_t>(str ? chars.size() : obj.as_list().items.size());
    int64_t i = key.as_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return no_element();
    return str ? Value(std::string(chars[static_cast<size_t>(i)])) : obj.as_list().items[static_cast<size_t>(i)];
  }
  if (key.is_string()) return get_attr(in, obj, key.as_string());
  return no_element();
}

Value slice(Interpreter& in, const Value& obj, const Value& start_v, const Value& stop_v, const Value& step_v) {
  auto index = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!v.is_number() || v.is_float()) fail("slice indices must be integers or None");
    return v.as_int();
  };
  const int64_t step = index(step_v).value_or(1);
  if (step == 0) fail("slice step cannot be zero");
  if (!obj.is_list() && !obj.is_string()) fail("'", obj.type_name(), "' object is not subscriptable");
  std::vector<std::string_view> chars;
  if (obj.is_string()) chars = utf8_chars(obj.as_string());
  const auto n = static_cast<int64_t>(obj.is_string() ? chars.size() : obj.as_list().items.size());
  // CPython's PySlice_AdjustIndices
  auto adjust = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0)
      x = std::max<int64_t>(x + n, step < 0 ? -1 : 0);
    else if (x >= n)
      x = step < 0 ? n - 1 : n;
    return x;
  };
  const int64_t start = adjust(index(start_v), step < 0 ? n - 1 : 0);
  const int64_t stop = adjust(index(stop_v), step < 0 ? -1 : n);
  std::vector<size_t> picks;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(static_cast<size_t>(i));
  in.charge(static_cast<int64_t>(picks.size()));
  if (obj.is_string()) {
    std::string out;
    for (size_t i : picks) out += chars[i];
    return Value(std::move(out));
  }
  std::vector<Value> out;
  for (size_t i : picks) out.push_back(obj.as_list().items[i]);
  return Value::list(std::move(out), obj.as_list().is_tuple);
}

void add_globals(Scope& globals, const Options& options) {
  globals.set("range", Value::function("range", [](Interpreter& in, CallArgs& a) {
                if (a.args.empty() || a.args.size() > 3) fail("range expected 1 to 3 arguments, got ", a.args.size());
                int64_t start = 0, stop, step = 1;
                if (a.args.size() == 1) {
                  stop = need_int(a.args[0], "range() argument");
                } else {
                  start = need_int(a.args[0], "range() argument");
                  stop = need_int(a.args[1], "range() argument");
                  if (a.args.size() == 3) step = need_int(a.args[2], "range() argument");
                }
                if (step == 0) fail("range() arg 3 must not be zero");
                const long double span =
                    step > 0 ? (static_cast<long double>(stop) - start) : (static_cast<long double>(start) - stop);
                const long double count = span <= 0 ? 0 : std::ceil(span / std::abs(static_cast<long double>(step)));
                const int64_t limit = in.options().limits.max_range_size;
                if (count > limit)
                  fail("max_range_size exceeded: range() of ", static_cast<int64_t>(count),
                       " items passes the limit of ", limit);
                in.charge(static_cast<int64_t>(count));
                std::vector<Value> out;
                for (int64_t i = 0, x = start; i < static_cast<int64_t>(count); ++i, x += step) out.emplace_back(x);
                return Value::list(std::move(out));
              }));
  globals.set("dict", Value::function("dict", [](Interpreter& in, CallArgs& a) {
                Dict d;
                if (!a.args.empty()) {
                  const Value& src = a.args[0];
                  if (src.is_dict())
                    d = src.as_dict();
                  else
                    for (const auto& pair : in.iterate(src)) {
                      const auto kv = in.iterate(pair);
                      if (kv.size() != 2)
                        fail("dictionary update sequence element has length ", kv.size(), "; 2 is required");
                      d.set(kv[0], kv[1]);
                    }
                }
                for (const auto& [k, v] : a.kwargs) d.set(Value(k), v);
                return Value::dict(std::move(d));
              }));
  globals.set("namespace", Value::function("namespace", [](Interpreter&, CallArgs& a) {
                auto ns = std::make_shared<Namespace>();
                auto put = [&](const std::string& k, const Value& v) {
                  for (auto& [name, val] : ns->attrs)
                    if (name == k) {
                      val = v;
                      return;
                    }
                  ns->attrs.emplace_back(k, v);
                };
                for (const auto& arg : a.args) {
                  if (!arg.is_dict()) fail("namespace() positional arguments must be mappings, not ", arg.type_name());
                  for (const auto& [k, v] : arg.as_dict().items) put(to_str(k), v);
                }
                for (const auto& [k, v] : a.kwargs) put(k, v);
                return Value(NamespacePtr(std::move(ns)));
              }));
  if (!options.hf_extensions) return;
  globals.set("raise_exception", Value::function("raise_exception", [](Interpreter&, CallArgs& a) -> Value {
                throw RaisedException(SourcePos{0, 0}, to_str(param(a, 0, "message")));
              }));
  globals.set("strftime_now", Value::function("strftime_now", [](Interpreter& in, CallArgs& a) {
                std::tm t{};
                if (in.options().now) {
                  t = in.options().now();
                } else {
                  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
                  localtime_r(&now, &t);
                }
                const std::string format = to_str(param(a, 0, "format"));
                char buf[512];
                const size_t n = format.empty() ? 0 : std::strftime(buf, sizeof buf, format.c_str(), &t);
                if (n == 0 && !format.empty()) fail("strftime_now: format gives no output or more than 511 bytes");
                return Value(std::string(buf, n));
              }));
}

}  // namespace tessera::jinja
