// Sandbox limits (each exceeded one names itself), error positions, and value printing that the
// language fixtures do not reach.
#include <cmath>
#include <iterator>
#include <random>

#include "template/jinja.h"
#include "template_test_util.h"

namespace tessera::jinja {
namespace {

std::string render_error(const std::string& src, const Options& options = Options{}) {
  try {
    Template::parse(src, options).render(nlohmann::json::object());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

#define EXPECT_ERROR_HAS(src, options, needle)                                          \
  do {                                                                                  \
    const std::string err_ = render_error(src, options);                                \
    EXPECT_NE(err_.find(needle), std::string::npos) << (src) << " -> '" << err_ << "'"; \
  } while (0)

TEST(JinjaLimits, MaxSteps) {
  Options o;
  o.limits.max_steps = 1000;
  EXPECT_ERROR_HAS("{% for i in range(600) %}{{ i }}{% endfor %}", o, "max_steps exceeded");
  EXPECT_EQ(render_error("{% for i in range(100) %}{{ i }}{% endfor %}", o), "");
  // Bulk work inside one expression counts too.
  EXPECT_ERROR_HAS("{{ ('x' * 5000) | length }}", o, "max_steps exceeded");
  EXPECT_ERROR_HAS("{{ ([1] * 5000) | length }}", o, "max_steps exceeded");
}

TEST(JinjaLimits, MaxOutputBytes) {
  Options o;
  o.limits.max_output_bytes = 1000;
  EXPECT_ERROR_HAS("{% for i in range(200) %}xxxxxxxxxx{% endfor %}", o, "max_output_bytes exceeded");
  // Strings built without output are bounded as well (doubling would reach 2^40 bytes).
  EXPECT_ERROR_HAS("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", o,
                   "max_output_bytes exceeded");
  EXPECT_ERROR_HAS("{% set s = 'abc' * 100000 %}", o, "max_output_bytes exceeded");
  EXPECT_EQ(render_error("{% for i in range(90) %}xxxxxxxxxx{% endfor %}", o), "");
}

TEST(JinjaLimits, MaxRecursionDepth) {
  Options o;
  EXPECT_ERROR_HAS("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", o, "max_recursion_depth exceeded");
  EXPECT_ERROR_HAS("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}", o,
                   "max_recursion_depth exceeded");
  std::string nested;
  for (int i = 0; i < 200; ++i) nested += "{% if true %}";
  EXPECT_ERROR_HAS(nested, o, "max_recursion_depth exceeded");
  o.limits.max_recursion_depth = 5;
  EXPECT_ERROR_HAS("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(10) }}", o,
                   "max_recursion_depth exceeded");
  EXPECT_EQ(render_error("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", o), "");
}

TEST(JinjaLimits, MaxLoopIterations) {
  Options o;
  o.limits.max_loop_iterations = 1000;
  // Counted over all loops of a render: 40 x 40 = 1600 iterations, each loop small.
  EXPECT_ERROR_HAS("{% for i in range(40) %}{% for j in range(40) %}{% endfor %}{% endfor %}", o,
                   "max_loop_iterations exceeded");
  EXPECT_EQ(render_error("{% for i in range(30) %}{% for j in range(30) %}{% endfor %}{% endfor %}", o), "");
}

TEST(JinjaLimits, MaxRangeSize) {
  Options o;
  EXPECT_ERROR_HAS("{{ range(100001) | length }}", o, "max_range_size exceeded");
  EXPECT_ERROR_HAS("{{ range(0, 10000000, 2) | length }}", o, "max_range_size exceeded");
  EXPECT_EQ(render_error("{{ range(100000) | length }}", o), "");
  o.limits.max_range_size = 10;
  EXPECT_ERROR_HAS("{{ range(11) | list }}", o, "max_range_size exceeded");
}

TEST(JinjaLimits, ValueNestingIsBounded) {
  EXPECT_ERROR_HAS("{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}",
                   Options{}, "nested deeper than");
  nlohmann::json deep = 1;
  for (int i = 0; i < 300; ++i) deep = nlohmann::json::array({deep});
  EXPECT_THROW(Template::parse("{{ x }}").render(nlohmann::json{{"x", deep}}), Error);
}

TEST(JinjaErrors, CarryLineAndColumn) {
  EXPECT_EQ(render_error("line one\n  {{ 1 + }}"), "line 2, column 10: unexpected 'end of print statement'");
  EXPECT_EQ(render_error("{% for x in [1] %}\n{% endif %}"),
            "line 2, column 1: Encountered unknown tag 'endif'. Jinja was looking for the following tags: 'endfor' or "
            "'else'. The innermost block that needs to be closed is 'for'.");
  EXPECT_EQ(render_error("ab\n\n   {{ 1 // 0 }}"), "line 3, column 9: integer division or modulo by zero");
  EXPECT_EQ(render_error("é{{ missing.attr }}"), "line 1, column 13: 'missing' is undefined");
  EXPECT_EQ(render_error("{{ 'unterminated }}"), "line 1, column 4: unexpected end of string literal");
  EXPECT_EQ(render_error("{% include 'x.j2' %}"),
            "line 1, column 1: 'include' is not supported: chat templates have no loader");
  EXPECT_EQ(render_error("{% for x in [1] recursive %}{% endfor %}"),
            "line 1, column 17: recursive for loops are not supported");
}

TEST(JinjaValues, FloatsPrintLikePythonRepr) {
  // Python: [repr(x) for x in (...)]
  const std::pair<double, const char*> cases[] = {{0.1, "0.1"},
                                                  {1.0 / 3, "0.3333333333333333"},
                                                  {1e22, "1e+22"},
                                                  {123456789012345678.0, "1.2345678901234568e+17"},
                                                  {1e-7, "1e-07"},
                                                  {0.000123, "0.000123"},
                                                  {-2.5, "-2.5"},
                                                  {5e-324, "5e-324"},
                                                  {1.7976931348623157e308, "1.7976931348623157e+308"},
                                                  {100.0, "100.0"},
                                                  {9999999999999998.0, "9999999999999998.0"},
                                                  {INFINITY, "inf"},
                                                  {-INFINITY, "-inf"},
                                                  {NAN, "nan"}};
  for (const auto& [d, want] : cases) EXPECT_EQ(format_float(d), want);
}

TEST(JinjaValues, JsonDumpsLikePython) {
  // Python: json.dumps(x, ensure_ascii=...) for the same values
  const Value v =
      from_json(nlohmann::ordered_json::parse(R"({"z": [1, 2.0, -0.5], "a": {"é": "\u2028\u0000"}, "n": null})"));
  EXPECT_EQ(to_json(v, JsonDumpOptions{}), "{\"z\": [1, 2.0, -0.5], \"a\": {\"é\": \"\u2028\\u0000\"}, \"n\": null}");
  JsonDumpOptions ascii;
  ascii.ensure_ascii = true;
  ascii.sort_keys = true;
  EXPECT_EQ(to_json(v, ascii), "{\"a\": {\"\\u00e9\": \"\\u2028\\u0000\"}, \"n\": null, \"z\": [1, 2.0, -0.5]}");
  EXPECT_EQ(to_json(Value(std::string("😀")), ascii), "\"\\ud83d\\ude00\"");
  EXPECT_THROW(to_json(Value(), JsonDumpOptions{}), Error);
}

TEST(JinjaValues, ReprOfStrings) {
  EXPECT_EQ(repr_string("it's"), "\"it's\"");
  EXPECT_EQ(repr_string("a'\"b"), "'a\\'\"b'");
  EXPECT_EQ(repr_string("\x01\x7f\n\u00e9\u200b"), "'\\x01\\x7f\\n\u00e9\\u200b'");
}

}  // namespace
}  // namespace tessera::jinja

namespace tessera::jinja {
namespace {

// Random token soup: every input either renders or throws tessera::Error; nothing else escapes
// (no crash, no std::out_of_range, no hang) under small limits.
TEST(JinjaRobustness, RandomTemplatesOnlyThrowErrors) {
  const char* pieces[] = {"{{",         "}}",     "{%",          "%}",       "{#",
                          "#}",         "-",      "+",           " ",        "\n",
                          "if",         "elif",   "else",        "endif",    "for",
                          "in",         "endfor", "set",         "=",        "macro",
                          "endmacro",   "m(",     "x",           "ns.a",     "namespace(a=1)",
                          "(",          ")",      "[",           "]",        "{",
                          "}",          ":",      "'s'",         "\"q\"",    "|",
                          "trim",       "tojson", "length",      "1",        "-2",
                          "3.5",        ".",      ",",           "~",        "*",
                          "/",          "//",     "%",           "**",       "range(",
                          "loop.index", "is",     "defined",     "not",      "and",
                          "or",         "none",   "[1,2][::-1]", "messages", "raw",
                          "endraw",     "break"};
  std::mt19937 rng(1234);
  Options options = Options::huggingface();
  options.limits.max_steps = 20'000;
  options.limits.max_output_bytes = 4096;
  options.limits.max_loop_iterations = 2000;
  const nlohmann::json context = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"x", {1, "a", nullptr}}};
  int rendered = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string src;
    const int n = static_cast<int>(rng() % 24);
    for (int k = 0; k < n; ++k) src += pieces[rng() % std::size(pieces)];
    try {
      Template::parse(src, options).render(context);
      ++rendered;
    } catch (const Error&) {
    } catch (...) {
      ADD_FAILURE() << "non-tessera exception for: " << src;
    }
  }
  EXPECT_GT(rendered, 100);  // the soup is not all syntax errors
}

}  // namespace
}  // namespace tessera::jinja
