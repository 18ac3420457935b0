#include "template/jinja_parser.h"

#include <algorithm>
#include <initializer_list>
#include <string_view>

#include "core/error.h"

namespace tessera::jinja {

namespace {

std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::Data:
      return "template data";
    case TokenKind::VarBegin:
      return "begin of print statement";
    case TokenKind::VarEnd:
      return "end of print statement";
    case TokenKind::BlockBegin:
      return "begin of statement block";
    case TokenKind::BlockEnd:
      return "end of statement block";
    case TokenKind::End:
      return "end of template";
    case TokenKind::String:
      return "string";
    case TokenKind::Int:
      return "integer";
    case TokenKind::Float:
      return "float";
    default:
      return t.text;
  }
}

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, int max_nesting) : toks_(tokens), max_nesting_(max_nesting) {}

  Body parse_template() {
    std::string found;
    Body body = parse_body({}, found, "");
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& cur() const { return toks_[i_]; }
  const Token& peek(size_t k = 1) const { return toks_[std::min(i_ + k, toks_.size() - 1)]; }
  const Token& next() { return toks_[i_ < toks_.size() - 1 ? i_++ : i_]; }
  bool is_op(std::string_view op) const { return cur().kind == TokenKind::Op && cur().text == op; }
  bool is_name(std::string_view n) const { return cur().kind == TokenKind::Name && cur().text == n; }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view n) {
    if (!is_name(n)) return false;
    next();
    return true;
  }
  [[noreturn]] void fail_here(const std::string& msg) const { fail_at(cur().pos, msg); }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail_here("expected token '" + std::string(op) + "', got '" + describe(cur()) + "'");
  }
  std::string expect_name() {
    if (cur().kind != TokenKind::Name) fail_here("expected token 'name', got '" + describe(cur()) + "'");
    return next().text;
  }
  void expect_block_end() {
    if (cur().kind != TokenKind::BlockEnd)
      fail_here("expected token 'end of statement block', got '" + describe(cur()) + "'");
    next();
  }

  struct DepthGuard {
    Parser& p;
    explicit DepthGuard(Parser& parser) : p(parser) {
      if (++p.depth_ > p.max_nesting_)
        p.fail_here("max_recursion_depth exceeded: template nests deeper than " + std::to_string(p.max_nesting_) +
                    " levels");
    }
    ~DepthGuard() { --p.depth_; }
  };

  // The blocks being parsed, innermost last, for jinja2's "looking for" hint on unknown tags.
  struct OpenBlock {
    Parser& p;
    OpenBlock(Parser& parser, std::initializer_list<std::string_view> enders, std::string_view block) : p(parser) {
      std::string hint;
      if (enders.size() == 0) return;
      hint = " Jinja was looking for the following tags: ";
      bool first = true;
      for (auto e : enders) {
        hint += (first ? "'" : " or '") + std::string(e) + "'";
        first = false;
      }
      hint += ". The innermost block that needs to be closed is '" + std::string(block) + "'.";
      p.open_blocks_.push_back(std::move(hint));
      pushed = true;
    }
    ~OpenBlock() {
      if (pushed) p.open_blocks_.pop_back();
    }
    bool pushed = false;
  };

  ExprPtr make(ExprKind kind, SourcePos pos) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  // ---- statements ----

  // Parses until `{% <one of enders>` (consumed up to the tag name, returned in `found`) or the
  // end of the template (only allowed when enders is empty).
  Body parse_body(std::initializer_list<std::string_view> enders, std::string& found, std::string_view block) {
    DepthGuard guard(*this);
    OpenBlock open(*this, enders, block);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.kind == TokenKind::End) {
        if (enders.size() == 0) return body;
        std::string msg = "Unexpected end of template. Jinja was looking for the following tags: ";
        bool first = true;
        for (auto e : enders) {
          msg += (first ? "'" : " or '") + std::string(e) + "'";
          first = false;
        }
        fail_at(t.pos, msg + ". The innermost block that needs to be closed is '" + std::string(block) + "'.");
      }
      if (t.kind == TokenKind::Data) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Text;
        s->pos = t.pos;
        s->text = t.text;
        body.push_back(std::move(s));
        next();
      } else if (t.kind == TokenKind::VarBegin) {
        next();
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::Output;
        s->pos = t.pos;
        s->expr = parse_tuple(true, false);
        if (cur().kind != TokenKind::VarEnd)
          fail_here("expected token 'end of print statement', got '" + describe(cur()) + "'");
        next();
        body.push_back(std::move(s));
      } else if (t.kind == TokenKind::BlockBegin) {
        next();
        if (cur().kind != TokenKind::Name) fail_here("tag name expected");
        const std::string& tag = cur().text;
        if (std::find(enders.begin(), enders.end(), tag) != enders.end()) {
          found = next().text;
          return body;
        }
        body.push_back(parse_statement(t.pos));
      } else {
        fail_here("unexpected '" + describe(t) + "'");
      }
    }
  }

  StmtPtr parse_statement(SourcePos pos) {
    auto s = std::make_unique<Stmt>();
    s->pos = pos;
    const std::string tag = next().text;
    std::string found;
    if (tag == "if") {
      s->kind = StmtKind::If;
      ExprPtr cond = parse_tuple(false, false);
      expect_block_end();
      while (true) {
        Body body = parse_body({"elif", "else", "endif"}, found, "if");
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (found == "elif") {
          cond = parse_tuple(false, false);
          expect_block_end();
        } else if (found == "else") {
          expect_block_end();
          s->else_body = parse_body({"endif"}, found, "if");
          break;
        } else {
          break;
        }
      }
    } else if (tag == "for") {
      s->kind = StmtKind::For;
      parse_targets(*s, true);
      if (!skip_name("in")) fail_here("expected token 'in', got '" + describe(cur()) + "'");
      s->expr = parse_tuple(false, false, true);
      if (skip_name("if")) s->filter = parse_expression();
      if (is_name("recursive")) fail_here("recursive for loops are not supported");
      expect_block_end();
      ++loop_depth_;
      s->body = parse_body({"endfor", "else"}, found, "for");
      --loop_depth_;
      if (found == "else") {
        expect_block_end();
        s->else_body = parse_body({"endfor"}, found, "for");
      }
    } else if (tag == "set") {
      if (cur().kind == TokenKind::Name && peek().kind == TokenKind::Op && peek().text == "." &&
          peek(2).kind == TokenKind::Name) {
        s->kind = StmtKind::Set;
        s->ns_target = next().text;
        next();
        s->name = next().text;
        expect_op("=");
        s->expr = parse_tuple(true, false);
      } else {
        parse_targets(*s, false);
        if (skip_op("=")) {
          s->kind = StmtKind::Set;
          s->expr = parse_tuple(true, false);
        } else {
          if (s->tuple_target) fail_here("a block set needs a single name");
          s->kind = StmtKind::SetBlock;
          if (is_op("|")) s->filter = parse_filter_chain(nullptr);
          expect_block_end();
          s->body = parse_body({"endset"}, found, "set");
        }
      }
    } else if (tag == "macro") {
      s->kind = StmtKind::Macro;
      s->name = expect_name();
      parse_params(*s);
      expect_block_end();
      const int saved = loop_depth_;
      loop_depth_ = 0;
      s->body = parse_body({"endmacro"}, found, "macro");
      loop_depth_ = saved;
    } else if (tag == "call") {
      s->kind = StmtKind::CallBlock;
      if (is_op("(")) parse_params(*s);
      s->expr = parse_expression();
      if (s->expr->kind != ExprKind::Call) fail_at(s->expr->pos, "expected call");
      expect_block_end();
      s->body = parse_body({"endcall"}, found, "call");
    } else if (tag == "filter") {
      s->kind = StmtKind::FilterBlock;
      s->expr = parse_filter_chain(nullptr, true);
      expect_block_end();
      s->body = parse_body({"endfilter"}, found, "filter");
    } else if (tag == "with") {
      s->kind = StmtKind::With;
      while (cur().kind != TokenKind::BlockEnd) {
        if (!s->targets.empty()) expect_op(",");
        s->targets.push_back(expect_name());
        expect_op("=");
        s->values.push_back(parse_expression());
      }
      expect_block_end();
      s->body = parse_body({"endwith"}, found, "with");
    } else if (tag == "break" || tag == "continue") {
      if (loop_depth_ == 0) fail_at(pos, "'" + tag + "' outside loop");
      s->kind = tag == "break" ? StmtKind::Break : StmtKind::Continue;
    } else if (tag == "generation") {
      s->kind = StmtKind::Generation;
      expect_block_end();
      s->body = parse_body({"endgeneration"}, found, "generation");
    } else if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" || tag == "block") {
      fail_at(pos, "'" + tag + "' is not supported: chat templates have no loader");
    } else {
      fail_at(pos, "Encountered unknown tag '" + tag + "'." + (open_blocks_.empty() ? "" : open_blocks_.back()));
    }
    // Simple statements end here; block statements consumed their opening %} before the body
    // and leave the end tag's %} here.
    expect_block_end();
    return s;
  }

  // `a`, `a, b`, `(a, b)`
  void parse_targets(Stmt& s, bool for_loop) {
    const bool paren = skip_op("(");
    while (true) {
      s.targets.push_back(expect_name());
      if (!skip_op(",")) break;
      s.tuple_target = true;
      if (paren && is_op(")")) break;
      if (!paren && (is_name("in") || is_op("="))) break;
    }
    if (paren) {
      expect_op(")");
      s.tuple_target = true;
    }
    (void)for_loop;
  }

  void parse_params(Stmt& s) {
    expect_op("(");
    while (!is_op(")")) {
      if (!s.params.empty()) expect_op(",");
      if (is_op(")")) break;
      s.params.push_back(expect_name());
      s.defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
    }
    expect_op(")");
  }

  // ---- expressions ----

  ExprPtr parse_expression(bool with_condexpr = true) { return with_condexpr ? parse_condexpr() : parse_or(); }

  // `a, b` makes a tuple; `for_iter` stops at `if` so loop filters work.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens, bool for_iter = false) {
    const SourcePos pos = cur().pos;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      const Token& t = cur();
      if (t.kind == TokenKind::VarEnd || t.kind == TokenKind::BlockEnd || (t.kind == TokenKind::Op && t.text == ")") ||
          (for_iter && is_name("if")))
        break;
      items.push_back(parse_expression(with_condexpr));
      if (is_op(","))
        is_tuple = true;
      else
        break;
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parens) fail_here("Expected an expression, got '" + describe(cur()) + "'");
    }
    auto e = make(ExprKind::Tuple, pos);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_condexpr() {
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const SourcePos pos = next().pos;
      auto e = make(ExprKind::Cond, pos);
      ExprPtr cond = parse_or();
      ExprPtr other = skip_name("else") ? parse_condexpr() : nullptr;
      e->args.push_back(std::move(cond));
      e->args.push_back(std::move(expr));
      e->args.push_back(std::move(other));
      expr = std::move(e);
    }
    return expr;
  }

  ExprPtr binary(ExprKind kind, std::string op, ExprPtr a, ExprPtr b, SourcePos pos) {
    auto e = make(kind, pos);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const SourcePos pos = next().pos;
      left = binary(ExprKind::Or, "or", std::move(left), parse_and(), pos);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const SourcePos pos = next().pos;
      left = binary(ExprKind::And, "and", std::move(left), parse_not(), pos);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      const SourcePos pos = next().pos;
      auto e = make(ExprKind::Not, pos);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const SourcePos pos = cur().pos;
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().kind == TokenKind::Op &&
          (is_op("==") || is_op("!=") || is_op("<") || is_op("<=") || is_op(">") || is_op(">="))) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().kind == TokenKind::Name && peek().text == "in") {
        next();
        next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(ExprKind::Compare, pos);
        cmp->args.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      left = binary(ExprKind::Binary, t.text, std::move(left), parse_concat(), t.pos);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token& t = next();
      left = binary(ExprKind::Binary, "~", std::move(left), parse_math2(), t.pos);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      left = binary(ExprKind::Binary, t.text, std::move(left), parse_pow(), t.pos);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token& t = next();
      left = binary(ExprKind::Binary, "**", std::move(left), parse_unary(true), t.pos);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      node = make(t.text == "-" ? ExprKind::Neg : ExprKind::Pos, t.pos);
      node->args.push_back(parse_unary(false));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.kind) {
      case TokenKind::Name: {
        next();
        auto e = make(ExprKind::Literal, t.pos);
        if (t.text == "true" || t.text == "True")
          e->value = Value(true);
        else if (t.text == "false" || t.text == "False")
          e->value = Value(false);
        else if (t.text == "none" || t.text == "None")
          e->value = Value::none();
        else {
          e->kind = ExprKind::Name;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::String: {
        auto e = make(ExprKind::Literal, t.pos);
        std::string s;
        while (cur().kind == TokenKind::String) s += next().text;  // adjacent literals join
        e->value = Value::trusted_string(std::move(s));            // the template wrote it
        return e;
      }
      case TokenKind::Int: {
        next();
        auto e = make(ExprKind::Literal, t.pos);
        e->value = Value(t.int_value);
        return e;
      }
      case TokenKind::Float: {
        next();
        auto e = make(ExprKind::Literal, t.pos);
        e->value = Value(t.float_value);
        return e;
      }
      case TokenKind::Op:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(true, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    fail_here("unexpected '" + describe(t) + "'");
  }

  ExprPtr parse_list() {
    auto e = make(ExprKind::List, next().pos);
    while (!is_op("]")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("]")) break;
      e->args.push_back(parse_expression());
    }
    expect_op("]");
    return e;
  }

  ExprPtr parse_dict() {
    auto e = make(ExprKind::Dict, next().pos);
    while (!is_op("}")) {
      if (!e->args.empty()) expect_op(",");
      if (is_op("}")) break;
      e->args.push_back(parse_expression());
      expect_op(":");
      e->args.push_back(parse_expression());
    }
    expect_op("}");
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".") || is_op("["))
        node = parse_subscript(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|"))
        node = parse_filter_chain(std::move(node));
      else if (is_name("is"))
        node = parse_test(std::move(node));
      else if (is_op("("))
        node = parse_call(std::move(node));
      else
        return node;
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token& t = next();
    if (t.text == ".") {
      const Token& attr = cur();
      if (attr.kind == TokenKind::Name) {
        next();
        auto e = make(ExprKind::Attr, attr.pos);
        e->name = attr.text;
        e->args.push_back(std::move(node));
        return e;
      }
      if (attr.kind != TokenKind::Int) fail_here("expected name or number");
      next();
      auto e = make(ExprKind::Subscript, attr.pos);  // x.0 is x[0]
      auto idx = make(ExprKind::Literal, attr.pos);
      idx->value = Value(attr.int_value);
      e->args.push_back(std::move(node));
      e->args.push_back(std::move(idx));
      return e;
    }
    std::vector<ExprPtr> subs;
    while (!is_op("]")) {
      if (!subs.empty()) expect_op(",");
      subs.push_back(parse_subscribed());
    }
    expect_op("]");
    auto e = make(ExprKind::Subscript, t.pos);
    e->args.push_back(std::move(node));
    if (subs.size() == 1) {
      e->args.push_back(std::move(subs[0]));
    } else {
      auto tup = make(ExprKind::Tuple, t.pos);
      tup->args = std::move(subs);
      e->args.push_back(std::move(tup));
    }
    return e;
  }

  ExprPtr parse_subscribed() {
    const SourcePos pos = cur().pos;
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression();
      if (!is_op(":")) return start;
    }
    next();  // ':'
    auto e = make(ExprKind::Slice, pos);
    e->args.push_back(std::move(start));
    e->args.push_back(is_op(":") || is_op("]") || is_op(",") ? nullptr : parse_expression());
    if (skip_op(":"))
      e->args.push_back(is_op("]") || is_op(",") ? nullptr : parse_expression());
    else
      e->args.push_back(nullptr);
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail_here("*args and **kwargs in calls are not supported");
      if (cur().kind == TokenKind::Name && peek().kind == TokenKind::Op && peek().text == "=") {
        std::string key = next().text;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression());
      } else {
        if (!e.kwargs.empty()) fail_here("positional argument follows keyword argument");
        e.args.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(ExprKind::Call, cur().pos);
    e->args.push_back(std::move(node));
    parse_call_args(*e);
    return e;
  }

  // `| name(args) | name ...`; a null node stands for the block's content ({% filter %}, block set).
  ExprPtr parse_filter_chain(ExprPtr node, bool start_inline = false) {
    while (is_op("|") || start_inline) {
      if (!start_inline) next();
      start_inline = false;
      const SourcePos pos = cur().pos;
      std::string name = expect_name();
      while (is_op(".")) {
        next();
        name.push_back('.');
        name += expect_name();
      }
      auto e = make(ExprKind::Filter, pos);
      e->name = std::move(name);
      e->args.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_test(ExprPtr node) {
    const SourcePos pos = next().pos;  // 'is'
    const bool negated = skip_name("not");
    auto e = make(ExprKind::Test, pos);
    e->name = expect_name();
    while (is_op(".")) {
      next();
      e->name.push_back('.');
      e->name += expect_name();
    }
    e->args.push_back(std::move(node));
    const Token& t = cur();
    if (is_op("(")) {
      parse_call_args(*e);
    } else if ((t.kind == TokenKind::Name || t.kind == TokenKind::String || t.kind == TokenKind::Int ||
                t.kind == TokenKind::Float || is_op("[") || is_op("{")) &&
               !is_name("else") && !is_name("or") && !is_name("and")) {
      if (is_name("is")) fail_here("You cannot chain multiple tests with is");
      e->args.push_back(parse_postfix(parse_primary()));
    }
    if (!negated) return e;
    auto n = make(ExprKind::Not, pos);
    n->args.push_back(std::move(e));
    return n;
  }

  const std::vector<Token>& toks_;
  size_t i_ = 0;
  int depth_ = 0;
  int max_nesting_;
  int loop_depth_ = 0;
  std::vector<std::string> open_blocks_;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, int max_nesting) { return Parser(tokens, max_nesting).parse_template(); }

}  // namespace tessera::jinja
