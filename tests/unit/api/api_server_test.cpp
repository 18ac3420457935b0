// The real handlers over a real Engine with SmolLM2-135M, through an in-memory exchange:
// chat and completions (plain and streamed), n = 3 with seeds, echo + logprobs, stop strings
// across tokens, a client that goes away, auth, routing, admission and draining. Outputs are
// checked against the engine driven directly (greedy) and the tokenizer.
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "api_test_util.h"
#include "engine/engine.h"
#include "engine/engine_model.h"
#include "fake_exchange.h"
#include "server/api/api_server.h"
#include "server/api/prompt_input.h"

using namespace tessera;
using namespace tessera::api;
using api_test::FakeExchange;

namespace {

std::string model_file() { return test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"); }

const json kChat = json::parse(R"({"messages": [{"role": "user", "content": "What is the capital of France?"}],
  "temperature": 0, "max_tokens": 6, "ignore_eos": true})");

class ApiServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(model_file())) return;
    model_ = new ModelEngine(api_test::small_engine_options(model_file()));
  }
  static void TearDownTestSuite() {
    delete model_;
    model_ = nullptr;
  }
  void SetUp() override {
    if (!model_) GTEST_SKIP() << "model not found: " << model_file();
  }
  void TearDown() override {
    if (!engine_) return;
    // Everything a test started must be over: no request in the engine, no generation alive.
    api_test::wait_until([&] { return engine_->n_in_flight() == 0 && api_->live_generations() == 0; });
    EXPECT_EQ(engine_->n_in_flight(), 0u);
    EXPECT_EQ(api_->live_generations(), 0);
    engine_->stop();
    executor_.reset();
    EXPECT_TRUE(engine_->core().is_idle());
    api_.reset();
    engine_.reset();
  }

  void start(AdmissionLimits limits = {}, std::vector<std::string> keys = {}, int prompt_threads = 2) {
    EngineConfig c = model_->config();
    c.admission = limits;
    engine_ = std::make_unique<Engine>(c, model_->executor());
    executor_ = std::make_unique<api_test::FakeExecutor>();
    ServedModel m = api_test::served_model();
    m.tokenizer = &model_->session().tokenizer();
    if (chat_) m.chat = chat_;
    set_engine_limits(m, c);
    served_ = m;
    ApiServerOptions o;
    o.prompt_threads = prompt_threads;
    o.keys = ApiKeys(keys);
    o.chat_page_html = "<html>chat</html>";
    o.render_metrics = [] { return std::string("vllm:num_requests_running 0\n"); };
    o.hooks.record = [this](const RequestRecord& r) {
      std::lock_guard lock(mutex_);
      records_.push_back(r);
    };
    o.hooks.record_rejection = [this](int status, std::string_view reason) {
      std::lock_guard lock(mutex_);
      rejections_.emplace_back(status, std::string(reason));
    };
    api_ = std::make_unique<ApiServer>(*engine_, m, std::move(o));
  }

  std::shared_ptr<FakeExchange> send(const std::string& method, const std::string& path, const std::string& body = "",
                                     const std::string& key = "") {
    http::Request r;
    r.method = method;
    r.path = r.target = path;
    r.body = body;
    if (!key.empty()) r.headers.emplace_back("authorization", "Bearer " + key);
    auto ex = std::make_shared<FakeExchange>(*executor_, std::move(r));
    api_->handle(ex);
    return ex;
  }
  std::shared_ptr<FakeExchange> call(const std::string& method, const std::string& path, const json& body = nullptr,
                                     const std::string& key = "") {
    auto ex = send(method, path, body.is_null() ? "" : body.dump(), key);
    EXPECT_TRUE(ex->wait_done()) << path;
    return ex;
  }

  const Tokenizer& tok() { return model_->session().tokenizer(); }
  // The engine's own greedy tokens for a prompt.
  std::vector<int32_t> greedy_tokens(const std::vector<int32_t>& prompt, int max_tokens) {
    Request r;
    r.prompt = prompt;
    r.sampling.temperature = 0;
    r.sampling.max_tokens = max_tokens;
    r.sampling.ignore_eos = true;
    SubmitResult s = engine_->submit(r);
    EXPECT_TRUE(s.ok());
    return s.stream->collect().tokens[0];
  }
  static void expect_error(const FakeExchange& ex, int status, const char* code) {
    const http::Response r = ex.response();
    EXPECT_EQ(r.status, status) << r.body;
    const json j = json::parse(r.body);
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["code"], code) << r.body;
    EXPECT_TRUE(j["error"]["message"].is_string() && j["error"].contains("type") && j["error"].contains("param"));
  }

  // Renders chat prompts and notes the thread each render ran on; returns that thread and
  // the connection executor's.
  std::pair<std::thread::id, std::thread::id> render_and_executor_threads(int prompt_threads) {
    std::thread::id rendered_on;
    chat_ = [&rendered_on](const json& messages, bool add_generation_prompt, const json& extra) {
      rendered_on = std::this_thread::get_id();
      return api_test::chatml(messages, add_generation_prompt, extra);
    };
    start({}, {}, prompt_threads);
    std::promise<std::thread::id> executor_thread;
    executor_->post([&] { executor_thread.set_value(std::this_thread::get_id()); });
    const auto ex = call("POST", "/v1/chat/completions", kChat);
    EXPECT_EQ(ex->response().status, 200) << ex->response().body;
    // A refusal while preparing still answers its 400 and is recorded.
    expect_error(*call("POST", "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", "raise!"}}}}}),
                 400, "invalid_value");
    std::lock_guard lock(mutex_);
    EXPECT_EQ(rejections_.size(), 1u);
    return {rendered_on, executor_thread.get_future().get()};
  }

  static ModelEngine* model_;
  ChatRenderer chat_;  // set before start(): replaces the ChatML renderer
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<api_test::FakeExecutor> executor_;
  std::unique_ptr<ApiServer> api_;
  ServedModel served_;
  std::mutex mutex_;
  std::vector<RequestRecord> records_;
  std::vector<std::pair<int, std::string>> rejections_;
};

ModelEngine* ApiServerTest::model_ = nullptr;

}  // namespace

TEST_F(ApiServerTest, ChatCompleteAndStreamedAgreeWithTheEngine) {
  start();
  const std::vector<int32_t> prompt = parse_chat_request(kChat, served_).prompts[0].tokens;
  const std::string want = tok().decode(greedy_tokens(prompt, 6), true);

  auto ex = call("POST", "/v1/chat/completions", kChat);
  ASSERT_EQ(ex->response().status, 200) << ex->response().body;
  const json r = ex->json();
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(r["model"], "SmolLM2-135M-Instruct");
  EXPECT_TRUE(r["id"].get<std::string>().starts_with("chatcmpl-"));
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(r["choices"][0]["message"]["content"], want);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(r["usage"]["completion_tokens"], 6);
  EXPECT_EQ(r["usage"]["total_tokens"], prompt.size() + 6);
  EXPECT_TRUE(r["usage"]["prompt_tokens_details"]["cached_tokens"].is_number_integer());

  // /tokenize with the same messages counts the same prompt.
  json tk = {{"messages", kChat["messages"]}};
  EXPECT_EQ(call("POST", "/tokenize", tk)->json()["count"], prompt.size());

  json streamed = kChat;
  streamed["stream"] = true;
  streamed["stream_options"] = {{"include_usage", true}};
  auto sx = call("POST", "/v1/chat/completions", streamed);
  ASSERT_TRUE(sx->streamed());
  const auto frames = api_test::sse_payloads(sx->response().body);
  ASSERT_GE(frames.size(), 4u);
  EXPECT_EQ(frames.back(), "[DONE]");
  const json first = json::parse(frames[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], json::parse(R"({"role":"assistant","content":""})"));
  std::string text;
  for (size_t i = 1; i + 2 < frames.size(); ++i) {
    const json c = json::parse(frames[i]);
    EXPECT_EQ(c["id"], first["id"]);
    ASSERT_EQ(c["choices"].size(), 1u);
    text += c["choices"][0]["delta"].value("content", "");
    EXPECT_EQ(c["choices"][0]["finish_reason"], i + 3 == frames.size() ? json("length") : json(nullptr));
  }
  EXPECT_EQ(text, want);
  const json usage = json::parse(frames[frames.size() - 2]);
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 6);
  EXPECT_EQ(usage["usage"]["prompt_tokens"], prompt.size());

  // Chat logprobs: one entry per completion token, their strings join up to the content.
  json with_lp = kChat;
  with_lp["logprobs"] = true;
  with_lp["top_logprobs"] = 3;
  const json l = call("POST", "/v1/chat/completions", with_lp)->json();
  const json& content = l["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 6u) << l.dump();
  std::string joined;
  for (const json& t : content) {
    joined += t["token"].get<std::string>();
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    EXPECT_DOUBLE_EQ(t["logprob"].get<double>(), t["top_logprobs"][0]["logprob"].get<double>());  // greedy
  }
  EXPECT_EQ(joined, want);

  std::lock_guard lock(mutex_);
  ASSERT_EQ(records_.size(), 3u);
  for (const RequestRecord& rec : records_) {
    EXPECT_EQ(rec.prompt_tokens, static_cast<int64_t>(prompt.size()));
    EXPECT_EQ(rec.generation_tokens, 6);
    EXPECT_EQ(rec.finish, FinishReason::Length);
    ASSERT_TRUE(rec.ttft_s.has_value());
    EXPECT_GE(rec.e2e_s, *rec.ttft_s);
    EXPECT_EQ(rec.inter_token_s.size(), 5u);
    EXPECT_EQ(rec.max_tokens_param, 6);
  }
}

TEST_F(ApiServerTest, CompletionsThreeChoicesReproducibleWithSeed) {
  start();
  const json body = json::parse(R"({"prompt": "Once upon a time", "n": 3, "temperature": 1.0, "seed": 5,
    "max_tokens": 4, "ignore_eos": true})");
  const json a = call("POST", "/v1/completions", body)->json();
  const json b = call("POST", "/v1/completions", body)->json();
  EXPECT_EQ(a["object"], "text_completion");
  ASSERT_EQ(a["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a["choices"][i]["index"], i);
    EXPECT_EQ(a["choices"][i]["finish_reason"], "length");
    EXPECT_EQ(a["choices"][i]["text"], b["choices"][i]["text"]);
  }
  EXPECT_EQ(a["usage"]["completion_tokens"], 12);
  EXPECT_EQ(a["usage"]["prompt_tokens"], tok().encode("Once upon a time", true, false).size());
}

TEST_F(ApiServerTest, EchoWithLogprobs) {
  start();
  const std::string prompt = "The capital of France is";
  const std::vector<int32_t> ids = tok().encode(prompt, true, false);
  const json body = {{"prompt", prompt}, {"echo", true},     {"logprobs", 2},
                     {"max_tokens", 3},  {"temperature", 0}, {"ignore_eos", true}};
  const json r = call("POST", "/v1/completions", body)->json();
  ASSERT_TRUE(r.contains("choices")) << r.dump();
  const json& c = r["choices"][0];
  const std::string generated = tok().decode(greedy_tokens(ids, 3), true);
  EXPECT_EQ(c["text"], prompt + generated);
  const json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), ids.size() + 3);
  ASSERT_EQ(lp["token_logprobs"].size(), ids.size() + 3);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < ids.size() + 3; ++i) {
    SCOPED_TRACE(i);
    ASSERT_TRUE(lp["token_logprobs"][i].is_number()) << lp.dump();
    const double chosen = lp["token_logprobs"][i];
    EXPECT_LE(chosen, 0.0);
    double best = -1e9;
    for (const auto& [k, v] : lp["top_logprobs"][i].items()) best = std::max(best, v.get<double>());
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
    // Greedy: every generated token is the most likely one.
    if (i >= ids.size())
      EXPECT_DOUBLE_EQ(chosen, best);
    else
      EXPECT_LE(chosen, best);
  }
  EXPECT_EQ(lp["text_offset"][0], 0);
}

TEST_F(ApiServerTest, StopStringAcrossTokensIsCutAndNotLeaked) {
  start();
  const std::string prompt = "The capital of France is";
  const std::vector<int32_t> ids = tok().encode(prompt, true, false);
  const std::vector<int32_t> out = greedy_tokens(ids, 8);
  const std::string full = tok().decode(out, true);
  // A 4-byte stop string that straddles the boundary between output tokens 1 and 2.
  const size_t boundary = tok().decode(std::vector<int32_t>(out.begin(), out.begin() + 2), true).size();
  ASSERT_GE(boundary, 2u);
  const size_t at = boundary - 2;
  const std::string stop = full.substr(at, 4);
  ASSERT_EQ(full.find(stop), at) << full;

  const json body = {{"prompt", prompt},
                     {"max_tokens", 8},
                     {"temperature", 0},
                     {"ignore_eos", true},
                     {"stop", {"never-appears", stop}}};
  const json r = call("POST", "/v1/completions", body)->json();
  EXPECT_EQ(r["choices"][0]["text"], full.substr(0, at));
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_LT(r["usage"]["completion_tokens"].get<int>(), 8);

  json with = body;
  with["include_stop_str_in_output"] = true;
  EXPECT_EQ(call("POST", "/v1/completions", with)->json()["choices"][0]["text"], full.substr(0, at + 4));

  json streamed = body;
  streamed["stream"] = true;
  const auto frames = api_test::sse_payloads(call("POST", "/v1/completions", streamed)->response().body);
  std::string text;
  std::string last_finish;
  for (const std::string& f : frames) {
    if (f == "[DONE]") continue;
    const json c = json::parse(f);
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) last_finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, full.substr(0, at));
  EXPECT_EQ(last_finish, "stop");
  EXPECT_EQ(text.find(stop), std::string::npos);
}

// n = 3 where only some choices write the stop string: those stop there (text cut before it,
// finish "stop", and the engine stops generating them), the others run to max_tokens as they
// would without it. usage.completion_tokens counts, per choice, the tokens up to and
// including the one that completed the stop string (vLLM's token_ids of the output).
TEST_F(ApiServerTest, ThreeChoicesWhereOnlySomeHitTheStopString) {
  start();
  constexpr int kMaxTokens = 24;
  json body = json::parse(R"({"prompt": "Once upon a time", "n": 3, "temperature": 1.0, "seed": 11,
    "ignore_eos": true})");
  body["max_tokens"] = kMaxTokens;
  const GenerationPlan plan = parse_completion_request(body, served_);
  Request direct;
  direct.prompt = plan.prompts[0].tokens;
  direct.sampling = plan.sampling[0];
  direct.n = 3;
  const RequestOutput full = engine_->submit(direct).stream->collect();
  std::vector<std::string> texts;
  for (int c = 0; c < 3; ++c) texts.push_back(tok().decode(full.tokens[c], true));

  // A short ASCII stop string from early in choice 0 that some other choice never writes.
  const std::vector<int32_t> first8(full.tokens[0].begin(), full.tokens[0].begin() + 8);
  const std::string early = tok().decode(first8, true);
  std::string stop;
  for (size_t len = 3; len <= 6 && stop.empty(); ++len)
    for (size_t at = 0; at + len <= early.size() && stop.empty(); ++at) {
      const std::string s = early.substr(at, len);
      const bool ascii = std::all_of(s.begin(), s.end(), [](char ch) { return ch > 0x20 && ch < 0x7f; });
      const bool missed = texts[1].find(s) == std::string::npos || texts[2].find(s) == std::string::npos;
      if (ascii && missed) stop = s;
    }
  ASSERT_FALSE(stop.empty()) << texts[0] << " | " << texts[1] << " | " << texts[2];

  // What each choice should return: cut at the stop string's first occurrence, with the
  // tokens up to the one whose text completes it.
  std::vector<std::string> want_text(3);
  std::vector<std::string> want_finish(3);
  int64_t want_tokens = 0;
  for (int c = 0; c < 3; ++c) {
    const size_t at = texts[c].find(stop);
    if (at == std::string::npos) {
      want_text[c] = texts[c];
      want_finish[c] = "length";
      want_tokens += kMaxTokens;
      continue;
    }
    want_text[c] = texts[c].substr(0, at);
    want_finish[c] = "stop";
    for (int k = 1; k <= kMaxTokens; ++k)
      if (tok().decode(std::vector<int32_t>(full.tokens[c].begin(), full.tokens[c].begin() + k), true).find(stop) !=
          std::string::npos) {
        want_tokens += k;
        break;
      }
  }
  ASSERT_NE(std::count(want_finish.begin(), want_finish.end(), "stop"), 3);

  body["stop"] = stop;
  const int64_t generated_before = engine_->stats().generated_tokens;
  const json r = call("POST", "/v1/completions", body)->json();
  ASSERT_EQ(r["choices"].size(), 3u) << r.dump();
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(r["choices"][c]["text"], want_text[c]) << "choice " << c << ", stop " << stop;
    EXPECT_EQ(r["choices"][c]["finish_reason"], want_finish[c]) << "choice " << c;
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], want_tokens);
  api_test::wait_until([&] { return engine_->n_in_flight() == 0; });
  // The stopped choices were ended in the engine: it did not generate all 3 x max_tokens.
  const int64_t generated = engine_->stats().generated_tokens - generated_before;
  EXPECT_GE(generated, want_tokens);
  EXPECT_LT(generated, 3 * kMaxTokens);
  {
    std::lock_guard lock(mutex_);
    ASSERT_FALSE(records_.empty());
    EXPECT_EQ(records_.back().generation_tokens, want_tokens);
  }

  // Streamed: the same text and finish reason per choice, and the same usage.
  body["stream"] = true;
  body["stream_options"] = {{"include_usage", true}};
  const auto frames = api_test::sse_payloads(call("POST", "/v1/completions", body)->response().body);
  ASSERT_GE(frames.size(), 2u);
  EXPECT_EQ(frames.back(), "[DONE]");
  std::vector<std::string> text(3), finish(3);
  for (size_t i = 0; i + 2 < frames.size(); ++i) {
    const json c = json::parse(frames[i]);
    const int index = c["choices"][0]["index"];
    ASSERT_TRUE(index >= 0 && index < 3);
    EXPECT_TRUE(finish[index].empty()) << "a chunk after choice " << index << " finished";
    text[index] += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish[index] = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, want_text);
  EXPECT_EQ(finish, want_finish);
  EXPECT_EQ(json::parse(frames[frames.size() - 2])["usage"]["completion_tokens"], want_tokens);
}

// Rendering and tokenizing a long chat prompt takes milliseconds: it runs on the prompt
// workers, never on the connection's executor (the HTTP I/O thread), unless turned off.
TEST_F(ApiServerTest, PromptsArePreparedOffTheConnectionsExecutor) {
  const auto [rendered_on, executor] = render_and_executor_threads(2);
  EXPECT_NE(rendered_on, std::thread::id());
  EXPECT_NE(rendered_on, executor);
}

TEST_F(ApiServerTest, TokenizeRendersAndTokenizesOnAPromptWorker) {
  std::thread::id rendered_on;
  chat_ = [&rendered_on](const json& messages, bool add_generation_prompt, const json& extra) {
    rendered_on = std::this_thread::get_id();
    return api_test::chatml(messages, add_generation_prompt, extra);
  };
  start({}, {}, 2);
  std::promise<std::thread::id> executor_thread;
  executor_->post([&] { executor_thread.set_value(std::this_thread::get_id()); });
  const auto ex = call("POST", "/tokenize", json{{"messages", kChat["messages"]}, {"add_generation_prompt", true}});
  ASSERT_EQ(ex->response().status, 200) << ex->response().body;
  EXPECT_EQ(ex->json()["count"], parse_chat_request(kChat, served_).prompts[0].tokens.size());
  EXPECT_NE(rendered_on, std::thread::id());
  EXPECT_NE(rendered_on, executor_thread.get_future().get());
}

TEST_F(ApiServerTest, WithoutPromptWorkersPromptsArePreparedOnTheExecutor) {
  const auto [rendered_on, executor] = render_and_executor_threads(0);
  EXPECT_EQ(rendered_on, executor);
}

TEST_F(ApiServerTest, ClientGoneAbortsTheEngineRequest) {
  start();
  const json body = {{"prompt", "Tell me a long story."}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  auto ex = send("POST", "/v1/completions", body.dump());
  ASSERT_TRUE(ex->wait_writes(2));
  EXPECT_EQ(engine_->n_in_flight(), 1u);
  ex->abandon();
  api_test::wait_until([&] { return engine_->n_in_flight() == 0 && api_->live_generations() == 0; });
  EXPECT_EQ(engine_->n_in_flight(), 0u);
  EXPECT_EQ(api_->live_generations(), 0);
  std::lock_guard lock(mutex_);
  ASSERT_EQ(records_.size(), 1u);
  EXPECT_EQ(records_[0].finish, FinishReason::Abort);
  EXPECT_LT(records_[0].generation_tokens, 400);
}

TEST_F(ApiServerTest, AuthRoutingAndModels) {
  start({}, {"sk-alpha"});
  expect_error(*call("GET", "/v1/models"), 401, "invalid_api_key");
  expect_error(*call("GET", "/v1/models", nullptr, "sk-wrong"), 401, "invalid_api_key");
  expect_error(*call("POST", "/v1/completions", json{{"prompt", "hi"}}), 401, "invalid_api_key");
  const json models = call("GET", "/v1/models", nullptr, "sk-alpha")->json();
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0]["id"], "SmolLM2-135M-Instruct");
  EXPECT_EQ(models["data"][0]["max_model_len"], served_.max_model_len);
  EXPECT_EQ(call("GET", "/v1/models/SmolLM2-135M-Instruct", nullptr, "sk-alpha")->json()["id"],
            "SmolLM2-135M-Instruct");
  expect_error(*call("GET", "/v1/models/gpt-4", nullptr, "sk-alpha"), 404, "model_not_found");
  expect_error(*call("POST", "/v1/completions", json{{"prompt", "hi"}, {"model", "gpt-4"}}, "sk-alpha"), 404,
               "model_not_found");
  // Public routes need no key.
  EXPECT_EQ(call("GET", "/health")->response().status, 200);
  EXPECT_EQ(call("GET", "/ready")->json()["status"], "ready");
  const auto page = call("GET", "/");
  EXPECT_EQ(page->response().content_type, "text/html; charset=utf-8");
  EXPECT_EQ(page->response().body, "<html>chat</html>");
  EXPECT_EQ(call("GET", "/metrics")->response().content_type, "text/plain; version=0.0.4; charset=utf-8");
  expect_error(*call("GET", "/nowhere"), 404, "not_found");
  const auto wrong = call("GET", "/v1/completions", nullptr, "sk-alpha");
  expect_error(*wrong, 405, "method_not_allowed");
  EXPECT_EQ(wrong->response().headers.at(0), (std::pair<std::string, std::string>{"Allow", "POST"}));
  expect_error(*call("POST", "/v1/chat/completions", json{{"messages", "x"}}, "sk-alpha"), 400, "invalid_type");
  auto bad_utf8 = send("POST", "/v1/completions", "{\"prompt\": \"\xff\"}", "sk-alpha");
  ASSERT_TRUE(bad_utf8->wait_done());
  expect_error(*bad_utf8, 400, "invalid_json");
}

TEST_F(ApiServerTest, HeaderFilterRefusesMissingKeysBeforeTheBody) {
  start({}, {"sk-alpha"});
  http::Request r;
  r.method = "POST";
  r.path = "/v1/chat/completions";
  const auto refused = api_->filter_headers(r);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, 401);
  EXPECT_EQ(json::parse(refused->body)["error"]["code"], "invalid_api_key");
  r.path = "/v1/models/x";
  EXPECT_TRUE(api_->filter_headers(r).has_value());
  r.headers.emplace_back("authorization", "Bearer sk-alpha");
  EXPECT_FALSE(api_->filter_headers(r).has_value());
  r.headers.clear();
  r.method = "GET";
  r.path = "/health";
  EXPECT_FALSE(api_->filter_headers(r).has_value());
}

TEST_F(ApiServerTest, TokenizeAndDetokenize) {
  start();
  const json t =
      call("POST", "/tokenize", json{{"prompt", "Hello world <|im_start|>"}, {"return_token_strs", true}})->json();
  const std::vector<int32_t> ids = tok().encode("Hello world <|im_start|>", true, false);
  EXPECT_EQ(t["tokens"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(t["count"], ids.size());
  EXPECT_EQ(t["max_model_len"], served_.max_model_len);
  EXPECT_EQ(t["token_strs"].size(), ids.size());
  const json d = call("POST", "/detokenize", json{{"tokens", ids}})->json();
  EXPECT_EQ(d["prompt"], "Hello world <|im_start|>");
  expect_error(*call("POST", "/detokenize", json{{"tokens", {1, 99999}}}), 400, "invalid_value");
  expect_error(*call("POST", "/tokenize", json::object()), 400, "missing_required_parameter");
}

TEST_F(ApiServerTest, PerKeyLimitGives429BeforeHeadersAndDrainingGives503) {
  AdmissionLimits limits;
  limits.max_requests_per_tenant = 1;
  start(limits, {"sk-a", "sk-b"});
  const json body = {{"prompt", "Count to one hundred:"}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true}};
  auto first = send("POST", "/v1/completions", body.dump(), "sk-a");
  ASSERT_TRUE(first->wait_writes(1));
  auto second = call("POST", "/v1/completions", body, "sk-a");
  expect_error(*second, 429, "rate_limit_exceeded");
  EXPECT_FALSE(second->streamed());
  EXPECT_EQ(second->response().headers.at(0).first, "Retry-After");
  auto other = send("POST", "/v1/completions", body.dump(), "sk-b");  // another key, another tenant
  ASSERT_TRUE(other->wait_writes(1));
  EXPECT_TRUE(other->streamed());

  api_->set_draining(true);
  expect_error(*call("GET", "/health"), 503, "server_draining");
  expect_error(*call("POST", "/v1/completions", json{{"prompt", "hi"}}, "sk-b"), 503, "server_draining");
  first->abandon();
  other->abandon();
  std::lock_guard lock(mutex_);
  EXPECT_NE(std::find(rejections_.begin(), rejections_.end(), std::pair<int, std::string>{429, "tenant_limit"}),
            rejections_.end());
}

// Two Authorization headers are ambiguous: 400 before the body is read, whatever they hold.
TEST_F(ApiServerTest, TwoAuthorizationHeadersAre400) {
  start({}, {"sk-one", "sk-two"});
  http::Request req;
  req.method = "POST";
  req.target = req.path = "/v1/chat/completions";
  req.headers = {{"authorization", "Bearer sk-one"}, {"authorization", "Bearer sk-two"}};
  const std::optional<http::Response> r = api_->filter_headers(req);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("more than one Authorization header"), std::string::npos) << r->body;
  req.headers = {{"authorization", "bearer sk-one"}};  // one, with the scheme in lower case
  EXPECT_FALSE(api_->filter_headers(req));
}
