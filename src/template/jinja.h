#pragma once
// A sandboxed Jinja2 interpreter for chat templates: jinja2's syntax and Python's value
// semantics, with no file or OS access and hard limits on work, output, recursion and loops.
// See docs/design/chat-template.md for what is covered and what is not.
#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"
#include "template/jinja_ast.h"
#include "template/jinja_value.h"

namespace tessera::jinja {

// Every exceeded limit throws tessera::Error whose message names it ("max_steps exceeded ...").
struct Limits {
  int64_t max_steps = 1'000'000;          // expression evaluations + statements + bulk element work
  size_t max_output_bytes = 1 << 20;      // the rendered text, and any string built on the way
  int max_recursion_depth = 64;           // macro call depth, and nesting of the template's syntax
  int64_t max_loop_iterations = 100'000;  // for-loop iterations, all loops of one render together
  int64_t max_range_size = 100'000;       // range() length (jinja2's sandbox MAX_RANGE)
};

struct Options {
  bool trim_blocks = false;            // drop the first newline after a block tag
  bool lstrip_blocks = false;          // strip spaces/tabs before a block tag at line start
  bool keep_trailing_newline = false;  // jinja2 drops one trailing newline by default
  // Hugging Face's environment: tojson is json.dumps(ensure_ascii=False, keys in order) instead
  // of jinja2's HTML-safe sorted one, and the globals raise_exception and strftime_now exist.
  bool hf_extensions = false;
  Limits limits;
  // strftime_now's clock (local time); empty: the system clock.
  std::function<std::tm()> now;

  // What transformers' apply_chat_template uses: ImmutableSandboxedEnvironment(trim_blocks=True,
  // lstrip_blocks=True) plus its tojson, raise_exception and strftime_now.
  static Options huggingface() {
    Options o;
    o.trim_blocks = o.lstrip_blocks = o.hf_extensions = true;
    return o;
  }
};

// Rendered text and the byte spans of it the template wrote itself (see TrustSpans): a
// tokenizer may read special tokens there and nowhere else.
struct Rendered {
  std::string text;
  TrustSpans trusted;
};

// A parsed template. Parsing throws TemplateError (syntax, with line and column); rendering
// throws TemplateError for runtime errors and exceeded limits, RaisedException for
// raise_exception(msg). Render is const and thread-safe: each call has its own interpreter.
class Template {
 public:
  static Template parse(std::string_view source, Options options = {});

  // context: a JSON object whose members become the template's variables. Use ordered_json to
  // keep object key order (tojson then prints keys as given, like Python dicts).
  std::string render(const nlohmann::json& context) const;
  std::string render(const nlohmann::ordered_json& context) const;
  // Variables as values (what the JSON overloads build).
  std::string render(const std::vector<std::pair<std::string, Value>>& variables) const;
  // The same, with the trusted spans of the text. Strings in `variables` are untrusted unless
  // built with Value::trusted_string.
  Rendered render_marked(const std::vector<std::pair<std::string, Value>>& variables) const;

  const Options& options() const { return options_; }

 private:
  Template() = default;
  std::shared_ptr<const Body> body_;
  Options options_;
};

// JSON to template values: objects become insertion-ordered dicts, integers ints, other
// numbers floats. Throws tessera::Error past kMaxValueDepth levels of nesting.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

}  // namespace tessera::jinja
