// The server's operability and honesty (issue 20), through the real handlers over a real
// Engine with SmolLM2-135M: HEAD on GET routes, /version, /metrics behind a key, refused tool
// calling, stop_reason, the access log, the model's own template failing (500), per-tenant
// limits counting sequences, and /health and /ready while draining.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "api_test_util.h"
#include "engine/engine.h"
#include "engine/engine_model.h"
#include "fake_exchange.h"
#include "server/api/api_server.h"

using namespace tessera;
using namespace tessera::api;
using api_test::FakeExchange;

namespace {

std::string model_file() { return test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"); }

class OperabilityTest : public ::testing::Test {
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
    api_test::wait_until([&] { return engine_->n_in_flight() == 0 && api_->live_generations() == 0; });
    EXPECT_EQ(engine_->n_in_flight(), 0u);
    engine_->stop();
    executor_.reset();
    api_.reset();
    engine_.reset();
  }

  void start(AdmissionLimits limits = {}, std::vector<std::string> keys = {}, bool metrics_require_key = false) {
    EngineConfig c = model_->config();
    c.admission = limits;
    engine_ = std::make_unique<Engine>(c, model_->executor());
    executor_ = std::make_unique<api_test::FakeExecutor>();
    ServedModel m = api_test::served_model();
    m.tokenizer = &model_->session().tokenizer();
    set_engine_limits(m, c);
    ApiServerOptions o;
    o.keys = ApiKeys(keys);
    o.metrics_require_key = metrics_require_key;
    o.render_metrics = [] { return std::string("vllm:num_requests_running 0\n"); };
    o.hooks.access_log = [this](const AccessRecord& r) {
      std::lock_guard lock(mutex_);
      access_.push_back(r);
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
  static void expect_error(const FakeExchange& ex, int status, const char* code, const char* param = nullptr) {
    const http::Response r = ex.response();
    EXPECT_EQ(r.status, status) << r.body;
    const json j = json::parse(r.body);
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["code"], code) << r.body;
    if (param) {
      EXPECT_EQ(j["error"]["param"], param) << r.body;
    }
  }
  std::vector<AccessRecord> access_log() {
    std::lock_guard lock(mutex_);
    return access_;
  }

  static ModelEngine* model_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<api_test::FakeExecutor> executor_;
  std::unique_ptr<ApiServer> api_;
  std::mutex mutex_;
  std::vector<AccessRecord> access_;
};
ModelEngine* OperabilityTest::model_ = nullptr;

TEST_F(OperabilityTest, HeadAnswersEveryGetRouteAndVersionNamesTheBuild) {
  start();
  for (const char* path : {"/health", "/ready", "/version", "/metrics", "/v1/models"})
    EXPECT_EQ(call("HEAD", path)->response().status, 200) << path;
  // POST routes do not take HEAD; GET routes say both methods in Allow.
  const auto head_post = call("HEAD", "/v1/completions");
  expect_error(*head_post, 405, "method_not_allowed");
  EXPECT_EQ(head_post->response().headers.at(0).second, "POST");
  const auto post_get = call("POST", "/health");
  expect_error(*post_get, 405, "method_not_allowed");
  EXPECT_EQ(post_get->response().headers.at(0).second, "GET, HEAD");

  const json v = call("GET", "/version")->json();
  EXPECT_FALSE(v["version"].get<std::string>().empty());
  EXPECT_TRUE(v["git_commit"].is_null() || v["git_commit"].get<std::string>().size() == 40) << v.dump();
}

TEST_F(OperabilityTest, MetricsNeedAKeyOnlyWhenAsked) {
  start({}, {"sk-a"}, /*metrics_require_key=*/true);
  expect_error(*call("GET", "/metrics"), 401, "invalid_api_key");
  EXPECT_TRUE(api_->filter_headers([] {
    http::Request r;
    r.method = "GET";
    r.path = r.target = "/metrics";
    return r;
  }()));
  EXPECT_EQ(call("GET", "/metrics", nullptr, "sk-a")->response().status, 200);
  EXPECT_EQ(call("GET", "/health")->response().status, 200);  // probes never need one
}

TEST_F(OperabilityTest, MetricsOpenByDefaultWithKeys) {
  start({}, {"sk-a"});
  EXPECT_EQ(call("GET", "/metrics")->response().status, 200);
}

TEST_F(OperabilityTest, ToolsAreChatOnlyAndLegacyFunctionsRefused) {
  start();
  const json tool = {{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}};
  const json base = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"max_tokens", 2}};
  for (const auto& [field, value] : {std::pair<std::string, json>{"tools", json::array({tool})},
                                     {"tool_choice", "auto"},
                                     {"functions", json::array({tool["function"]})},
                                     {"function_call", "auto"}}) {
    json completion = {{"prompt", "hi"}, {"max_tokens", 2}, {field, value}};
    expect_error(*call("POST", "/v1/completions", completion), 400, "unsupported_parameter", field.c_str());
  }
  // Chat: the legacy names are refused, never ignored; tools are answered.
  for (const auto& [field, value] :
       {std::pair<std::string, json>{"functions", json::array({tool["function"]})}, {"function_call", "auto"}}) {
    json body = base;
    body[field] = value;
    expect_error(*call("POST", "/v1/chat/completions", body), 400, "unsupported_parameter", field.c_str());
  }
  json with_tools = base;
  with_tools["tools"] = json::array({tool});
  EXPECT_EQ(call("POST", "/v1/chat/completions", with_tools)->response().status, 200);
  json none = base;
  none["tools"] = json::array();
  none["tool_choice"] = "none";
  EXPECT_EQ(call("POST", "/v1/chat/completions", none)->response().status, 200);
}

TEST_F(OperabilityTest, StopReasonNamesTheStringOrTokenThatEndedTheChoice) {
  start();
  const Tokenizer& tok = model_->session().tokenizer();
  // Greedy output first, to pick a stop string and a stop token that certainly occur.
  const json plain =
      call("POST", "/v1/completions",
           json{{"prompt", "The capital of France is"}, {"max_tokens", 8}, {"temperature", 0}, {"ignore_eos", true}})
          ->json();
  EXPECT_TRUE(plain["choices"][0]["stop_reason"].is_null());  // length
  EXPECT_EQ(plain["choices"][0]["finish_reason"], "length");
  const std::string text = plain["choices"][0]["text"];
  ASSERT_GE(text.size(), 4u);
  const std::string stop = text.substr(text.size() / 2, 2);

  const json by_string = call("POST", "/v1/completions",
                              json{{"prompt", "The capital of France is"},
                                   {"max_tokens", 8},
                                   {"temperature", 0},
                                   {"ignore_eos", true},
                                   {"stop", {stop}}})
                             ->json();
  EXPECT_EQ(by_string["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(by_string["choices"][0]["stop_reason"], stop);

  // The engine's own greedy tokens for the same prompt (as token ids), so the stop token is
  // one it certainly samples.
  const std::vector<int32_t> prompt = tok.encode("The capital of France is", false, false);
  Request direct;
  direct.prompt = prompt;
  direct.sampling.temperature = 0;
  direct.sampling.max_tokens = 8;
  direct.sampling.ignore_eos = true;
  SubmitResult s = engine_->submit(direct);
  ASSERT_TRUE(s.ok());
  const std::vector<int32_t> out = s.stream->collect().tokens[0];
  ASSERT_GE(out.size(), 3u);
  const int32_t stop_token = out[2];
  const auto streamed = call("POST", "/v1/completions",
                             json{{"prompt", prompt},
                                  {"max_tokens", 8},
                                  {"temperature", 0},
                                  {"ignore_eos", true},
                                  {"stop_token_ids", {stop_token}},
                                  {"stream", true}});
  json last;
  for (const std::string& p : api_test::sse_payloads(streamed->response().body)) {
    if (p == "[DONE]") break;
    const json chunk = json::parse(p);
    EXPECT_TRUE(chunk["choices"][0].contains("stop_reason")) << p;
    last = chunk;
  }
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop") << last.dump();
  EXPECT_EQ(last["choices"][0]["stop_reason"], stop_token) << last.dump();
}

TEST_F(OperabilityTest, AccessLogHasOneLinePerRequestWithoutTheKey) {
  start({}, {"sk-secret"});
  const auto ok =
      call("POST", "/v1/completions", json{{"prompt", "Hello"}, {"max_tokens", 3}, {"ignore_eos", true}}, "sk-secret");
  ASSERT_EQ(ok->response().status, 200);
  expect_error(*call("POST", "/v1/completions", json{{"prompt", "Hello"}, {"n", 0}}, "sk-secret"), 400,
               "invalid_value");
  const std::vector<AccessRecord> log = access_log();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[0].request_id, ok->json()["id"]);
  EXPECT_EQ(log[0].status, 200);
  EXPECT_EQ(log[0].finish_reason, "length");
  EXPECT_EQ(log[0].prompt_tokens, ok->json()["usage"]["prompt_tokens"]);
  EXPECT_EQ(log[0].output_tokens, 3);
  ASSERT_TRUE(log[0].ttft_s);
  EXPECT_LE(*log[0].ttft_s, log[0].e2e_s);
  EXPECT_EQ(log[0].tenant.rfind("key-", 0), 0u) << log[0].tenant;
  EXPECT_EQ(log[1].status, 400);
  for (const AccessRecord& r : log) {
    const std::string line = format_access_log(r);
    EXPECT_EQ(line.find("sk-secret"), std::string::npos) << line;
    EXPECT_NE(line.find("tenant=" + r.tenant), std::string::npos) << line;
    EXPECT_EQ(line.find('\n'), std::string::npos);
  }
  EXPECT_NE(format_access_log(log[0]).find("status=200 finish=length prompt_tokens="), std::string::npos);
}

TEST_F(OperabilityTest, TheModelsOwnTemplateFailingIsAServerError) {
  start();
  auto chat = [&](const char* content) {
    return call("POST", "/v1/chat/completions", json{{"messages", {{{"role", "user"}, {"content", content}}}}});
  };
  expect_error(*chat("raise!"), 400, "invalid_value", "messages");  // the template judged the messages
  const auto bug = chat("template_bug!");
  expect_error(*bug, 500, "chat_template_error");
  EXPECT_EQ(bug->json()["error"]["type"], "server_error");
}

TEST_F(OperabilityTest, PerTenantLimitCountsSequences) {
  AdmissionLimits limits;
  limits.max_requests_per_tenant = 3;
  start(limits, {"sk-a"});
  const json slow = {
      {"prompt", "Count to one hundred:"}, {"max_tokens", 300}, {"ignore_eos", true}, {"stream", true}, {"n", 2}};
  // More choices than the limit can never run: 400, not a retry-later 429.
  json too_many = slow;
  too_many["n"] = 4;
  expect_error(*call("POST", "/v1/completions", too_many, "sk-a"), 400, "invalid_request");
  auto first = send("POST", "/v1/completions", slow.dump(), "sk-a");  // 2 sequences in flight
  ASSERT_TRUE(first->wait_writes(1));
  expect_error(*call("POST", "/v1/completions", slow, "sk-a"), 429, "rate_limit_exceeded");  // 2 + 2 > 3
  json two_prompts = slow;
  two_prompts["n"] = 1;
  two_prompts["prompt"] = {"a", "b"};  // n x prompts: 2 more
  expect_error(*call("POST", "/v1/completions", two_prompts, "sk-a"), 429, "rate_limit_exceeded");
  // The refused request's first prompt was admitted and withdrawn: wait until the engine let it go.
  api_test::wait_until([&] { return engine_->n_in_flight() <= 1; });
  json one = slow;
  one["n"] = 1;
  one["max_tokens"] = 2;
  one["stream"] = false;
  EXPECT_EQ(call("POST", "/v1/completions", one, "sk-a")->response().status, 200);  // 2 + 1 = 3
  first->abandon();
}

TEST_F(OperabilityTest, DrainingAnswers503OnHealthAndReady) {
  start();
  EXPECT_EQ(call("GET", "/ready")->json()["status"], "ready");
  api_->set_draining(true);
  expect_error(*call("GET", "/health"), 503, "server_draining");
  expect_error(*call("GET", "/ready"), 503, "server_draining");
  expect_error(*call("HEAD", "/ready"), 503, "server_draining");
}

}  // namespace
