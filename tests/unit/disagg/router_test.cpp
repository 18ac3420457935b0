// The router (src/server/router/) against fake workers on loopback: the prefill call's body
// (max_tokens 1, stream false, do_remote_decode), the handle handed on to the decode worker,
// the Authorization header forwarded to both, a streamed answer passed through, a prefill
// worker that is down (the request goes on without a handle), a decode worker that is down
// (502 naming it), and the requests it does not split. The worker choice: decode calls to the
// worker with the fewest in flight, a prompt prefix kept on one prefill worker until the load
// guard moves it, round-robin on request, and in-flight counts that always return to 0.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <sstream>
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
      : RouterFixture(std::vector{prefill_url}, std::vector{decode_url}) {}
  RouterFixture(std::vector<std::string> prefill_urls, std::vector<std::string> decode_urls,
                router::RouterPolicy policy = router::RouterPolicy::Load)
      : router(router::RouterOptions{std::move(prefill_urls), std::move(decode_urls), std::chrono::milliseconds(2000),
                                     std::chrono::milliseconds(5000), 1, policy}),
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
  // One series' value on /metrics ("name{labels}"), or -1 when it is not there.
  double sample(const std::string& series) {
    std::istringstream lines(metrics());
    for (std::string line; std::getline(lines, line);)
      if (line.starts_with(series + " ")) return std::stod(line.substr(series.size() + 1));
    return -1;
  }
  double in_flight(const std::string& worker, const char* role) {
    return sample("tessera:router_in_flight{worker=\"" + worker + "\",role=\"" + role + "\"}");
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
  // Counted out before the answer went back.
  EXPECT_EQ(f.in_flight(prefill.url(), "prefill"), 0);
  EXPECT_EQ(f.in_flight(decode.url(), "decode"), 0);
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
  EXPECT_EQ(f.in_flight("http://127.0.0.1:1", "prefill"), 0);
  EXPECT_EQ(f.in_flight(decode.url(), "decode"), 0);
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
  EXPECT_EQ(f.in_flight("http://127.0.0.1:1", "decode"), 0);  // a failed call is counted out too
  EXPECT_EQ(f.in_flight(prefill.url(), "prefill"), 0);
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
  EXPECT_EQ(f.in_flight(decode.url(), "decode"), 0);  // counted out before the outcome
  EXPECT_EQ(f.in_flight(prefill.url(), "prefill"), 0);
}

namespace {

// A worker that answers as `answer` does, except while hold() is on: then it keeps the
// request unanswered (a slow prefill) until release() answers it, or the router goes away.
struct HoldingWorker {
  explicit HoldingWorker(FakeWorker::Answer answer)
      : answer(std::move(answer)), worker([this](const json& body, http::Exchange& e) {
          if (!hold) return this->answer(body, e);
          e.on_abandon([this] { ++abandoned; });
        }) {}
  // Answers the i-th request (held earlier) as the worker would have.
  void release(size_t i) { answer(worker.bodies().at(i), *worker.exchange(i)); }
  FakeWorker::Answer answer;
  std::atomic<bool> hold{false};
  std::atomic<int> abandoned{0};
  FakeWorker worker;  // last: stopped first
};

json chat_request(const std::string& system, const std::string& question) {
  return {{"model", "m"},
          {"max_tokens", 4},
          {"messages", {{{"role", "system"}, {"content", system}}, {{"role", "user"}, {"content", question}}}}};
}

// A system prompt longer than the bytes the prefix key reads.
const std::string kSystemPrompt = [] {
  std::string s;
  while (s.size() < router::kPrefixKeyBytes + 100) s += "You are a careful assistant. ";
  return s;
}();

}  // namespace

TEST(Router, DecodeCallsGoToTheWorkerWithFewestInFlight) {
  // "hold" starts a stream and leaves it open: that worker has one call in flight until the
  // test ends it.
  const FakeWorker::Answer answer = [](const json& body, http::Exchange& e) {
    if (body.value("prompt", "") != "hold") return decode_answer(body, e);
    e.start_stream();
    e.write("data: {\"n\": 1}\n\n");
  };
  FakeWorker prefill(prefill_answer), d0(answer), d1(answer);
  RouterFixture f({prefill.url()}, {d0.url(), d1.url()});
  json held = kRequest;
  held["prompt"] = "hold";
  held["stream"] = true;
  TestConn c(f.server.port());
  c.send(post_request("/v1/completions", held.dump()));
  ASSERT_TRUE(c.read_head().has_value());
  EXPECT_EQ(c.read_chunk().value_or(""), "data: {\"n\": 1}\n\n");
  FakeWorker& holder = d0.bodies().size() == 1 ? d0 : d1;
  FakeWorker& other = &holder == &d0 ? d1 : d0;
  ASSERT_EQ(holder.bodies().size(), 1u);
  ASSERT_TRUE(eventually([&] { return holder.exchange(0) != nullptr; }));  // kept once its answer returns
  EXPECT_EQ(f.in_flight(holder.url(), "decode"), 1);
  EXPECT_EQ(f.in_flight(other.url(), "decode"), 0);
  // Round-robin would send every other one to the holder; the load policy sends none.
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f.post("/v1/completions", kRequest).status, 200);
  EXPECT_EQ(holder.bodies().size(), 1u);
  EXPECT_EQ(other.bodies().size(), 4u);
  // The stream ends: both idle again, and the requests spread over both.
  holder.exchange(0)->write("data: [DONE]\n\n");
  holder.exchange(0)->end_stream();
  EXPECT_TRUE(eventually([&] { return f.in_flight(holder.url(), "decode") == 0; }));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(f.post("/v1/completions", kRequest).status, 200);
  EXPECT_EQ(holder.bodies().size(), 1u + 2u);  // idle ties are taken in turn
  EXPECT_EQ(other.bodies().size(), 4u + 2u);
  EXPECT_EQ(f.in_flight(other.url(), "decode"), 0);
  EXPECT_EQ(f.in_flight(prefill.url(), "prefill"), 0);
}

TEST(Router, APromptPrefixStaysOnOnePrefillWorker) {
  FakeWorker p0(prefill_answer), p1(prefill_answer), decode(decode_answer);
  RouterFixture f({p0.url(), p1.url()}, {decode.url()});
  // Chat requests that share a long system prompt, each with its own question.
  constexpr int kShared = 12;
  for (int i = 0; i < kShared; ++i)
    ASSERT_EQ(f.post("/v1/chat/completions", chat_request(kSystemPrompt, "question " + std::to_string(i))).status, 200);
  const size_t n0 = p0.bodies().size(), n1 = p1.bodies().size();
  EXPECT_TRUE((n0 == kShared && n1 == 0) || (n0 == 0 && n1 == kShared)) << n0 << " and " << n1;
  EXPECT_EQ(f.sample("tessera:router_prefix_affinity_total{outcome=\"hit\"}"), kShared);
  // Different prompts reach both (40 keys on one worker of two: about 1e-12 with a fair hash).
  for (int i = 0; i < 40; ++i) {
    json body = kRequest;
    body["prompt"] = "prompt number " + std::to_string(i);
    ASSERT_EQ(f.post("/v1/completions", body).status, 200);
  }
  EXPECT_GT(p0.bodies().size(), n0);
  EXPECT_GT(p1.bodies().size(), n1);
  EXPECT_EQ(f.sample("tessera:router_prefix_affinity_total{outcome=\"overloaded\"}"), 0);
  EXPECT_EQ(f.in_flight(p0.url(), "prefill"), 0);
  EXPECT_EQ(f.in_flight(p1.url(), "prefill"), 0);
}

TEST(Router, TheLoadGuardMovesAPrefixOffABusyPrefillWorker) {
  HoldingWorker h0(prefill_answer), h1(prefill_answer);
  FakeWorker decode(decode_answer);
  RouterFixture f({h0.worker.url(), h1.worker.url()}, {decode.url()});
  const json request = chat_request(kSystemPrompt, "first");
  ASSERT_EQ(f.post("/v1/chat/completions", request).status, 200);
  HoldingWorker& affine = h0.worker.bodies().size() == 1 ? h0 : h1;
  HoldingWorker& other = &affine == &h0 ? h1 : h0;
  ASSERT_EQ(affine.worker.bodies().size(), 1u);
  // The prefix's worker turns slow: the calls within the slack still go to it.
  affine.hold = true;
  constexpr int kHeld = static_cast<int>(router::kAffinitySlack) + 1;
  std::vector<std::unique_ptr<TestConn>> clients;
  for (int i = 0; i < kHeld; ++i) {
    clients.push_back(std::make_unique<TestConn>(f.server.port()));
    clients.back()->send(post_request("/v1/chat/completions", chat_request(kSystemPrompt, "held").dump()));
    // One at a time, so each choice sees the calls before it.
    ASSERT_TRUE(eventually([&] { return affine.worker.exchange(1 + i) != nullptr; })) << "held call " << i;
  }
  EXPECT_EQ(f.in_flight(affine.worker.url(), "prefill"), kHeld);
  EXPECT_TRUE(other.worker.bodies().empty());
  // Past the slack: the same prefix goes to the other worker.
  EXPECT_EQ(f.post("/v1/chat/completions", chat_request(kSystemPrompt, "next")).status, 200);
  ASSERT_EQ(other.worker.bodies().size(), 1u);
  EXPECT_EQ(other.worker.bodies()[0]["messages"][1]["content"], "next");
  EXPECT_EQ(f.sample("tessera:router_prefix_affinity_total{outcome=\"overloaded\"}"), 1);
  EXPECT_EQ(f.sample("tessera:router_prefix_affinity_total{outcome=\"hit\"}"), 1 + kHeld);
  // The held calls end: all but the last answered, the last one's client goes away.
  for (int i = 0; i + 1 < kHeld; ++i) {
    affine.release(1 + i);
    const std::optional<TestResponse> r = clients[i]->read_response();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->status, 200);
  }
  clients.back()->reset();
  EXPECT_TRUE(eventually([&] { return affine.abandoned.load() == 1; }));  // the router closed its call
  EXPECT_TRUE(eventually([&] { return f.in_flight(affine.worker.url(), "prefill") == 0; }));
  EXPECT_EQ(f.in_flight(other.worker.url(), "prefill"), 0);
  EXPECT_EQ(f.in_flight(decode.url(), "decode"), 0);
  // Back under the slack: the prefix returns to its worker.
  affine.hold = false;
  EXPECT_EQ(f.post("/v1/chat/completions", request).status, 200);
  EXPECT_EQ(other.worker.bodies().size(), 1u);
}

TEST(Router, RoundRobinPolicyAlternatesWhateverThePrefix) {
  FakeWorker p0(prefill_answer), p1(prefill_answer), d0(decode_answer), d1(decode_answer);
  RouterFixture f({p0.url(), p1.url()}, {d0.url(), d1.url()}, router::RouterPolicy::RoundRobin);
  for (int i = 0; i < 6; ++i) {
    json body = kRequest;  // one prompt: the load policy would keep it on one prefill worker
    body["user"] = std::to_string(i);
    ASSERT_EQ(f.post("/v1/completions", body).status, 200);
  }
  const auto users = [](FakeWorker& w) {
    std::vector<std::string> out;
    for (const json& b : w.bodies()) out.push_back(b.value("user", ""));
    return out;
  };
  // Each list in turn from its first worker, as before the load policy.
  EXPECT_EQ(users(p0), (std::vector<std::string>{"0", "2", "4"}));
  EXPECT_EQ(users(p1), (std::vector<std::string>{"1", "3", "5"}));
  EXPECT_EQ(users(d0), (std::vector<std::string>{"0", "2", "4"}));
  EXPECT_EQ(users(d1), (std::vector<std::string>{"1", "3", "5"}));
  EXPECT_EQ(f.sample("tessera:router_prefix_affinity_total{outcome=\"hit\"}"), 0);
  EXPECT_EQ(f.in_flight(p0.url(), "prefill"), 0);
  EXPECT_EQ(f.in_flight(d1.url(), "decode"), 0);
}
