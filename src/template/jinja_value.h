#pragma once
// The value type of the Jinja interpreter: what Python objects a chat template sees. Lists,
// dicts and strings are shared and immutable once built (the HF sandbox is immutable: templates
// cannot mutate them), so copying a Value is cheap. Namespaces are the one mutable object.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace tessera::jinja {

class Value;
class Interpreter;

struct NoneType {};
// jinja2's default Undefined: prints empty, is falsy, iterates as empty; any other use raises
// an error with `hint` ("'x' is undefined", "'dict object' has no attribute 'y'").
struct Undefined {
  std::shared_ptr<const std::string> hint;
};
// Byte ranges [begin, end) of a string that the template wrote itself (its literals and text,
// and variables the caller marks trusted: bos_token, eos_token), sorted, disjoint and never
// adjacent. A tokenizer reads special tokens only there: text that comes from data (messages,
// tools, kwargs) never is, so a client cannot spell the template's control tokens. A computed
// string is trusted only where every input was (docs/design/chat-template.md, "Trusted text").
using TrustSpans = std::vector<std::pair<size_t, size_t>>;
struct Str {
  std::shared_ptr<const std::string> s;
  bool safe = false;                          // Markup: `escape` leaves it alone
  std::shared_ptr<const TrustSpans> trusted;  // null: no byte is trusted
};
// Containers know their nesting depth so that no value can nest deeper than kMaxValueDepth:
// recursive printing, comparison and destruction then cannot exhaust the stack.
inline constexpr uint32_t kMaxValueDepth = 256;
struct List {
  std::vector<Value> items;
  bool is_tuple = false;
  uint32_t depth = 1;
};
// Insertion-ordered, like a Python dict; keys are scalars (strings in practice).
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  uint32_t depth = 1;
  const Value* find(const Value& key) const;
  const Value* find(std::string_view key) const;
  void set(Value key, Value value);
};
struct Namespace {
  std::vector<std::pair<std::string, Value>> attrs;
};

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> args;
  std::vector<std::pair<std::string, Value>> kwargs;
  const Value* kwarg(std::string_view name) const;
};

struct Callable {
  std::string name;
  std::function<Value(Interpreter&, CallArgs&)> fn;
};

using ListPtr = std::shared_ptr<const List>;
using DictPtr = std::shared_ptr<const Dict>;
using NamespacePtr = std::shared_ptr<Namespace>;
using CallablePtr = std::shared_ptr<const Callable>;

enum class Kind : uint8_t { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Callable };

class Value {
 public:
  Value() : v_(Undefined{}) {}
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(NoneType n) : v_(n) {}
  static Value undefined(std::string hint) {
    return Value(Undefined{std::make_shared<const std::string>(std::move(hint))});
  }
  static Value none() { return Value(NoneType{}); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(double d) : v_(d) {}
  Value(std::string s, bool safe = false) : v_(Str{std::make_shared<const std::string>(std::move(s)), safe, nullptr}) {}
  Value(const char* s) : Value(std::string(s)) {}
  Value(ListPtr l) : v_(std::move(l)) {}
  Value(DictPtr d) : v_(std::move(d)) {}
  Value(NamespacePtr n) : v_(std::move(n)) {}
  Value(CallablePtr c) : v_(std::move(c)) {}
  // A string the template wrote (every byte trusted), and one with the given trusted spans.
  static Value trusted_string(std::string s, bool safe = false);
  static Value with_spans(std::string s, TrustSpans spans, bool safe = false);
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(Dict d);
  static Value function(std::string name, std::function<Value(Interpreter&, CallArgs&)> fn);

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_number() const { return kind() == Kind::Int || kind() == Kind::Float || kind() == Kind::Bool; }
  bool is_string() const { return kind() == Kind::String; }
  bool is_list() const { return kind() == Kind::List; }
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_namespace() const { return kind() == Kind::Namespace; }
  bool is_callable() const { return kind() == Kind::Callable; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return is_bool() ? int64_t{as_bool()} : std::get<int64_t>(v_); }  // bool is an int
  double as_double() const { return is_float() ? std::get<double>(v_) : static_cast<double>(as_int()); }
  const std::string& as_string() const { return *std::get<Str>(v_).s; }
  bool is_safe() const { return is_string() && std::get<Str>(v_).safe; }
  // The trusted spans of a string; null for other kinds and for strings with none.
  const TrustSpans* trust_spans() const { return is_string() ? std::get<Str>(v_).trusted.get() : nullptr; }
  // A string trusted from its first byte to its last (an empty string is).
  bool fully_trusted() const;
  const List& as_list() const { return *std::get<ListPtr>(v_); }
  const Dict& as_dict() const { return *std::get<DictPtr>(v_); }
  Namespace& as_namespace() const { return *std::get<NamespacePtr>(v_); }
  const Callable& as_callable() const { return *std::get<CallablePtr>(v_); }
  const std::string& undefined_hint() const;
  uint32_t depth() const;  // 0 for scalars

  bool truthy() const;
  // Python's type name, for error messages: 'int', 'str', 'dict', 'NoneType', ...
  std::string type_name() const;

 private:
  std::variant<Undefined, NoneType, bool, int64_t, double, Str, ListPtr, DictPtr, NamespacePtr, CallablePtr> v_;
};

// Trust bookkeeping (see TrustSpans). append_spans adds `src` shifted by `offset` to `dst`,
// merging what touches; concat_strings joins two strings keeping each byte's trust.
void append_spans(TrustSpans& dst, size_t offset, const TrustSpans* src);
Value concat_strings(const Value& a, const Value& b);
// Appends str(piece) to `out`, its spans to `spans` (only strings carry any).
void append_text(std::string& out, TrustSpans& spans, const Value& piece);
// Whether a builtin's input lets its result be trusted: a fully trusted string, or a scalar
// that prints no text a client chose (none, bools, numbers, undefined).
bool trusted_input(const Value& v);
// The same value with every string in it (through lists) fully trusted.
Value mark_trusted(const Value& v);

// Python semantics: 1 == 1.0 == True; lists and dicts compare by content; undefined == undefined.
bool py_equal(const Value& a, const Value& b);
// Python's `<` for numbers, strings and lists; throws tessera::Error on other types.
bool py_less(const Value& a, const Value& b);

// str(value) as jinja2 prints it: None -> "None", floats like repr, lists/dicts as Python repr,
// undefined -> "".
std::string to_str(const Value& v);
// repr(value): strings quoted the way Python does.
std::string repr(const Value& v);
std::string format_float(double d);  // Python's repr(float)
std::string repr_string(std::string_view s);

struct JsonDumpOptions {
  int indent = -1;  // -1: single line
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
  bool html_safe = false;  // jinja2's own tojson: escapes < > & '
};
// json.dumps(value) with the given options; throws on values JSON cannot hold.
std::string to_json(const Value& v, const JsonDumpOptions& options);

// UTF-8 helpers: strings are indexed, sliced and measured in code points, as in Python.
size_t utf8_length(std::string_view s);
std::vector<std::string_view> utf8_chars(std::string_view s);

}  // namespace tessera::jinja
