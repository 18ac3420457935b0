// One construct per case, rendered by Python jinja2 under its default environment and under
// HF's (trim_blocks, lstrip_blocks, HF tojson): same text, or an error carrying jinja2's message.
#include "template/jinja.h"
#include "template_test_util.h"

namespace tessera::jinja {
namespace {

// Where our message is worded differently we only require an error at a position: syntax
// errors jinja2 words from its own lexer state, and the sandbox's range limit, which names our
// limit instead. Everything else must contain jinja2's own message.
bool wording_differs(const std::string& jinja2_message) {
  for (const char* m : {"unexpected '}'", "Unexpected end of template", "Encountered unknown tag", "unexpected char",
                        "Range too big", "outside loop"})
    if (jinja2_message.find(m) != std::string::npos) return true;
  return false;
}

TEST(JinjaLanguage, MatchesJinja2) {
  const auto fx = test::load_template_fixture("language.json");
  int checked = 0;
  for (const auto& c : fx["cases"]) {
    const std::string src = c["source"].get<std::string>();
    const std::string label = c["env"].get<std::string>() + ": " + src;
    Options options = c["env"] == "hf" ? Options::huggingface() : Options{};
    options.now = test::fixture_now;
    std::string got, error;
    try {
      got = Template::parse(src, options).render(c["context"]);
    } catch (const RaisedException& e) {
      error = e.what();
    } catch (const TemplateError& e) {
      error = e.what();
      EXPECT_EQ(error.rfind("line ", 0), 0u) << label << ": " << error;
    }
    if (c.contains("expected")) {
      EXPECT_EQ(error, "") << label;
      EXPECT_EQ(got, c["expected"].get<std::string>()) << label;
    } else {
      const std::string want = c["error"].get<std::string>();
      EXPECT_NE(error, "") << label << " should fail with: " << want;
      if (!wording_differs(want)) {
        EXPECT_NE(error.find(want), std::string::npos) << label << ": " << error;
      }
    }
    ++checked;
  }
  EXPECT_GE(checked, 190);
}

}  // namespace
}  // namespace tessera::jinja
