#include "template/jinja.h"

#include "template/jinja_interp.h"
#include "template/jinja_lexer.h"
#include "template/jinja_parser.h"

namespace tessera::jinja {

namespace {

// Unknown filters and tests are errors when the template is compiled, as in jinja2.
void check_names(const Expr* e) {
  if (!e) return;
  if (e->kind == ExprKind::Filter && !is_builtin_filter(e->name))
    throw TemplateError(e->pos, "No filter named '" + e->name + "'.");
  if (e->kind == ExprKind::Test && !is_builtin_test(e->name))
    throw TemplateError(e->pos, "No test named '" + e->name + "'.");
  for (const auto& a : e->args) check_names(a.get());
  for (const auto& kv : e->kwargs) check_names(kv.second.get());
}

void check_names(const Body& body) {
  for (const auto& s : body) {
    check_names(s->expr.get());
    check_names(s->filter.get());
    for (const auto& [cond, b] : s->branches) {
      check_names(cond.get());
      check_names(b);
    }
    for (const auto& d : s->defaults) check_names(d.get());
    for (const auto& v : s->values) check_names(v.get());
    check_names(s->body);
    check_names(s->else_body);
  }
}

template <typename Json>
Value convert(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(convert(x));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      d.items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) d.items.emplace_back(Value(it.key()), convert(it.value()));
      return Value::dict(std::move(d));
    }
    default:
      fail("cannot pass a JSON ", j.type_name(), " to a template");
  }
}

template <typename Json>
std::vector<std::pair<std::string, Value>> variables_of(const Json& context) {
  TESSERA_CHECK(context.is_object(), "template context must be a JSON object, not ", context.type_name());
  std::vector<std::pair<std::string, Value>> vars;
  for (auto it = context.begin(); it != context.end(); ++it) vars.emplace_back(it.key(), convert(it.value()));
  return vars;
}

}  // namespace

Template Template::parse(std::string_view source, Options options) {
  Template t;
  const LexerOptions lex{options.trim_blocks, options.lstrip_blocks, options.keep_trailing_newline};
  auto body = std::make_shared<Body>(jinja::parse(tokenize(source, lex), options.limits.max_recursion_depth));
  check_names(*body);
  t.body_ = std::move(body);
  t.options_ = std::move(options);
  return t;
}

std::string Template::render(const std::vector<std::pair<std::string, Value>>& variables) const {
  return render_marked(variables).text;
}

Rendered Template::render_marked(const std::vector<std::pair<std::string, Value>>& variables) const {
  Interpreter in(options_);
  return in.render(*body_, variables);
}

std::string Template::render(const nlohmann::json& context) const { return render(variables_of(context)); }
std::string Template::render(const nlohmann::ordered_json& context) const { return render(variables_of(context)); }

Value from_json(const nlohmann::json& j) { return convert(j); }
Value from_json(const nlohmann::ordered_json& j) { return convert(j); }

}  // namespace tessera::jinja
