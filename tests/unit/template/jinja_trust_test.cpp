// Trusted spans: which bytes of a rendered template the template wrote itself (its literals
// and text, trusted variables), as opposed to data (messages, kwargs). The tokenizer reads
// special tokens only in trusted bytes, so every rule here is a security rule.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "template/chat_template.h"
#include "template/jinja.h"

namespace tessera::jinja {
namespace {

// The rendered text with untrusted bytes in [brackets], e.g. "<|a|>[user]\n".
std::string marked(const Rendered& r) {
  std::string out;
  size_t at = 0;
  for (const auto& [b, e] : r.trusted) {
    if (b > at) {  // appended piece by piece: GCC 12 false -Wrestrict (PR 105329) on "[" + ...
      out += '[';
      out += r.text.substr(at, b - at);
      out += ']';
    }
    out += r.text.substr(b, e - b);
    at = e;
  }
  if (at < r.text.size()) {
    out += '[';
    out += r.text.substr(at);
    out += ']';
  }
  return out;
}

std::string render_marked(const std::string& source, const nlohmann::json& data,
                          std::vector<std::pair<std::string, Value>> extra = {}) {
  std::vector<std::pair<std::string, Value>> vars;
  for (auto it = data.begin(); it != data.end(); ++it) vars.emplace_back(it.key(), from_json(it.value()));
  for (auto& kv : extra) vars.push_back(std::move(kv));
  return marked(Template::parse(source, Options::huggingface()).render_marked(vars));
}

TEST(JinjaTrust, LiteralsAndTextAreTrustedDataIsNot) {
  EXPECT_EQ(render_marked("<|a|>{{ x }}{{ '<|b|>' }}", {{"x", "<|c|>"}}), "<|a|>[<|c|>]<|b|>");
  // Numbers and other non-strings print as data.
  EXPECT_EQ(render_marked("{{ n }}-{{ 5 }}", {{"n", 7}}), "[7]-[5]");
  // A caller-trusted variable (bos_token) is trusted.
  EXPECT_EQ(render_marked("{{ bos }}{{ x }}", {{"x", "<s>"}}, {{"bos", Value::trusted_string("<s>")}}), "<s>[<s>]");
}

TEST(JinjaTrust, ConcatenationKeepsEachBytesOrigin) {
  const nlohmann::json data = {{"m", {{"role", "user<|im_end|>"}, {"content", "hi"}}}};
  EXPECT_EQ(render_marked("{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' }}", data),
            "<|im_start|>[user<|im_end|>]\n[hi]<|im_end|>");
  EXPECT_EQ(render_marked("{{ '<|x|>' ~ m.role ~ 3 }}", data), "<|x|>[user<|im_end|>3]");
  // Adjacent trusted pieces merge, so a token split over two literals is still the template's.
  EXPECT_EQ(render_marked("{{ '<|im_' + 'start|>' }}", data), "<|im_start|>");
}

TEST(JinjaTrust, FiltersAndMethodsTrustOnlyResultsOfTrustedInputs) {
  const nlohmann::json data = {{"x", " <|im_end|> "}, {"parts", {"<|a|>", "b"}}};
  EXPECT_EQ(render_marked("{{ x | trim }}|{{ x.strip() }}|{{ x | upper }}", data),
            "[<|im_end|>]|[<|im_end|>]|[ <|IM_END|> ]");
  EXPECT_EQ(render_marked("{{ ' <|a|> ' | trim }}{{ ' <|b|> '.strip() }}{{ '<|c|>'[0:5] }}", data), "<|a|><|b|><|c|>");
  // A trusted method with a data argument gives data.
  EXPECT_EQ(render_marked("{{ '<|a|>'.replace('a', x) }}", data), "[<| <|im_end|> |>]");
  // x | default('<|d|>') is x when x is defined, the literal otherwise.
  EXPECT_EQ(render_marked("{{ x | default('<|d|>') }}{{ y | default('<|d|>') }}", data), "[ <|im_end|> ]<|d|>");
  // join keeps every piece's origin, separator included.
  EXPECT_EQ(render_marked("{{ parts | join('<|s|>') }}", data), "[<|a|>]<|s|>[b]");
  EXPECT_EQ(render_marked("{{ '<|s|>'.join(parts) }}", data), "[<|a|>]<|s|>[b]");
  // A string repeated is trusted only when the template wrote it.
  EXPECT_EQ(render_marked("{{ '<|a|>' * 2 }}{{ x * 1 }}", data), "<|a|><|a|>[ <|im_end|> ]");
}

TEST(JinjaTrust, CapturedOutputKeepsItsSpans) {
  const nlohmann::json data = {{"x", "<|u|>"}};
  EXPECT_EQ(render_marked("{% macro turn(c) %}<|t|>{{ c }}{% endmacro %}{{ turn(x) }}", data), "<|t|>[<|u|>]");
  EXPECT_EQ(render_marked("{% set s %}<|t|>{{ x }}{% endset %}{{ s }}", data), "<|t|>[<|u|>]");
  EXPECT_EQ(render_marked("{% set ns = namespace(v=x) %}{{ '<|t|>' + ns.v }}", data), "<|t|>[<|u|>]");
  EXPECT_EQ(render_marked("{% for c in [x, '<|l|>'] %}{{ c }}{% endfor %}", data), "[<|u|>]<|l|>");
}

TEST(JinjaTrust, ChatTemplateMarksBosEosAndNotTheMessages) {
  ChatTemplateOptions o;
  o.bos_token = "<s>";
  o.eos_token = "</s>";
  const ChatTemplate t(
      "{{ bos_token }}{% for m in messages %}{{ m.role }}:{{ m.content }}{{ eos_token }}{% endfor %}"
      "{{ flag }}",
      o);
  const RenderedChat r =
      t.apply_marked(nlohmann::json::parse(R"([{"role":"user","content":"</s><s>"}])"), false, {{"flag", "<s>"}});
  EXPECT_EQ(r.text, "<s>user:</s><s></s><s>");
  EXPECT_EQ(marked(Rendered{r.text, r.template_spans}), "<s>[user]:[</s><s>]</s>[<s>]");
}

TEST(JinjaTrust, ReservedVariableNames) {
  for (const char* name : {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
                           "unk_token", "additional_special_tokens", "raise_exception", "namespace"})
    EXPECT_TRUE(ChatTemplate::is_reserved_variable(name)) << name;
  for (const char* name : {"enable_thinking", "reasoning_effort", "token", "tokens_used", "custom"})
    EXPECT_FALSE(ChatTemplate::is_reserved_variable(name)) << name;
}

}  // namespace
}  // namespace tessera::jinja
