// The tool-calling fields of a chat request: each malformed one is a 400 naming it; valid ones
// reach the template (tools as given, tool_calls arguments as objects), and tool_choice
// required / named compiles a grammar whose every accepted output parses as calls.
#include <gtest/gtest.h>

#include "api_test_util.h"
#include "grammar/grammar.h"
#include "server/api/json_fields.h"
#include "server/api/prompt_input.h"
#include "server/api/tool_parser.h"
#include "server/api/tool_request.h"

using namespace tessera;
using namespace tessera::api;
using api_test::expect_api_error;

namespace {

const json kWeather = json::parse(R"({"type": "function", "function": {"name": "get_weather",
  "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"},
  "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"]}}})");
const json kTime = json::parse(R"({"type": "function", "function": {"name": "get_time"}})");

json chat_body(json extra) {
  json body = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 4}};
  for (auto it = extra.begin(); it != extra.end(); ++it) body[it.key()] = it.value();
  return body;
}

void expect_bad(const json& extra, const std::string& param, const std::string& code) {
  SCOPED_TRACE(extra.dump());
  const ServedModel model = api_test::served_model();
  const ApiError e = expect_api_error([&] { parse_chat_request(chat_body(extra), model); });
  EXPECT_EQ(e.status, 400) << e.what();
  EXPECT_EQ(e.param.value_or("<null>"), param) << e.what();
  EXPECT_EQ(e.code.value_or("<null>"), code) << e.what();
}

}  // namespace

TEST(ToolRequest, MalformedToolsAreRefusedByField) {
  json no_name = kWeather;
  no_name["function"].erase("name");
  json bad_name = kWeather;
  bad_name["function"]["name"] = "get weather!";
  json bad_type = kWeather;
  bad_type["type"] = "retrieval";
  json bad_params = kWeather;
  bad_params["function"]["parameters"] = "object";
  json bad_schema_type = kWeather;
  bad_schema_type["function"]["parameters"]["type"] = 3;
  expect_bad({{"tools", kWeather}}, "tools", "invalid_type");
  expect_bad({{"tools", {kWeather, 1}}}, "tools[1]", "invalid_type");
  expect_bad({{"tools", {no_name}}}, "tools[0].function.name", "missing_required_parameter");
  expect_bad({{"tools", {bad_name}}}, "tools[0].function.name", "invalid_value");
  expect_bad({{"tools", {bad_type}}}, "tools[0].type", "invalid_value");
  expect_bad({{"tools", {json{{"type", "function"}}}}}, "tools[0].function", "missing_required_parameter");
  expect_bad({{"tools", {bad_params}}}, "tools[0].function.parameters", "invalid_type");
  expect_bad({{"tools", {bad_schema_type}}}, "tools[0].function.parameters", "invalid_value");
  expect_bad({{"tools", {kWeather, kTime, kWeather}}}, "tools[2].function.name", "invalid_value");
}

TEST(ToolRequest, ToolChoiceIsChecked) {
  const json tools = {kWeather, kTime};
  expect_bad({{"tools", tools}, {"tool_choice", "sometimes"}}, "tool_choice", "invalid_value");
  expect_bad({{"tools", tools}, {"tool_choice", 1}}, "tool_choice", "invalid_type");
  expect_bad({{"tool_choice", "required"}}, "tool_choice", "invalid_value");
  expect_bad({{"tools", tools}, {"tool_choice", {{"type", "function"}, {"function", {{"name", "nope"}}}}}},
             "tool_choice.function.name", "invalid_value");
  expect_bad({{"tools", tools}, {"tool_choice", {{"type", "function"}}}}, "tool_choice.function",
             "missing_required_parameter");
  expect_bad({{"tools", tools}, {"parallel_tool_calls", "yes"}}, "parallel_tool_calls", "invalid_type");
  expect_bad({{"functions", json::array({kTime["function"]})}}, "functions", "unsupported_parameter");
  // required / named need a grammar compiler, which this model has none of.
  expect_bad({{"tools", tools}, {"tool_choice", "required"}}, "tool_choice", "unsupported_parameter");
}

TEST(ToolRequest, TemplateWithoutToolSupportRefusesTools) {
  ServedModel model = api_test::served_model();
  model.tool_format = std::nullopt;  // a template that never reads `tools`, no --tool-call-parser
  const ApiError e = expect_api_error([&] { parse_chat_request(chat_body({{"tools", {kWeather}}}), model); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param.value_or(""), "tools") << e.what();
  EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  // Asking for no tool use reads nothing: the request is answered.
  const GenerationPlan plan = parse_chat_request(chat_body({{"tools", {kWeather}}, {"tool_choice", "none"}}), model);
  EXPECT_FALSE(plan.tool_format);
}

TEST(ToolRequest, ChoicesAndDefaults) {
  const json tools_only = {{"tools", {kWeather}}};
  const Fields none_given(tools_only);
  EXPECT_EQ(parse_tool_request(none_given).choice, ToolChoice::Auto);
  EXPECT_TRUE(parse_tool_request(none_given).parse_output());
  const json body = {{"tools", {kWeather, kTime}},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}},
                     {"parallel_tool_calls", false}};
  const ToolRequest r = parse_tool_request(Fields(body));
  EXPECT_EQ(r.choice, ToolChoice::Named);
  EXPECT_EQ(r.named, "get_time");
  EXPECT_FALSE(r.parallel);
  EXPECT_TRUE(r.constrained());
  const ToolRequest off = parse_tool_request(Fields(json{{"tools", {kWeather}}, {"tool_choice", "none"}}));
  EXPECT_FALSE(off.parse_output());
  EXPECT_FALSE(off.tools.is_null());  // still rendered, as vLLM does
  EXPECT_FALSE(parse_tool_request(Fields(json{{"tools", json::array()}})).parse_output());
}

TEST(ToolRequest, TemplateGetsToolsAndToolCallArgumentsAsObjects) {
  ServedModel model = api_test::served_model();
  json seen_messages, seen_extra;
  model.chat = [&](const json& messages, bool add, const json& extra) {
    seen_messages = messages;
    seen_extra = extra;
    return api_test::chatml(messages, add, extra);
  };
  const json messages = json::parse(R"([
    {"role": "user", "content": "Weather in Oslo?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\", \"days\": 2}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}])");
  const GenerationPlan plan = parse_chat_request(chat_body({{"messages", messages}, {"tools", {kWeather}}}), model);
  // In the client's key order (ordered_json compares order too).
  EXPECT_EQ(seen_extra["tools"], json::array({kWeather}));
  EXPECT_EQ(seen_messages[1]["tool_calls"][0]["function"]["arguments"], json({{"city", "Oslo"}, {"days", 2}}));
  EXPECT_EQ(seen_messages[2]["role"], "tool");
  ASSERT_TRUE(plan.tool_format.has_value());
  EXPECT_EQ(*plan.tool_format, ToolFormat::Hermes);

  json bad = messages;
  bad[1]["tool_calls"][0]["function"]["arguments"] = "{not json";
  expect_bad({{"messages", bad}}, "messages[1].tool_calls[0].function.arguments", "invalid_value");
  bad = messages;
  bad[2]["tool_call_id"] = 7;
  expect_bad({{"messages", bad}}, "messages[2].tool_call_id", "invalid_type");
  bad = messages;
  bad[0]["tool_calls"] = messages[1]["tool_calls"];
  expect_bad({{"messages", bad}}, "messages[0].tool_calls", "invalid_value");
}

namespace {

class ToolGrammarTest : public ::testing::Test {
 protected:
  void SetUp() override { compiler_ = std::make_unique<GrammarCompiler>(tok(), tok().vocab_size(), 2); }
  static const Tokenizer& tok() { return api_test::smollm2_tokenizer(); }
  // Whether the grammar accepts `text` token by token and is then complete.
  bool accepts(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
    GrammarMatcher m(g);
    for (const int32_t t : tok().encode(text, false, false))
      if (!m.accept(t)) return false;
    TokenBitmask mask(static_cast<size_t>(token_bitmask_words(m.vocab_size())));
    m.fill_next_token_bitmask(mask);
    return token_bitmask_allows(mask, tok().eos_id());
  }
  std::unique_ptr<GrammarCompiler> compiler_;
};

}  // namespace

TEST_F(ToolGrammarTest, RequiredAcceptsWellFormedCallsOnly) {
  ToolRequest r = parse_tool_request(Fields(json{{"tools", {kWeather, kTime}}, {"tool_choice", "required"}}));
  const auto g = tool_call_compiled_grammar(r, ToolFormat::Hermes, compiler_.get());
  ASSERT_TRUE(g);
  const std::string one =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}"
      "\n</tool_call>";
  const std::string two = one + "\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  EXPECT_TRUE(accepts(g, one));
  EXPECT_TRUE(accepts(g, two));
  EXPECT_EQ(parse_tool_output(ToolFormat::Hermes, two).calls.size(), 2u);
  EXPECT_FALSE(accepts(g, "Sure!"));
  EXPECT_FALSE(accepts(g,
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 9}}"
                       "\n</tool_call>"));  // days out of range
  EXPECT_FALSE(accepts(g, "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>"));
  r.parallel = false;
  const auto single = tool_call_compiled_grammar(r, ToolFormat::Hermes, compiler_.get());
  EXPECT_TRUE(accepts(single, one));
  EXPECT_FALSE(accepts(single, two));
}

TEST_F(ToolGrammarTest, NamedAndOtherFormats) {
  const json body = {{"tools", {kWeather, kTime}},
                     {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_weather"}}}}}};
  const ToolRequest r = parse_tool_request(Fields(body));
  const auto llama = tool_call_compiled_grammar(r, ToolFormat::Llama3Json, compiler_.get());
  const std::string call = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\", \"days\": 1}}";
  EXPECT_TRUE(accepts(llama, call));
  EXPECT_FALSE(accepts(llama, "{\"name\": \"get_time\", \"parameters\": {}}"));
  EXPECT_EQ(parse_tool_output(ToolFormat::Llama3Json, call).calls.size(), 1u);
  const auto mistral = tool_call_compiled_grammar(r, ToolFormat::Mistral, compiler_.get());
  const std::string list = "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"days\": 1}}]";
  EXPECT_TRUE(accepts(mistral, list));
  EXPECT_EQ(parse_tool_output(ToolFormat::Mistral, list).calls.size(), 1u);
}

TEST_F(ToolGrammarTest, UncompilableSchemaIsNamed) {
  json bad = kWeather;
  bad["function"]["parameters"] = json{{"type", "object"}, {"properties", {{"x", {{"$ref", "#/nowhere"}}}}}};
  const ToolRequest r = parse_tool_request(Fields(json{{"tools", {kTime, bad}}, {"tool_choice", "required"}}));
  const ApiError e = expect_api_error([&] { tool_call_compiled_grammar(r, ToolFormat::Hermes, compiler_.get()); });
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param.value_or(""), "tools[1].function.parameters") << e.what();
}

// "auto" (Hermes): free text, or text then calls; from <tool_call> on, only a well-formed call.
// Other formats, other choices and a schema the engine cannot compile leave the output free.
TEST_F(ToolGrammarTest, AutoLeavesTextFreeAndHoldsOpenedCallsToTheirSchema) {
  ToolRequest r = parse_tool_request(Fields(json{{"tools", {kWeather, kTime}}, {"tool_choice", "auto"}}));
  const auto g = auto_tool_call_compiled_grammar(r, ToolFormat::Hermes, compiler_.get());
  ASSERT_TRUE(g);
  const std::string call =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 3}}\n</tool_call>";
  EXPECT_TRUE(accepts(g, "The weather in Oslo is mild."));
  EXPECT_TRUE(accepts(g, call));
  EXPECT_TRUE(accepts(g, "Let me look that up. " + call));
  EXPECT_FALSE(accepts(g,
                       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": 9}}"
                       "\n</tool_call>"));  // days out of range
  EXPECT_FALSE(accepts(g, "<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>"));  // no such tool
  EXPECT_FALSE(accepts(g, "<tool_call>\n{\"name\": \"get_time\""));                                  // a call left open
  EXPECT_FALSE(auto_tool_call_grammar(r, ToolFormat::Llama3Json).has_value());
  EXPECT_FALSE(auto_tool_call_grammar(r, ToolFormat::Mistral).has_value());
  ToolRequest required = r;
  required.choice = ToolChoice::Required;
  EXPECT_FALSE(auto_tool_call_grammar(required, ToolFormat::Hermes).has_value());
  EXPECT_FALSE(auto_tool_call_compiled_grammar(r, ToolFormat::Hermes, nullptr));
  json bad = kWeather;
  bad["function"]["parameters"] = json{{"type", "object"}, {"properties", {{"x", {{"$ref", "#/nowhere"}}}}}};
  const ToolRequest bad_auto = parse_tool_request(Fields(json{{"tools", {kTime, bad}}, {"tool_choice", "auto"}}));
  EXPECT_FALSE(auto_tool_call_compiled_grammar(bad_auto, ToolFormat::Hermes, compiler_.get()));
}
