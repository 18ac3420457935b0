#pragma once
// The syntax tree the parser builds and the interpreter walks. One node type per family
// (expressions, statements) with a kind tag keeps the tree plain data.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "template/jinja_value.h"

namespace tessera::jinja {

struct SourcePos {
  int line = 1, column = 1;
};

// An error found while parsing or rendering, tied to where: what() is
// "line L, column C: <message>".
class TemplateError : public Error {
 public:
  TemplateError(SourcePos pos, const std::string& message)
      : Error("line " + std::to_string(pos.line) + ", column " + std::to_string(pos.column) + ": " + message),
        pos_(pos),
        message_(message) {}
  SourcePos pos() const { return pos_; }
  const std::string& message() const { return message_; }

 private:
  SourcePos pos_;
  std::string message_;
};

// raise_exception(msg) in a template: what() is the template's own message, unchanged.
class RaisedException : public Error {
 public:
  RaisedException(SourcePos pos, const std::string& message) : Error(message), pos_(pos) {}
  SourcePos pos() const { return pos_; }

 private:
  SourcePos pos_;
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  Literal,    // value
  Name,       // name
  List,       // args
  Tuple,      // args
  Dict,       // args: key, value, key, value, ...
  Attr,       // args[0].name
  Subscript,  // args[0][args[1]]
  Slice,      // args: start, stop, step (null when absent)
  Call,       // args[0](args[1..], kwargs)
  Filter,     // args[0] | name(args[1..], kwargs); args[0] null inside a {% filter %} block
  Test,       // args[0] is name(args[1..], kwargs)
  Not,        // not args[0]
  Neg,        // -args[0]
  Pos,        // +args[0]
  Binary,     // args[0] op args[1]: + - * / // % ** ~
  And,        // args[0] and args[1]
  Or,         // args[0] or args[1]
  Compare,    // args[0] ops[0] args[1] ops[1] args[2] ...
  Cond,       // args[1] if args[0] else args[2] (args[2] may be null: undefined)
};

struct Expr {
  ExprKind kind;
  SourcePos pos;
  Value value;       // Literal
  std::string name;  // Name, Attr, Filter, Test; Binary operator
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;  // Compare: "==", "!=", "<", "<=", ">", ">=", "in", "notin"
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class StmtKind {
  Text,         // text
  Output,       // {{ expr }}
  If,           // branches: (cond, body); a null cond is the else branch
  For,          // targets in expr [if filter] body [else else_body]
  Set,          // targets = expr, or ns_target.attr = expr
  SetBlock,     // {% set targets[0] [| filter] %}body{% endset %}
  Macro,        // name(params = defaults) body
  CallBlock,    // {% call(params) expr %}body{% endcall %}
  FilterBlock,  // {% filter expr %}body{% endfilter %}; expr is a Filter chain over null
  With,         // {% with targets = values %}body{% endwith %}
  Break,
  Continue,
  Generation,  // HF's {% generation %}body{% endgeneration %}: renders body
};

struct Stmt {
  StmtKind kind;
  SourcePos pos;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;  // For: `if` filter; SetBlock: filter chain applied to the captured text
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::string> targets;
  std::string ns_target;            // Set: `ns` of `set ns.attr = ...`
  std::string name;                 // Macro name; Set attribute name
  std::vector<std::string> params;  // Macro, CallBlock
  std::vector<ExprPtr> defaults;    // one per param, null when none
  std::vector<ExprPtr> values;      // With
  bool tuple_target = false;        // For / Set: unpack into targets
};

}  // namespace tessera::jinja
