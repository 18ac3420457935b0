// Real chat templates (SmolLM2, Qwen 2.5, Llama 3.1/3.2, Mistral Nemo, Gemma 3) against Python
// jinja2 rendering them the way transformers does: byte-for-byte output, or the same error.
#include <atomic>
#include <thread>

#include "template/chat_template.h"
#include "template_test_util.h"

namespace tessera {
namespace {

using nlohmann::ordered_json;

ChatTemplate make_template(const ordered_json& t) {
  ChatTemplateOptions options;
  options.bos_token = t["bos_token"].get<std::string>();
  options.eos_token = t["eos_token"].get<std::string>();
  options.now = test::fixture_now;
  return ChatTemplate(test::read_template_fixture(t["file"].get<std::string>()), options);
}

TEST(ChatTemplateFixtures, MatchJinja2ByteForByte) {
  const auto fx = test::load_template_fixture("chat_templates.json");
  int checked = 0;
  for (const auto& t : fx["templates"]) {
    const ChatTemplate tmpl = make_template(t);
    for (const auto& c : t["cases"]) {
      const std::string label = t["name"].get<std::string>() + " / " + c["name"].get<std::string>();
      const bool gen = c["add_generation_prompt"].get<bool>();
      if (c.contains("expected")) {
        std::string got;
        ASSERT_NO_THROW(got = tmpl.apply(c["messages"], gen, c["extra"])) << label;
        EXPECT_EQ(got, c["expected"].get<std::string>()) << label;
      } else if (c["error_type"] == "TemplateError") {
        // raise_exception: the template's own message, unchanged
        try {
          tmpl.apply(c["messages"], gen, c["extra"]);
          ADD_FAILURE() << label << ": no exception";
        } catch (const jinja::RaisedException& e) {
          EXPECT_EQ(std::string(e.what()), c["error"].get<std::string>()) << label;
        }
      } else {
        try {
          tmpl.apply(c["messages"], gen, c["extra"]);
          ADD_FAILURE() << label << ": no exception";
        } catch (const jinja::RaisedException& e) {
          ADD_FAILURE() << label << ": unexpected raise_exception " << e.what();
        } catch (const Error& e) {
          const std::string msg = e.what();
          EXPECT_NE(msg.find("chat template: line "), std::string::npos) << label << ": " << msg;
          EXPECT_NE(msg.find(c["error"].get<std::string>()), std::string::npos) << label << ": " << msg;
        }
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 55);
}

// nlohmann::json (sorted keys) gives the same text wherever no dict is printed whole.
TEST(ChatTemplateFixtures, PlainJsonOverloadAgrees) {
  const auto fx = test::load_template_fixture("chat_templates.json");
  for (const auto& t : fx["templates"]) {
    const ChatTemplate tmpl = make_template(t);
    for (const auto& c : t["cases"]) {
      if (!c.contains("expected") || !c["extra"].empty()) continue;
      const auto messages = nlohmann::json::parse(c["messages"].dump());
      EXPECT_EQ(tmpl.apply(messages, c["add_generation_prompt"].get<bool>()), c["expected"].get<std::string>())
          << t["name"] << " / " << c["name"];
    }
  }
}

TEST(ChatTemplateFixtures, ConcurrentAppliesAreIndependent) {
  const auto fx = test::load_template_fixture("chat_templates.json");
  const auto& t = fx["templates"][1];  // qwen2.5, with tools
  const ChatTemplate tmpl = make_template(t);
  std::vector<std::thread> threads;
  std::atomic<int> mismatches{0};
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&] {
      for (int rep = 0; rep < 20; ++rep)
        for (const auto& c : t["cases"])
          if (c.contains("expected") && tmpl.apply(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]) !=
                                            c["expected"].get<std::string>())
            ++mismatches;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(ChatTemplate, ChatmlFallback) {
  const ChatTemplate tmpl(ChatTemplate::chatml_source());
  const auto messages = nlohmann::json::parse(R"([{"role":"system","content":"S"},{"role":"user","content":"Hi"}])");
  EXPECT_EQ(tmpl.apply(messages, true),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(tmpl.apply(messages, false), "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, VariablesAndOverrides) {
  ChatTemplateOptions options;  // by field: a brace list without `now` warns (missing-field-initializers)
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  const ChatTemplate tmpl(
      "{{ bos_token }}|{{ eos_token }}|{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|"
      "{{ enable_thinking | default('unset') }}|{{ messages | length }}",
      options);
  EXPECT_EQ(tmpl.apply(nlohmann::json::array(), true), "<s>|</s>|None|None|True|unset|0");
  EXPECT_EQ(
      tmpl.apply(nlohmann::json::array({{{"role", "user"}}}), false, {{"enable_thinking", false}, {"tools", {1}}}),
      "<s>|</s>|[1]|None|False|False|1");
}

TEST(ChatTemplate, ErrorsNameTheProblem) {
  try {
    ChatTemplate bad("{% for m in messages %}\n{{ m.content + }}{% endfor %}");
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("chat template: line 2, column 16: ", 0), 0u) << e.what();
  }
  const ChatTemplate tmpl("{{ raise_exception('nope: ' ~ messages[0].role) }}");
  try {
    tmpl.apply(nlohmann::json::parse(R"([{"role":"critic"}])"), true);
    ADD_FAILURE() << "no exception";
  } catch (const jinja::RaisedException& e) {
    EXPECT_STREQ(e.what(), "nope: critic");
    EXPECT_EQ(e.pos().line, 1);
  }
  EXPECT_THROW(tmpl.apply(nlohmann::json::object(), true), Error);  // messages must be an array
}

TEST(ChatTemplate, LimitsFromOptions) {
  ChatTemplateOptions small;
  small.max_output_bytes = 100;
  const ChatTemplate loud("{% for m in messages %}{{ m.content * 10 }}{% endfor %}", small);
  const auto messages = nlohmann::json::parse(R"([{"role":"user","content":"0123456789ABCDEF"}])");
  try {
    loud.apply(messages, false);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_output_bytes"), std::string::npos) << e.what();
  }
  ChatTemplateOptions few;
  few.max_steps = 50;
  const ChatTemplate busy("{% for i in range(1000) %}{{ i }}{% endfor %}", few);
  try {
    busy.apply(nlohmann::json::array(), false);
    ADD_FAILURE() << "no exception";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("max_steps"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tessera
