// The router (src/server/router/) against fake workers on loopback: the prefill call's body
// (max_tokens 1, stream false, do_remote_decode), the handle handed on to the decode worker,
// the Authorization header forwarded to both, a streamed answer passed through, a prefill
// worker that is down (the request goes on without a handle), a decode worker that is down
// (502 naming it), and the requests it does not split.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../http/http_test_client.h"
#include "server/http/server.h"
#include "server/router/router.h"

using namespace tessera;
using namespace tessera::http::test;
using json = nlohmann::json;

namespace {

// A worker that records each request and answers with `answer`.
class FakeWorker {
 public:
  using Answer = std::function<void(const json& body, http::Exchange& exchange)>;
  explicit FakeWorker(Answer answer)
      : answer_(std::move(answer)), server_(test_server_options(), [this](std::shared_ptr<http::Exchange> e) {
          const json body = json::parse(e->request().body, nullptr, false);
          {
            std::lock_guard lock(mutex_);
            bodies_.push_back(body);
            auth_.push_back(std::string(e->request().header("authorization").value_or("")));
          }
          answer_(body, *e);
          std::lock_guard lock(mutex_);
          exchanges_.push_back(e);
        }) {
    server_.start();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_.port()); }
  std::vector<json> bodies() {
    std::lock_guard lock(mutex_);
    return bodies_;
  }
  std::vector<std::string> auth() {
    std::lock_guard lock(mutex_);
    return auth_;
  }
  std::shared_ptr<http::Exchange> exchange(size_t i) {
    std::lock_guard lock(mutex_);
    return i < exchanges_.size() ? exchanges_[i] : nullptr;
  }

 private:
  std::function<void(const json&, http::Exchange&)> answer_;
  std::mutex mutex_;
  std::vector<json> bodies_;
  std::vector<std::string> auth_;
  std::vector<std::shared_ptr<http::Exchange>> exchanges_;  // kept: a stream may stay open
  http::HttpServer server_;                                 // last: stopped first
};

const json kHandle = {{"do_remote_decode", false},
                      {"do_remote_prefill", true},
                      {"remote_handle", "127.0.0.1:7100/5"},
                      {"remote_block_count", 2}};

void prefill_answer(const json&, http::Exchange& e) {
  http::Response r;
  r.body = json{{"choices", json::array({{{"text", " x"}}})}, {"kv_transfer_params", kHandle}}.dump();
  e.respond(std::move(r));
}

void decode_answer(const json& body, http::Exchange& e) {
  if (body.value("stream", false)) {
    e.start_stream();
    e.write("data: {\"n\": 1}\n\n");
    e.write("data: {\"n\": 2}\n\n");
    e.write("data: [DONE]\n\n");
    e.end_stream();
    return;
  }
  http::Response r;
  r.status = body.contains("bad") ? 400 : 200;
  r.body = json{{"decoded", true}}.dump();
  e.respond(std::move(r));
}

struct RouterFixture {
  RouterFixture(const std::string& prefill_url, const std::string& decode_url)
      : router(router::RouterOptions{
            {prefill_url}, {decode_url}, std::chrono::milliseconds(2000), std::chrono::milliseconds(5000), 1}),
        server(test_server_options(), router.handler()) {
    server.start();
  }
  TestResponse post(const std::string& path, const json& body) {
    TestConn c(server.port());
    c.send(post_request(path, body.dump(), "Authorization: Bearer k1\r\n"));
    auto r = c.read_response();
    EXPECT_TRUE(r.has_value());
    return r.value_or(TestResponse{});
  }
  std::string metrics() {
    TestConn c(server.port());
    c.send(get_request("/metrics"));
    return c.read_response().value_or(TestResponse{}).body;
  }
  router::Router router;
  http::HttpServer server;
};

const json kRequest = {{"model", "m"}, {"prompt", "hello"}, {"max_tokens", 20}, {"stream_options", nullptr}};

}  // namespace

TEST(Router, PrefillFirstThenDecodeWithTheHandle) {
  FakeWorker prefill(prefill_answer), decode(decode_answer);
  RouterFixture f(prefill.url(), decode.url());
  const TestResponse r = f.post("/v1/completions", kRequest);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(json::parse(r.body)["decoded"], true);
  ASSERT_EQ(prefill.bodies().size(), 1u);
  const json p = prefill.bodies()[0];
  EXPECT_EQ(p["max_tokens"], 1);
  EXPECT_EQ(p["stream"], false);
  EXPECT_EQ(p["kv_transfer_params"]["do_remote_decode"], true);
  EXPECT_EQ(p["prompt"], "hello");
  ASSERT_EQ(decode.bodies().size(), 1u);
  const json d = decode.bodies()[0];
  EXPECT_EQ(d["kv_transfer_params"], kHandle);  // as the prefill worker answered it
  EXPECT_EQ(d["max_tokens"], 20);               // the client's own request otherwise
  EXPECT_EQ(prefill.auth(), std::vector<std::string>{"Bearer k1"});
  EXPECT_EQ(decode.auth(), std::vector<std::string>{"Bearer k1"});
  // A decode worker's error passes through with its status.
  EXPECT_EQ(f.post("/v1/completions", json{{"prompt", "x"}, {"bad", true}}).status, 400);
  const std::string m = f.metrics();
  EXPECT_NE(m.find("tessera:router_prefills_total{worker=\"" + prefill.url() + "\",outcome=\"ok\"} 2.0"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("tessera:router_decodes_total{worker=\"" + decode.url() + "\",outcome=\"ok\"} 2.0"),
            std::string::npos)
      << m;
}

TEST(Router, StreamsTheDecodeAnswerThrough) {
  FakeWorker prefill(prefill_answer), decode(decode_answer);
  RouterFixture f(prefill.url(), decode.url());
  json body = kRequest;
  body["stream"] = true;
  const TestResponse r = f.post("/v1/chat/completions", body);
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.header("content-type").value_or(""), "text/event-stream");
  EXPECT_EQ(r.body, "data: {\"n\": 1}\n\ndata: {\"n\": 2}\n\ndata: [DONE]\n\n");
  EXPECT_EQ(prefill.bodies().at(0)["stream"], false);  // the prefill call is never streamed
}

TEST(Router, PrefillWorkerDownSendsTheRequestWithoutAHandle) {
  FakeWorker decode(decode_answer);
  RouterFixture f("http://127.0.0.1:1", decode.url());  // nothing listens on port 1
  const TestResponse r = f.post("/v1/completions", kRequest);
  EXPECT_EQ(r.status, 200);
  ASSERT_EQ(decode.bodies().size(), 1u);
  EXPECT_FALSE(decode.bodies()[0].contains("kv_transfer_params"));
  const std::string m = f.metrics();
  EXPECT_NE(m.find("tessera:router_local_prefills_total 1.0"), std::string::npos) << m;
  EXPECT_NE(m.find("outcome=\"failed\"} 1.0"), std::string::npos) << m;
}

TEST(Router, DecodeWorkerDownIsA502NamingIt) {
  FakeWorker prefill(prefill_answer);
  RouterFixture f(prefill.url(), "http://127.0.0.1:1");
  const TestResponse r = f.post("/v1/completions", kRequest);
  EXPECT_EQ(r.status, 502);
  const json error = json::parse(r.body)["error"];
  EXPECT_NE(error["message"].get<std::string>().find("decode worker http://127.0.0.1:1 failed: connecting"),
            std::string::npos)
      << r.body;
  EXPECT_EQ(error["code"], "bad_gateway");
}

TEST(Router, RequestsItCannotSplitGoStraightToDecode) {
  FakeWorker prefill(prefill_answer), decode(decode_answer);
  RouterFixture f(prefill.url(), decode.url());
  json several = kRequest;
  several["n"] = 3;
  EXPECT_EQ(f.post("/v1/completions", several).status, 200);
  json prompts = kRequest;
  prompts["prompt"] = json::array({"a", "b"});
  EXPECT_EQ(f.post("/v1/completions", prompts).status, 200);
  EXPECT_TRUE(prefill.bodies().empty());
  EXPECT_EQ(decode.bodies().size(), 2u);
  EXPECT_NE(f.metrics().find("tessera:router_prefills_skipped_total 2.0"), std::string::npos);
  // Routes it does not serve are 404, wrong methods 405.
  TestConn c(f.server.port());
  c.send(get_request("/v1/completions"));
  EXPECT_EQ(c.read_response().value_or(TestResponse{}).status, 405);
  TestConn c2(f.server.port());
  c2.send(get_request("/tokenize"));
  EXPECT_EQ(c2.read_response().value_or(TestResponse{}).status, 404);
}

TEST(Router, AClientThatGoesAwayEndsTheDecodeCall) {
  // A decode worker whose stream never ends: only the router closing the call ends it.
  std::atomic<bool> abandoned{false};
  FakeWorker prefill(prefill_answer);
  FakeWorker decode([&](const json&, http::Exchange& e) {
    e.start_stream();
    e.write("data: {\"n\": 1}\n\n");
    e.on_abandon([&] { abandoned = true; });
  });
  RouterFixture f(prefill.url(), decode.url());
  json body = kRequest;
  body["stream"] = true;
  {
    TestConn c(f.server.port());
    c.send(post_request("/v1/completions", body.dump()));
    ASSERT_TRUE(c.read_head().has_value());
    EXPECT_EQ(c.read_chunk().value_or(""), "data: {\"n\": 1}\n\n");  // streamed as it came
    c.reset();
  }
  EXPECT_TRUE(eventually([&] { return abandoned.load(); }));
  EXPECT_TRUE(eventually([&] { return f.metrics().find("outcome=\"cancelled\"} 1.0") != std::string::npos; }));
}
