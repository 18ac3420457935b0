// The JSON shapes of responses, chunks, logprobs and errors against hand-written OpenAI/vLLM
// examples (compared as parsed JSON, so key order and spacing do not matter).
#include <gtest/gtest.h>

#include "api_test_util.h"
#include "server/api/api_error.h"
#include "server/api/response_json.h"

using namespace tessera;
using namespace tessera::api;
using nlohmann::json;

namespace {
json parsed(const ojson& j) { return json::parse(j.dump()); }
}  // namespace

TEST(ApiResponseJson, ChatChunkWithRoleAndFinish) {
  const ojson first = chat_chunk("chatcmpl-1", 1700000000, "m", 0, ojson{{"role", "assistant"}, {"content", ""}},
                                 nullptr, std::nullopt);
  EXPECT_EQ(parsed(first), json::parse(R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,
    "model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null,
    "stop_reason":null}]})"));
  const ojson last = chat_chunk("chatcmpl-1", 1700000000, "m", 2, ojson::object(), nullptr, FinishReason::Length);
  EXPECT_EQ(parsed(last), json::parse(R"({"id":"chatcmpl-1","object":"chat.completion.chunk","created":1700000000,
    "model":"m","choices":[{"index":2,"delta":{},"logprobs":null,"finish_reason":"length",
    "stop_reason":null}]})"));
  EXPECT_EQ(sse_event(ojson{{"a", 1}}), "data: {\"a\":1}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(ApiResponseJson, UsageChunkAndResponses) {
  const Usage u{10, 4, 3};
  EXPECT_EQ(parsed(usage_chunk("chat.completion.chunk", "c", 5, "m", u)), json::parse(R"({"id":"c",
    "object":"chat.completion.chunk","created":5,"model":"m","choices":[],"usage":{"prompt_tokens":10,
    "completion_tokens":4,"total_tokens":14,"prompt_tokens_details":{"cached_tokens":3}}})"));
  ojson choices = ojson::array({chat_choice(0, "Hi!", nullptr, FinishReason::Stop)});
  EXPECT_EQ(parsed(chat_response("chatcmpl-9", 5, "m", choices, u)), json::parse(R"({"id":"chatcmpl-9",
    "object":"chat.completion","created":5,"model":"m","choices":[{"index":0,"message":{"role":"assistant",
    "content":"Hi!"},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":10,"completion_tokens":4,
    "total_tokens":14,"prompt_tokens_details":{"cached_tokens":3}}})"));
  ojson cchoices = ojson::array({completion_choice(1, " Paris", nullptr, FinishReason::Length)});
  EXPECT_EQ(parsed(completion_response("cmpl-2", 5, "m", cchoices, Usage{2, 1, 0})), json::parse(R"({"id":"cmpl-2",
    "object":"text_completion","created":5,"model":"m","choices":[{"index":1,"text":" Paris","logprobs":null,
    "finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3,
    "prompt_tokens_details":{"cached_tokens":0}}})"));
  EXPECT_EQ(parsed(completion_chunk("cmpl-2", 5, "m", 0, "x", nullptr, std::nullopt)), json::parse(R"({"id":"cmpl-2",
    "object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":"x","logprobs":null,
    "finish_reason":null,"stop_reason":null}]})"));
}

TEST(ApiResponseJson, StopReasonIsTheStopStringOrTokenId) {
  // vLLM's shapes: the matched stop string, or the stop_token_ids entry, as given.
  EXPECT_EQ(parsed(chat_choice(0, "Hi", nullptr, FinishReason::Stop, "###"))["stop_reason"], "###");
  EXPECT_EQ(parsed(completion_choice(0, "Hi", nullptr, FinishReason::Stop, 42))["stop_reason"], 42);
  const json chunk = parsed(chat_chunk("c", 1, "m", 0, ojson::object(), nullptr, FinishReason::Stop, 7));
  EXPECT_EQ(chunk["choices"][0]["stop_reason"], 7);
  EXPECT_EQ(
      parsed(completion_chunk("c", 1, "m", 0, "", nullptr, FinishReason::Stop, "\n\n"))["choices"][0]["stop_reason"],
      "\n\n");
}

TEST(ApiResponseJson, ChatLogprobsFormat) {
  const Tokenizer& tok = api_test::smollm2_tokenizer();
  const int32_t hello = *tok.token_id("Hello");
  const int32_t hi = *tok.token_id("Hi");
  Logprobs lp;
  lp.chosen = {hello, -0.25};
  lp.top = {{hello, -0.25}, {hi, -std::numeric_limits<double>::infinity()}};
  const json got = parsed(chat_logprobs_json(tok, std::vector<Logprobs>{lp}));
  EXPECT_EQ(got, json::parse(R"({"content":[{"token":"Hello","logprob":-0.25,"bytes":[72,101,108,108,111],
    "top_logprobs":[{"token":"Hello","logprob":-0.25,"bytes":[72,101,108,108,111]},
                    {"token":"Hi","logprob":-9999.0,"bytes":[72,105]}]}]})"));
}

TEST(ApiResponseJson, SkippedSpecialTokensAreEmptyStrings) {
  const Tokenizer& tok = api_test::smollm2_tokenizer();
  const int32_t end = *tok.token_id("<|im_end|>");
  EXPECT_EQ(token_string(tok, end, /*skip_special=*/true), "");
  EXPECT_EQ(token_string(tok, end, /*skip_special=*/false), "<|im_end|>");
  Logprobs lp{{end, -0.1}, {{end, -0.1}}};
  EXPECT_EQ(parsed(chat_logprobs_json(tok, std::vector<Logprobs>{lp}, true)), json::parse(R"({"content":[{"token":"",
    "logprob":-0.1,"bytes":[],"top_logprobs":[{"token":"","logprob":-0.1,"bytes":[]}]}]})"));
}

TEST(ApiResponseJson, CompletionLogprobsWithEchoedPrompt) {
  const Tokenizer& tok = api_test::smollm2_tokenizer();
  const int32_t a = *tok.token_id("The");
  const int32_t b = *tok.token_id("Ġcapital");  // " capital"
  // "Ġé" is the bytes 0x20 0xE9: a space and half a character, shown as U+FFFD.
  const int32_t c = *tok.token_id("Ġé");
  CompletionLogprobs lps(tok);
  lps.add(a, nullptr);  // first prompt token: no logprob
  Logprobs lb{{b, -1.5}, {{a, -0.5}}};
  lps.add(b, &lb);
  Logprobs lc{{c, -2.0}, {{c, -2.0}}};
  lps.add(c, &lc);
  EXPECT_EQ(parsed(lps.json()), json::parse(R"({"tokens":["The"," capital"," \ufffd"],
    "token_logprobs":[null,-1.5,-2.0],
    "top_logprobs":[null,{"The":-0.5," capital":-1.5},{" \ufffd":-2.0}],
    "text_offset":[0,3,11]})"));
  lps.clear_entries();
  lps.add(a, &lb);
  EXPECT_EQ(parsed(lps.json())["text_offset"], json::parse("[13]"));
}

TEST(ApiResponseJson, ErrorBodyShape) {
  const ApiError e(400, "'n' must be in [1, 8], got 9", "invalid_request_error", "n", "invalid_value");
  EXPECT_EQ(json::parse(error_response(e).body), json::parse(R"({"error":{"message":"'n' must be in [1, 8], got 9",
    "type":"invalid_request_error","param":"n","code":"invalid_value"}})"));
  EXPECT_EQ(error_response(e).status, 400);
  const ApiError r = from_rejection(Rejection{RejectReason::TenantLimit, "tenant has 1 requests in flight"});
  EXPECT_EQ(r.status, 429);
  ASSERT_EQ(r.headers.size(), 1u);
  EXPECT_EQ(r.headers[0].first, "Retry-After");
  EXPECT_EQ(error_body(r)["error"]["param"], nullptr);
  EXPECT_EQ(from_rejection(Rejection{RejectReason::Draining, "x"}).status, 503);
  EXPECT_EQ(from_rejection(Rejection{RejectReason::QueueFull, "x"}).status, 429);
  const ApiError s = from_sampling_error("sampling parameter 'top_p' must be in (0, 1], got nan");
  EXPECT_EQ(s.param, "top_p");
  EXPECT_EQ(from_sampling_error("sampling parameter 'n_logprobs' x", {{"n_logprobs", "top_logprobs"}}).param,
            "top_logprobs");
}
