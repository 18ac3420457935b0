#pragma once
// The tree-walking evaluator. One Interpreter renders one template once; it owns the scopes,
// the output buffers and the limit counters. Builtins (filters, tests, methods, globals) live in
// jinja_builtins.cpp and call back into it for steps, calls and errors.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "template/jinja.h"

namespace tessera::jinja {

// Variables of one frame; lookups walk up to the globals. Shared so macros keep their
// defining scope (Python-like closures: later assignments there are visible).
struct Scope {
  std::shared_ptr<Scope> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const;
  void set(const std::string& name, Value value);
};
using ScopePtr = std::shared_ptr<Scope>;

class Interpreter {
 public:
  explicit Interpreter(const Options& options);

  // Renders `body` with `variables` on top of the globals; the text and its trusted spans.
  Rendered render(const Body& body, const std::vector<std::pair<std::string, Value>>& variables);

  // ---- for builtins ----
  const Options& options() const { return options_; }
  // Counts `n` units of work against max_steps.
  void charge(int64_t n = 1);
  // Throws when a string about to be built would pass max_output_bytes.
  void check_size(size_t bytes) const;
  Value call(const Value& fn, CallArgs& args);
  Value apply_filter(const std::string& name, const Value& value, CallArgs& args);
  bool apply_test(const std::string& name, const Value& value, CallArgs& args);
  // Iterates like Python's iter(): list items, dict keys, string characters; undefined is empty.
  std::vector<Value> iterate(const Value& v);
  [[noreturn]] static void fail_undefined(const Value& v);

 private:
  enum class Flow { Normal, Break, Continue };

  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_for(const Stmt& s);
  void exec_set(const Stmt& s);
  Value define_macro(const Stmt& s, const Body* caller_body);
  Value call_macro(const Stmt& s, const ScopePtr& closure, CallArgs& args, Value caller);
  // The text `body` writes, as a string keeping its trusted spans.
  Value capture(const Body& body, Flow* flow = nullptr, bool safe = false);
  void emit(std::string_view text, bool trusted);
  void emit_value(const Value& v);  // strings keep their trusted spans; anything else is untrusted
  void assign(const std::vector<std::string>& targets, bool unpack, const Value& value);

  Value eval(const Expr& e);
  Value eval_inner(const Expr& e);
  Value eval_binary(const std::string& op, const Value& a, const Value& b);
  bool eval_compare(const std::string& op, const Value& a, const Value& b);
  Value eval_call(const Expr& e);
  Value eval_filter(const Expr& e, const Value* block_input);
  void eval_args(const Expr& e, size_t first, CallArgs& out);

  const Options& options_;
  ScopePtr globals_;
  ScopePtr scope_;
  Rendered* out_ = nullptr;
  int64_t steps_ = 0;
  int64_t loop_iterations_ = 0;
  int call_depth_ = 0;
};

// Whether every argument is a trusted_input (the result may then be trusted).
bool all_trusted(const CallArgs& args);

// ---- jinja_builtins.cpp ----
Value builtin_filter(Interpreter& in, const std::string& name, const Value& value, CallArgs& args);
bool builtin_test(Interpreter& in, const std::string& name, const Value& value, CallArgs& args);
bool is_builtin_filter(const std::string& name);
bool is_builtin_test(const std::string& name);
// obj.name: dict keys, string/dict methods, namespace attributes; undefined when missing.
Value get_attr(Interpreter& in, const Value& obj, const std::string& name);
// obj[key]: indexes, keys, slices (key is a 3-item tuple marked by `slice`).
Value get_item(Interpreter& in, const Value& obj, const Value& key);
Value slice(Interpreter& in, const Value& obj, const Value& start, const Value& stop, const Value& step);
void add_globals(Scope& globals, const Options& options);

}  // namespace tessera::jinja
