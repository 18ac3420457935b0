// SSE framing and OpenAI chunk parsing, fed in every possible split.
#include <gtest/gtest.h>

#include "benchharness/sse.h"

namespace tessera::bench {
namespace {

std::vector<std::string> parse_all(const std::vector<std::string>& pieces) {
  std::vector<std::string> events;
  SseParser p([&](std::string_view d) { events.emplace_back(d); });
  for (const auto& piece : pieces) p.feed(piece);
  return events;
}

TEST(BenchSse, EventsSurviveEverySplitPoint) {
  const std::string stream =
      ": keep-alive comment\r\n\r\n"
      "data: {\"a\":1}\r\n\r\n"
      "event: message\nid: 7\ndata:{\"b\":2}\n\n"
      "data: line1\ndata: line2\n\n"
      "retry: 10\n\n"
      "data: [DONE]\r\r";
  const std::vector<std::string> expected = {"{\"a\":1}", "{\"b\":2}", "line1\nline2", "[DONE]"};
  EXPECT_EQ(parse_all({stream}), expected);
  for (size_t cut = 0; cut <= stream.size(); ++cut)
    ASSERT_EQ(parse_all({stream.substr(0, cut), stream.substr(cut)}), expected) << "cut at " << cut;
  std::vector<std::string> bytes;
  for (char c : stream) bytes.emplace_back(1, c);
  EXPECT_EQ(parse_all(bytes), expected);
}

TEST(BenchSse, IncompleteEventIsHeld) {
  std::vector<std::string> events;
  SseParser p([&](std::string_view d) { events.emplace_back(d); });
  p.feed("data: {\"x\":1}\n");
  EXPECT_TRUE(events.empty());
  EXPECT_TRUE(p.has_partial());
  p.feed("\n");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(p.has_partial());
}

TEST(BenchSse, OpenAIChunks) {
  auto chat = parse_openai_chunk(R"({"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]})");
  EXPECT_TRUE(chat.is_json);
  EXPECT_EQ(chat.text, "Hi");
  EXPECT_FALSE(chat.has_usage);
  auto role = parse_openai_chunk(R"({"choices":[{"index":0,"delta":{"role":"assistant"}}]})");
  EXPECT_EQ(role.text, "");
  auto comp = parse_openai_chunk(R"({"choices":[{"index":0,"text":" world","finish_reason":"length"}]})");
  EXPECT_EQ(comp.text, " world");
  EXPECT_EQ(comp.finish_reason, "length");
  auto usage = parse_openai_chunk(
      R"({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":34,"total_tokens":46},"timings":{"queue_ms":2.5}})");
  EXPECT_TRUE(usage.has_usage);
  EXPECT_EQ(usage.prompt_tokens, 12);
  EXPECT_EQ(usage.completion_tokens, 34);
  EXPECT_DOUBLE_EQ(usage.queue_ms, 2.5);
  EXPECT_TRUE(parse_openai_chunk("[DONE]").done);
  auto err = parse_openai_chunk(R"({"error":{"message":"KV cache full","type":"server_error"}})");
  EXPECT_EQ(err.error, "KV cache full");
  auto junk = parse_openai_chunk("not json {");
  EXPECT_FALSE(junk.is_json);
  EXPECT_FALSE(junk.done);
  auto null_usage = parse_openai_chunk(R"({"choices":[{"delta":{"content":"x"}}],"usage":null})");
  EXPECT_FALSE(null_usage.has_usage);
}

}  // namespace
}  // namespace tessera::bench
