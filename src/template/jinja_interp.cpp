#include "template/jinja_interp.h"

#include <cmath>

#include "core/error.h"

namespace tessera::jinja {

const Value* Scope::find(std::string_view name) const {
  for (const Scope* s = this; s; s = s->parent.get())
    for (const auto& [k, v] : s->vars)
      if (k == name) return &v;
  return nullptr;
}

void Scope::set(const std::string& name, Value value) {
  for (auto& [k, v] : vars)
    if (k == name) {
      v = std::move(value);
      return;
    }
  vars.emplace_back(name, std::move(value));
}

Interpreter::Interpreter(const Options& options) : options_(options) {}

bool all_trusted(const CallArgs& args) {
  for (const Value& v : args.args)
    if (!trusted_input(v)) return false;
  for (const auto& kv : args.kwargs)
    if (!trusted_input(kv.second)) return false;
  return true;
}

Rendered Interpreter::render(const Body& body, const std::vector<std::pair<std::string, Value>>& variables) {
  globals_ = std::make_shared<Scope>();
  add_globals(*globals_, options_);
  scope_ = std::make_shared<Scope>();
  scope_->parent = globals_;
  for (const auto& [k, v] : variables) scope_->set(k, v);
  Rendered out;
  out_ = &out;
  exec_body(body);
  out_ = nullptr;
  return out;
}

void Interpreter::charge(int64_t n) {
  steps_ += n;
  if (steps_ > options_.limits.max_steps)
    fail("max_steps exceeded: the template ran more than ", options_.limits.max_steps, " steps");
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > options_.limits.max_output_bytes)
    fail("max_output_bytes exceeded: a string of ", bytes, " bytes passes the limit of ",
         options_.limits.max_output_bytes);
}

void Interpreter::fail_undefined(const Value& v) {
  const std::string& hint = v.undefined_hint();
  fail(hint.empty() ? std::string("value is undefined") : hint);
}

void Interpreter::emit(std::string_view text, bool trusted) {
  if (out_->text.size() + text.size() > options_.limits.max_output_bytes)
    fail("max_output_bytes exceeded: the output passes ", options_.limits.max_output_bytes, " bytes");
  if (trusted && !text.empty()) {
    const TrustSpans whole{{0, text.size()}};
    append_spans(out_->trusted, out_->text.size(), &whole);
  }
  out_->text.append(text);
}

void Interpreter::emit_value(const Value& v) {
  if (!v.is_string()) return emit(to_str(v), false);
  const std::string& text = v.as_string();
  if (out_->text.size() + text.size() > options_.limits.max_output_bytes)
    fail("max_output_bytes exceeded: the output passes ", options_.limits.max_output_bytes, " bytes");
  append_spans(out_->trusted, out_->text.size(), v.trust_spans());
  out_->text.append(text);
}

Value Interpreter::capture(const Body& body, Flow* flow, bool safe) {
  Rendered buffer;
  Rendered* saved = out_;
  out_ = &buffer;
  Flow f = Flow::Normal;
  try {
    f = exec_body(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  if (flow) *flow = f;
  return Value::with_spans(std::move(buffer.text), std::move(buffer.trusted), safe);
}

// ---------------------------------------------------------------- statements

Interpreter::Flow Interpreter::exec_body(const Body& body) {
  for (const auto& s : body) {
    const Flow f = exec(*s);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

namespace {
// Restores a member on scope exit (also when an error unwinds).
template <typename T>
struct Restore {
  T& ref;
  T saved;
  explicit Restore(T& r) : ref(r), saved(r) {}
  ~Restore() { ref = std::move(saved); }
};
}  // namespace

Interpreter::Flow Interpreter::exec(const Stmt& s) {
  try {
    charge();
    switch (s.kind) {
      case StmtKind::Text:
        emit(s.text, /*trusted=*/true);
        return Flow::Normal;
      case StmtKind::Output:
        emit_value(eval(*s.expr));
        return Flow::Normal;
      case StmtKind::If:
        for (const auto& [cond, body] : s.branches)
          if (eval(*cond).truthy()) return exec_body(body);
        return exec_body(s.else_body);
      case StmtKind::For:
        return exec_for(s);
      case StmtKind::Set:
        exec_set(s);
        return Flow::Normal;
      case StmtKind::SetBlock: {
        Value text = capture(s.body);
        if (s.filter) text = eval_filter(*s.filter, &text);
        scope_->set(s.targets[0], text);
        return Flow::Normal;
      }
      case StmtKind::Macro:
        scope_->set(s.name, define_macro(s, nullptr));
        return Flow::Normal;
      case StmtKind::CallBlock: {
        const Expr& call = *s.expr;
        Value fn = eval(*call.args[0]);
        CallArgs args;
        eval_args(call, 1, args);
        args.kwargs.emplace_back("caller", define_macro(s, &s.body));
        emit_value(this->call(fn, args));
        return Flow::Normal;
      }
      case StmtKind::FilterBlock: {
        const Value text = capture(s.body);
        emit_value(eval_filter(*s.expr, &text));
        return Flow::Normal;
      }
      case StmtKind::With: {
        auto frame = std::make_shared<Scope>();
        frame->parent = scope_;
        for (size_t i = 0; i < s.targets.size(); ++i) frame->set(s.targets[i], eval(*s.values[i]));
        Restore<ScopePtr> restore(scope_);
        scope_ = frame;
        return exec_body(s.body);
      }
      case StmtKind::Break:
        return Flow::Break;
      case StmtKind::Continue:
        return Flow::Continue;
      case StmtKind::Generation:
        return exec_body(s.body);
    }
  } catch (const TemplateError&) {
    throw;
  } catch (const RaisedException& e) {
    if (e.pos().line == 0) throw RaisedException(s.pos, e.what());
    throw;
  } catch (const Error& e) {
    throw TemplateError(s.pos, e.what());
  }
  return Flow::Normal;
}

void Interpreter::assign(const std::vector<std::string>& targets, bool unpack, const Value& value) {
  if (!unpack) {
    scope_->set(targets[0], value);
    return;
  }
  const std::vector<Value> items = iterate(value);
  if (items.size() > targets.size()) fail("too many values to unpack (expected ", targets.size(), ")");
  if (items.size() < targets.size())
    fail("not enough values to unpack (expected ", targets.size(), ", got ", items.size(), ")");
  for (size_t i = 0; i < targets.size(); ++i) scope_->set(targets[i], items[i]);
}

void Interpreter::exec_set(const Stmt& s) {
  Value value = eval(*s.expr);
  if (s.ns_target.empty()) {
    assign(s.targets, s.tuple_target, value);
    return;
  }
  const Value* ns = scope_->find(s.ns_target);
  if (!ns || !ns->is_namespace()) fail("cannot assign attribute on non-namespace object");
  auto& attrs = ns->as_namespace().attrs;
  for (auto& [k, v] : attrs)
    if (k == s.name) {
      v = std::move(value);
      return;
    }
  attrs.emplace_back(s.name, std::move(value));
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s) {
  std::vector<Value> items = iterate(eval(*s.expr));
  Restore<ScopePtr> restore(scope_);
  const ScopePtr outer = scope_;
  if (s.filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      scope_ = std::make_shared<Scope>();
      scope_->parent = outer;
      assign(s.targets, s.tuple_target, item);
      if (eval(*s.filter).truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    scope_ = std::make_shared<Scope>();
    scope_->parent = outer;
    return exec_body(s.else_body);  // outside the loop: a break here belongs to an outer loop
  }
  const auto n = static_cast<int64_t>(items.size());
  auto current = std::make_shared<int64_t>(0);
  const Value cycle = Value::function("loop.cycle", [current](Interpreter&, CallArgs& a) -> Value {
    if (a.args.empty()) fail("no items for cycling given");
    return a.args[static_cast<size_t>(*current) % a.args.size()];
  });
  for (int64_t i = 0; i < n; ++i) {
    if (++loop_iterations_ > options_.limits.max_loop_iterations)
      fail("max_loop_iterations exceeded: more than ", options_.limits.max_loop_iterations, " loop iterations");
    *current = i;
    Dict loop;
    loop.set("index", Value(i + 1));
    loop.set("index0", Value(i));
    loop.set("revindex", Value(n - i));
    loop.set("revindex0", Value(n - i - 1));
    loop.set("first", Value(i == 0));
    loop.set("last", Value(i == n - 1));
    loop.set("length", Value(n));
    loop.set("depth", Value(1));
    loop.set("depth0", Value(0));
    if (i > 0) loop.set("previtem", items[static_cast<size_t>(i - 1)]);
    if (i + 1 < n) loop.set("nextitem", items[static_cast<size_t>(i + 1)]);
    loop.set("cycle", cycle);
    scope_ = std::make_shared<Scope>();
    scope_->parent = outer;
    assign(s.targets, s.tuple_target, items[static_cast<size_t>(i)]);
    scope_->set("loop", Value::dict(std::move(loop)));
    if (exec_body(s.body) == Flow::Break) break;
  }
  return Flow::Normal;
}

Value Interpreter::define_macro(const Stmt& s, const Body* caller_body) {
  // Weak: the defining scope holds the macro, so a strong reference would be a cycle that
  // outlives the render. The scope outlives every call in practice (top level, or the loop
  // iteration that defined it); a macro smuggled out of its scope sees the globals only.
  const std::weak_ptr<Scope> closure = scope_;
  const Stmt* stmt = &s;
  const std::string name = caller_body ? "caller" : s.name;
  return Value::function(name, [this, stmt, closure](Interpreter&, CallArgs& args) {
    ScopePtr scope = closure.lock();
    return call_macro(*stmt, scope ? scope : globals_, args, Value());
  });
}

Value Interpreter::call_macro(const Stmt& s, const ScopePtr& closure, CallArgs& args, Value caller) {
  if (call_depth_ >= options_.limits.max_recursion_depth)
    fail("max_recursion_depth exceeded: macro calls nest deeper than ", options_.limits.max_recursion_depth);
  Restore<int> depth(call_depth_);
  ++call_depth_;
  auto frame = std::make_shared<Scope>();
  frame->parent = closure;
  std::vector<bool> bound(s.params.size(), false);
  std::vector<Value> varargs;
  for (size_t i = 0; i < args.args.size(); ++i) {
    if (i < s.params.size()) {
      frame->set(s.params[i], args.args[i]);
      bound[i] = true;
    } else {
      varargs.push_back(args.args[i]);
    }
  }
  Dict kwargs;
  for (auto& [k, v] : args.kwargs) {
    size_t p = 0;
    while (p < s.params.size() && s.params[p] != k) ++p;
    if (p < s.params.size()) {
      if (bound[p]) fail("macro '", s.name, "' got multiple values for argument '", k, "'");
      frame->set(k, v);
      bound[p] = true;
    } else if (k == "caller") {
      caller = v;
    } else {
      kwargs.set(Value(k), v);
    }
  }
  Restore<ScopePtr> restore(scope_);
  scope_ = frame;
  for (size_t p = 0; p < s.params.size(); ++p) {
    if (bound[p]) continue;
    // Defaults are evaluated at call time, in the macro's frame (they may use earlier params).
    frame->set(s.params[p], s.defaults[p] ? eval(*s.defaults[p])
                                          : Value::undefined("parameter '" + s.params[p] + "' was not provided"));
  }
  frame->set("varargs", Value::list(std::move(varargs), true));
  frame->set("kwargs", Value::dict(std::move(kwargs)));
  if (!caller.is_undefined()) frame->set("caller", caller);
  return capture(s.body, nullptr, /*safe=*/true);
}

// ---------------------------------------------------------------- expressions

Value Interpreter::eval(const Expr& e) {
  try {
    charge();
    return eval_inner(e);
  } catch (const TemplateError&) {
    throw;
  } catch (const RaisedException& r) {
    if (r.pos().line == 0) throw RaisedException(e.pos, r.what());
    throw;
  } catch (const Error& err) {
    throw TemplateError(e.pos, err.what());
  }
}

Value Interpreter::eval_inner(const Expr& e) {
  switch (e.kind) {
    case ExprKind::Literal:
      return e.value;
    case ExprKind::Name: {
      const Value* v = scope_->find(e.name);
      return v ? *v : Value::undefined("'" + e.name + "' is undefined");
    }
    case ExprKind::List:
    case ExprKind::Tuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const auto& a : e.args) items.push_back(eval(*a));
      return Value::list(std::move(items), e.kind == ExprKind::Tuple);
    }
    case ExprKind::Dict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
        Value key = eval(*e.args[i]);
        if (key.is_list() || key.is_dict()) fail("unhashable type: '", key.type_name(), "'");
        d.set(std::move(key), eval(*e.args[i + 1]));
      }
      return Value::dict(std::move(d));
    }
    case ExprKind::Attr: {
      const Value obj = eval(*e.args[0]);
      if (obj.is_undefined()) fail_undefined(obj);
      Value attr = get_attr(*this, obj, e.name);
      // A method of a string the template wrote gives trusted results from trusted arguments.
      if (obj.is_string() && attr.is_callable() && obj.fully_trusted()) {
        attr = Value::function(e.name, [method = attr](Interpreter& in, CallArgs& args) {
          const bool trusted = all_trusted(args);
          Value r = in.call(method, args);
          return trusted && !r.trust_spans() ? mark_trusted(r) : r;
        });
      }
      return attr;
    }
    case ExprKind::Subscript: {
      const Value obj = eval(*e.args[0]);
      if (obj.is_undefined()) fail_undefined(obj);
      const Expr& key = *e.args[1];
      Value item;
      if (key.kind == ExprKind::Slice) {
        auto part = [&](size_t i) { return key.args[i] ? eval(*key.args[i]) : Value::none(); };
        item = slice(*this, obj, part(0), part(1), part(2));
      } else {
        item = get_item(*this, obj, eval(key));
      }
      // Part of a string the template wrote is still the template's.
      return obj.fully_trusted() && item.is_string() ? mark_trusted(item) : item;
    }
    case ExprKind::Slice:
      fail("a slice is only allowed inside []");
    case ExprKind::Call:
      return eval_call(e);
    case ExprKind::Filter:
      return eval_filter(e, nullptr);
    case ExprKind::Test: {
      const Value v = eval(*e.args[0]);
      CallArgs args;
      eval_args(e, 1, args);
      return Value(apply_test(e.name, v, args));
    }
    case ExprKind::Not:
      return Value(!eval(*e.args[0]).truthy());
    case ExprKind::Neg:
    case ExprKind::Pos: {
      const Value v = eval(*e.args[0]);
      if (v.is_undefined()) fail_undefined(v);
      if (!v.is_number())
        fail("bad operand type for unary ", e.kind == ExprKind::Neg ? "-" : "+", ": '", v.type_name(), "'");
      if (e.kind == ExprKind::Pos) return v.is_bool() ? Value(v.as_int()) : v;
      if (v.is_float()) return Value(-v.as_double());
      if (v.as_int() == INT64_MIN) fail("integer overflow");
      return Value(-v.as_int());
    }
    case ExprKind::Binary: {
      const Value a = eval(*e.args[0]);
      const Value b = eval(*e.args[1]);
      return eval_binary(e.name, a, b);
    }
    case ExprKind::And: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? eval(*e.args[1]) : a;
    }
    case ExprKind::Or: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? a : eval(*e.args[1]);
    }
    case ExprKind::Compare: {
      Value left = eval(*e.args[0]);
      for (size_t i = 0; i < e.ops.size(); ++i) {
        Value right = eval(*e.args[i + 1]);
        if (!eval_compare(e.ops[i], left, right)) return Value(false);
        left = std::move(right);
      }
      return Value(true);
    }
    case ExprKind::Cond:
      if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
      if (e.args[2]) return eval(*e.args[2]);
      return Value::undefined("the inline if-expression on line " + std::to_string(e.pos.line) +
                              " evaluated to false and no else section was defined.");
  }
  fail("unknown expression");
}

void Interpreter::eval_args(const Expr& e, size_t first, CallArgs& out) {
  for (size_t i = first; i < e.args.size(); ++i) out.args.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) out.kwargs.emplace_back(k, eval(*v));
}

Value Interpreter::eval_call(const Expr& e) {
  const Value fn = eval(*e.args[0]);
  CallArgs args;
  eval_args(e, 1, args);
  return call(fn, args);
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) fail_undefined(fn);
  if (!fn.is_callable()) fail("'", fn.type_name(), "' object is not callable");
  return fn.as_callable().fn(*this, args);
}

Value Interpreter::eval_filter(const Expr& e, const Value* block_input) {
  Value input;
  if (!e.args[0]) {
    if (!block_input) fail("filter without input");
    input = *block_input;
  } else if (e.args[0]->kind == ExprKind::Filter && block_input) {
    input = eval_filter(*e.args[0], block_input);
  } else {
    input = eval(*e.args[0]);
  }
  CallArgs args;
  eval_args(e, 1, args);
  return apply_filter(e.name, input, args);
}

Value Interpreter::apply_filter(const std::string& name, const Value& value, CallArgs& args) {
  charge();
  Value r = builtin_filter(*this, name, value, args);
  // A result computed only from trusted text is trusted; anything else keeps what the filter
  // built (join keeps each piece's spans), or none.
  if (!r.trust_spans() && trusted_input(value) && all_trusted(args)) return mark_trusted(r);
  return r;
}

bool Interpreter::apply_test(const std::string& name, const Value& value, CallArgs& args) {
  charge();
  return builtin_test(*this, name, value, args);
}

std::vector<Value> Interpreter::iterate(const Value& v) {
  std::vector<Value> out;
  switch (v.kind()) {
    case Kind::Undefined:
      return out;
    case Kind::List:
      out = v.as_list().items;
      break;
    case Kind::Dict:
      for (const auto& kv : v.as_dict().items) out.push_back(kv.first);
      break;
    case Kind::String:
      for (auto ch : utf8_chars(v.as_string())) out.emplace_back(std::string(ch));
      break;
    default:
      fail("'", v.type_name(), "' object is not iterable");
  }
  charge(static_cast<int64_t>(out.size()));
  return out;
}

// ---------------------------------------------------------------- operators

namespace {

// Python ints are unbounded; ours are 64-bit, and overflow is an error rather than a wrap.
int64_t checked(bool overflow, const int64_t& result) {
  if (overflow) fail("integer overflow (integers are 64-bit here)");
  return result;
}
int64_t add_int(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = __builtin_add_overflow(a, b, &r);
  return checked(overflow, r);
}
int64_t sub_int(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = __builtin_sub_overflow(a, b, &r);
  return checked(overflow, r);
}
int64_t mul_int(int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = __builtin_mul_overflow(a, b, &r);
  return checked(overflow, r);
}

Value repeat(Interpreter& in, const Value& seq, int64_t times) {
  times = std::max<int64_t>(times, 0);
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && times > 0) in.check_size(s.size() * static_cast<size_t>(std::min<int64_t>(times, INT32_MAX)));
    in.charge(times);
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += s;
    return seq.fully_trusted() ? Value::trusted_string(std::move(out)) : Value(std::move(out));
  }
  const auto& items = seq.as_list().items;
  if (!items.empty()) in.charge(times * static_cast<int64_t>(items.size()));
  std::vector<Value> out;
  for (int64_t i = 0; i < times && !items.empty(); ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), seq.as_list().is_tuple);
}

}  // namespace

Value Interpreter::eval_binary(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") {  // str(a) + str(b); only strings carry trusted spans
    const Value s = a.is_string() ? a : Value(to_str(a));
    const Value t = b.is_string() ? b : Value(to_str(b));
    check_size(s.as_string().size() + t.as_string().size());
    return concat_strings(s, t);
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool ints = a.is_number() && b.is_number() && !a.is_float() && !b.is_float();
  const bool nums = a.is_number() && b.is_number();
  if (op == "+") {
    if (ints) return Value(add_int(a.as_int(), b.as_int()));
    if (nums) return Value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      check_size(a.as_string().size() + b.as_string().size());
      return concat_strings(a, b);
    }
    if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      charge(static_cast<int64_t>(items.size()));
      return Value::list(std::move(items), a.as_list().is_tuple);
    }
    if (a.is_string() || a.is_list())
      fail("can only concatenate ", a.type_name(), " (not \"", b.type_name(), "\") to ", a.type_name());
  } else if (op == "-") {
    if (ints) return Value(sub_int(a.as_int(), b.as_int()));
    if (nums) return Value(a.as_double() - b.as_double());
  } else if (op == "*") {
    if (ints) return Value(mul_int(a.as_int(), b.as_int()));
    if (nums) return Value(a.as_double() * b.as_double());
    if ((a.is_string() || a.is_list()) && b.is_number() && !b.is_float()) return repeat(*this, a, b.as_int());
    if ((b.is_string() || b.is_list()) && a.is_number() && !a.is_float()) return repeat(*this, b, a.as_int());
  } else if (op == "/") {
    if (nums) {
      if (b.as_double() == 0) fail("division by zero");
      return Value(a.as_double() / b.as_double());
    }
  } else if (op == "//" || op == "%") {
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) fail(op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
      if (x == INT64_MIN && y == -1) fail("integer overflow (integers are 64-bit here)");
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {
        --q;
        m += y;
      }
      return Value(op == "//" ? q : m);
    }
    if (nums) {
      // CPython's float divmod
      const double x = a.as_double(), y = b.as_double();
      if (y == 0) fail(op == "//" ? "float floor division by zero" : "float modulo");
      double mod = std::fmod(x, y), div = (x - mod) / y;
      if (mod != 0) {
        if ((y < 0) != (mod < 0)) {
          mod += y;
          div -= 1.0;
        }
      } else {
        mod = std::copysign(0.0, y);
      }
      if (op == "%") return Value(mod);
      double floordiv = std::copysign(0.0, x / y);
      if (div != 0) {
        floordiv = std::floor(div);
        if (div - floordiv > 0.5) floordiv += 1.0;
      }
      return Value(floordiv);
    }
    if (op == "%" && a.is_string()) fail("printf-style string formatting ('%') is not supported");
  } else if (op == "**") {
    if (ints && b.as_int() >= 0) {
      int64_t base = a.as_int(), e = b.as_int(), acc = 1;
      while (e > 0) {
        if (e & 1) acc = mul_int(acc, base);
        e >>= 1;
        if (e > 0) base = mul_int(base, base);
      }
      return Value(acc);
    }
    if (nums) {
      if (a.as_double() == 0 && b.as_double() < 0) fail("0.0 cannot be raised to a negative power");
      return Value(std::pow(a.as_double(), b.as_double()));
    }
  }
  fail("unsupported operand type(s) for ", op, ": '", a.type_name(), "' and '", b.type_name(), "'");
}

bool Interpreter::eval_compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return py_equal(a, b);
  if (op == "!=") return !py_equal(a, b);
  if (op == "in" || op == "notin") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) fail("'in <string>' requires string as left operand, not ", a.type_name());
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_list()) {
      charge(static_cast<int64_t>(b.as_list().items.size()));
      for (const auto& item : b.as_list().items)
        if (py_equal(item, a)) found = true;
    } else if (b.is_dict()) {
      found = b.as_dict().find(a) != nullptr;
    } else if (!b.is_undefined()) {
      fail("argument of type '", b.type_name(), "' is not iterable");
    }
    return op == "in" ? found : !found;
  }
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool comparable =
      (a.is_number() && b.is_number()) || (a.is_string() && b.is_string()) || (a.is_list() && b.is_list());
  if (!comparable)
    fail("'", op, "' not supported between instances of '", a.type_name(), "' and '", b.type_name(), "'");
  if (op == "<") return py_less(a, b);
  if (op == ">") return py_less(b, a);
  if (op == "<=") return !py_less(b, a);
  return !py_less(a, b);  // >=
}

}  // namespace tessera::jinja
