// Tool-call parsing: each format, several calls, malformed input, and the streaming parser
// fed the same text split at every position, which must reassemble to the one-shot parse
// with no markup in its content.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/api/tool_parser.h"
#include "template/chat_template.h"

using namespace tessera::api;
using nlohmann::json;

namespace {

struct Reassembled {
  std::string content;
  std::vector<std::string> names, arguments, ids;
};

// Feeds `pieces` in order and joins what the deltas say, as a streaming client does.
Reassembled stream(ToolFormat format, const std::vector<std::string>& pieces) {
  ToolCallParser parser(format);
  Reassembled r;
  auto take = [&](const ToolParserOutput& out) {
    r.content += out.content;
    for (const ToolCallDelta& d : out.calls) {
      if (d.first) {
        EXPECT_EQ(d.index, static_cast<int>(r.names.size()));
        EXPECT_TRUE(d.arguments.empty());
        r.names.push_back(d.name);
        r.ids.push_back(d.id);
        r.arguments.emplace_back();
      } else {
        ASSERT_LT(d.index, static_cast<int>(r.arguments.size()));
        r.arguments[d.index] += d.arguments;
      }
    }
  };
  for (const std::string& p : pieces) take(parser.push(p));
  take(parser.finish());
  return r;
}

void expect_same_at_every_split(ToolFormat format, const std::string& text) {
  const ParsedToolOutput whole = parse_tool_output(format, text);
  for (size_t a = 0; a <= text.size(); ++a) {
    SCOPED_TRACE("split at " + std::to_string(a));
    const Reassembled r = stream(format, {text.substr(0, a), text.substr(a)});
    EXPECT_EQ(r.content, whole.content);
    ASSERT_EQ(r.names.size(), whole.calls.size());
    for (size_t i = 0; i < r.names.size(); ++i) {
      EXPECT_EQ(r.names[i], whole.calls[i].name);
      EXPECT_EQ(r.arguments[i], whole.calls[i].arguments);
    }
  }
  // And one byte at a time (a token is often one or two characters).
  std::vector<std::string> bytes;
  for (const char c : text) bytes.emplace_back(1, c);
  const Reassembled r = stream(format, bytes);
  EXPECT_EQ(r.content, whole.content);
  ASSERT_EQ(r.names.size(), whole.calls.size());
  for (size_t i = 0; i < r.names.size(); ++i) EXPECT_EQ(r.arguments[i], whole.calls[i].arguments);
}

}  // namespace

TEST(ToolParser, HermesSeveralCallsAndContent) {
  const std::string text =
      "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
      "\"unit\": \"c\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": "
      "\"CET\"}}\n</tool_call>";
  const ParsedToolOutput p = parse_tool_output(ToolFormat::Hermes, text);
  EXPECT_EQ(p.content, "Let me check both.");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"city", "Paris"}, {"unit", "c"}}));
  EXPECT_EQ(p.calls[1].name, "get_time");
  EXPECT_EQ(json::parse(p.calls[1].arguments), json({{"tz", "CET"}}));
  EXPECT_TRUE(p.calls[0].id.starts_with("call_"));
  EXPECT_EQ(p.calls[0].id.size(), 5u + 24u);
  EXPECT_NE(p.calls[0].id, p.calls[1].id);
  expect_same_at_every_split(ToolFormat::Hermes, text);
}

TEST(ToolParser, HermesNestedArgumentsWithBracesInStrings) {
  const std::string text =
      "<tool_call>{\"arguments\": {\"q\": \"a}b{\\\"c\", \"list\": [1, {\"x\": [2]}]}, \"name\": \"search\"}"
      "</tool_call>";
  const ParsedToolOutput p = parse_tool_output(ToolFormat::Hermes, text);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "search");  // name after the arguments still parses
  EXPECT_EQ(json::parse(p.calls[0].arguments)["q"], "a}b{\"c");
  expect_same_at_every_split(ToolFormat::Hermes, text);
}

TEST(ToolParser, HermesArgumentsAsAStringAndNoArguments) {
  const ParsedToolOutput p = parse_tool_output(
      ToolFormat::Hermes,
      "<tool_call>{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 1}\"}</tool_call><tool_call>{\"name\": \"b\"}"
      "</tool_call>");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"k", 1}}));
  EXPECT_EQ(p.calls[1].arguments, "{}");
}

TEST(ToolParser, TextAfterACallStaysContentAndMissingEndMarkerIsAccepted) {
  const std::string text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>\n\nDone.";
  const ParsedToolOutput p = parse_tool_output(ToolFormat::Hermes, text);
  EXPECT_EQ(p.content, "Done.");
  ASSERT_EQ(p.calls.size(), 1u);
  expect_same_at_every_split(ToolFormat::Hermes, text);
  const ParsedToolOutput cut = parse_tool_output(ToolFormat::Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {}}");
  ASSERT_EQ(cut.calls.size(), 1u);  // Qwen sometimes stops before </tool_call>
}

TEST(ToolParser, PlainTextIsContentUnchangedButForTrailingWhitespace) {
  const std::string text = "No tools needed: 1 < 2 and <tool is not a marker.\n";
  const ParsedToolOutput p = parse_tool_output(ToolFormat::Hermes, text);
  EXPECT_EQ(p.content, "No tools needed: 1 < 2 and <tool is not a marker.");
  EXPECT_TRUE(p.calls.empty());
  expect_same_at_every_split(ToolFormat::Hermes, text);
}

TEST(ToolParser, MalformedCallsFallBackToContent) {
  for (const std::string text : {
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": }}</tool_call>",  // bad JSON
           "<tool_call>{\"arguments\": {}}</tool_call>",                          // no name
           "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",        // not an object
           "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1",               // cut short
           "<tool_call>not json</tool_call>",
           "before <tool_call>",
       }) {
    SCOPED_TRACE(text);
    const ParsedToolOutput p = parse_tool_output(ToolFormat::Hermes, text);
    EXPECT_EQ(p.content, text);
    EXPECT_TRUE(p.calls.empty());
  }
}

TEST(ToolParser, MalformedCallBeforeItsNameStreamsAsContent) {
  const Reassembled r = stream(ToolFormat::Hermes, {"<tool_", "call>not json</tool_call>"});
  EXPECT_EQ(r.content, "<tool_call>not json</tool_call>");
  EXPECT_TRUE(r.names.empty());
}

TEST(ToolParser, MarkupNeverReachesStreamedContent) {
  ToolCallParser parser(ToolFormat::Hermes);
  std::string content;
  for (const char* piece :
       {"Sure", ". \n", "<", "tool", "_ca", "ll>\n{\"name\": \"f\", \"arg", "uments\": {}}\n</to", "ol_call>"}) {
    content += parser.push(piece).content;
    EXPECT_EQ(content.find('<'), std::string::npos) << content;
  }
  content += parser.finish().content;
  EXPECT_EQ(content, "Sure.");
  EXPECT_EQ(parser.calls().size(), 1u);
}

TEST(ToolParser, ArgumentsStreamBeforeTheCallEnds) {
  ToolCallParser parser(ToolFormat::Hermes);
  ToolParserOutput a = parser.push("<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Pa");
  ASSERT_EQ(a.calls.size(), 2u);
  EXPECT_TRUE(a.calls[0].first);
  EXPECT_EQ(a.calls[0].name, "f");
  EXPECT_EQ(a.calls[1].arguments, "{\"city\": \"Pa");
  ToolParserOutput b = parser.push("ris\"}}</tool_call>");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].arguments, "ris\"}");
}

TEST(ToolParser, Llama3JsonWithAndWithoutPythonTag) {
  const std::string text =
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": "
      "\"get_time\", \"parameters\": {}}";
  const ParsedToolOutput p = parse_tool_output(ToolFormat::Llama3Json, text);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(p.calls[0].arguments), json({{"city", "Oslo"}}));
  EXPECT_EQ(p.calls[1].name, "get_time");
  expect_same_at_every_split(ToolFormat::Llama3Json, text);
  const std::string tagged = "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"x\": 1}}";
  const ParsedToolOutput t = parse_tool_output(ToolFormat::Llama3Json, tagged);
  ASSERT_EQ(t.calls.size(), 1u);
  EXPECT_EQ(t.content, "");
  expect_same_at_every_split(ToolFormat::Llama3Json, tagged);
  // JSON later in a sentence is content.
  const ParsedToolOutput prose = parse_tool_output(ToolFormat::Llama3Json, "Use {\"name\": \"f\"} like this.");
  EXPECT_TRUE(prose.calls.empty());
  EXPECT_EQ(prose.content, "Use {\"name\": \"f\"} like this.");
}

TEST(ToolParser, MistralWithMarkerOrBareList) {
  const std::string text =
      "[TOOL_CALLS][{\"name\": \"a\", \"arguments\": {\"n\": 1}}, {\"name\": \"b\", \"arguments\": {}}]";
  const ParsedToolOutput p = parse_tool_output(ToolFormat::Mistral, text);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].name, "b");
  expect_same_at_every_split(ToolFormat::Mistral, text);
  // Special tokens skipped: the marker is gone, the list remains.
  const std::string bare = "[{\"name\": \"a\", \"arguments\": {\"n\": 1}}]";
  ASSERT_EQ(parse_tool_output(ToolFormat::Mistral, bare).calls.size(), 1u);
  expect_same_at_every_split(ToolFormat::Mistral, bare);
  const ParsedToolOutput prose = parse_tool_output(ToolFormat::Mistral, "[1] is a footnote.");
  EXPECT_TRUE(prose.calls.empty());
  EXPECT_EQ(prose.content, "[1] is a footnote.");
}

TEST(ToolParser, FormatNamesAndDetection) {
  for (const ToolFormat f : {ToolFormat::Hermes, ToolFormat::Llama3Json, ToolFormat::Mistral})
    EXPECT_EQ(tool_format_from_name(tool_format_name(f)), f);
  EXPECT_FALSE(tool_format_from_name("pythonic"));
  auto detect = [](std::string_view source) {
    return detect_tool_format(source, tessera::ChatTemplate(source).renders_tools());
  };
  EXPECT_EQ(detect("{{ tools | tojson }}{{- '<tool_call>\\n' }}"), ToolFormat::Hermes);
  EXPECT_EQ(detect("{{ tools | tojson }}{{- '[TOOL_CALLS]' }}"), ToolFormat::Mistral);
  EXPECT_EQ(detect("{{ tools | tojson }}<|start_header_id|>ipython<|end_header_id|>"), ToolFormat::Llama3Json);
  EXPECT_EQ(detect("{% for t in tools %}{{ t.function.name }}{% endfor %}"), ToolFormat::Hermes);
  // No tool support: tools never read, named only in a comment, or a template that raises.
  EXPECT_FALSE(detect("{{ messages[0].content }}"));
  EXPECT_FALSE(detect("{# tools: not supported #}{% for m in messages %}{{ m.content }}{% endfor %}"));
  EXPECT_FALSE(detect("{{ raise_exception('no chat here') }}"));
}
