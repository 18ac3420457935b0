// HttpServer basics over real sockets: requests and responses, keep-alive, pipelining,
// HEAD, unknown methods, handler failures, answers from other threads, the header filter
// and Expect: 100-continue.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/error.h"
#include "unit/http/http_test_client.h"
#include "server/http/server.h"

using namespace tessera;
using namespace tessera::http;
using namespace tessera::http::test;
using namespace std::chrono_literals;

namespace {

// Echoes the request as JSON, so a test sees exactly what the handler saw.
Response echo(const Request& r) {
  nlohmann::json headers = nlohmann::json::array();
  for (const auto& [k, v] : r.headers) headers.push_back({k, v});
  Response response;
  response.body = nlohmann::json{{"method", r.method}, {"target", r.target},
                                 {"path", r.path},     {"query", r.query},
                                 {"body", r.body},     {"headers", headers},
                                 {"remote", r.remote}, {"received", r.received_at.time_since_epoch().count() != 0}}
                      .dump();
  response.headers.emplace_back("X-Echo", "yes");
  return response;
}

void echo_handler(std::shared_ptr<Exchange> ex) { ex->respond(echo(ex->request())); }

nlohmann::json body_json(const TestResponse& r) { return nlohmann::json::parse(r.body); }

}  // namespace

TEST(HttpServer, GetAndPostReachTheHandlerIntact) {
  HttpServer server(test_server_options(), echo_handler);
  server.start();
  ASSERT_NE(server.port(), 0);
  TestConn c(server.port());

  ASSERT_TRUE(c.send(get_request("/v1/models?x=1&y=2", "X-Custom: Value One\r\n")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->status_line, "HTTP/1.1 200 OK");
  EXPECT_EQ(r->header("content-type"), "application/json");
  EXPECT_EQ(r->header("x-echo"), "yes");
  EXPECT_TRUE(r->header("date"));
  auto j = body_json(*r);
  EXPECT_EQ(j["method"], "GET");
  EXPECT_EQ(j["path"], "/v1/models");
  EXPECT_EQ(j["query"], "x=1&y=2");
  EXPECT_EQ(j["target"], "/v1/models?x=1&y=2");
  EXPECT_EQ(j["remote"].get<std::string>().rfind("127.0.0.1:", 0), 0u) << j["remote"];
  EXPECT_TRUE(j["received"].get<bool>());
  bool saw_custom = false;
  for (const auto& h : j["headers"])
    if (h[0] == "x-custom") saw_custom = h[1] == "Value One";  // name lowercased
  EXPECT_TRUE(saw_custom);

  const std::string body = R"({"prompt":"héllo","n":1})";
  ASSERT_TRUE(c.send(post_request("/v1/completions", body)));
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(body_json(*r)["method"], "POST");
  EXPECT_EQ(body_json(*r)["body"], body);
}

TEST(HttpServer, KeepAliveReusesOneConnection) {
  HttpServer server(test_server_options(), echo_handler);
  server.start();
  TestConn c(server.port());
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(c.send(post_request("/p", std::to_string(i))));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(body_json(*r)["body"], std::to_string(i));
    EXPECT_FALSE(r->header("connection"));  // HTTP/1.1 default: persistent
  }
  EXPECT_EQ(server.counters().accepted, 1u);
  EXPECT_EQ(server.counters().requests, 5u);
  EXPECT_EQ(server.open_connections(), 1u);
}

TEST(HttpServer, ConnectionCloseIsHonoured) {
  HttpServer server(test_server_options(), echo_handler);
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(get_request("/", "Connection: close\r\n")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header("connection"), "close");
  EXPECT_TRUE(c.peer_closed());
}

TEST(HttpServer, Http10ClosesUnlessKeepAliveIsAsked) {
  HttpServer server(test_server_options(), echo_handler);
  server.start();
  {
    TestConn c(server.port());
    ASSERT_TRUE(c.send("GET /a HTTP/1.0\r\n\r\n"));  // no Host needed in 1.0
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("connection"), "close");
    EXPECT_TRUE(c.peer_closed());
  }
  {
    TestConn c(server.port());
    for (int i = 0; i < 2; ++i) {
      ASSERT_TRUE(c.send("GET /b HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
      auto r = c.read_response();
      ASSERT_TRUE(r);
      EXPECT_EQ(r->header("connection"), "keep-alive");
    }
  }
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  // The first request is answered last, from another thread: its response must still
  // come first, and the others must not be handled before it is out.
  std::mutex mutex;
  std::vector<std::string> handled;
  std::vector<std::thread> threads;
  HttpServer server(test_server_options(), [&](std::shared_ptr<Exchange> ex) {
    std::lock_guard lock(mutex);
    handled.push_back(ex->request().path);
    if (ex->request().path == "/slow") {
      threads.emplace_back([ex] {
        std::this_thread::sleep_for(50ms);
        Response r;
        r.body = "slow";
        ex->respond(r);
      });
      return;
    }
    Response r;
    r.body = ex->request().path;
    ex->respond(r);
  });
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(get_request("/slow") + post_request("/two", "2") + get_request("/three")));
  auto r1 = c.read_response();
  auto r2 = c.read_response();
  auto r3 = c.read_response();
  ASSERT_TRUE(r1 && r2 && r3);
  EXPECT_EQ(r1->body, "slow");
  EXPECT_EQ(r2->body, "/two");
  EXPECT_EQ(r3->body, "/three");
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(handled, (std::vector<std::string>{"/slow", "/two", "/three"}));
  }
  for (auto& t : threads) t.join();
}

TEST(HttpServer, HeadGetsHeadersWithoutBody) {
  HttpServer server(test_server_options(), echo_handler);
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send("HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto r = c.read_response(/*head_request=*/true);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_GT(std::stoul(r->header("content-length").value_or("0")), 0u);
  // The connection is still in step: the next response starts right where HEAD's ended.
  ASSERT_TRUE(c.send(get_request("/y")));
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(body_json(*r)["path"], "/y");
}

TEST(HttpServer, UnknownMethodsReachTheHandler) {
  HttpServer server(test_server_options(), [](std::shared_ptr<Exchange> ex) {
    if (ex->request().method == "GET") return echo_handler(ex);
    ex->respond(error_response(405, "method " + ex->request().method + " not allowed"));
  });
  server.start();
  TestConn c(server.port());
  for (std::string method : {"BREW", "DELETE", "OPTIONS", "PROPFIND"}) {
    ASSERT_TRUE(c.send(method + " /pot HTTP/1.1\r\nHost: t\r\n\r\n"));
    auto r = c.read_response();
    ASSERT_TRUE(r) << method;
    EXPECT_EQ(r->status, 405);
    EXPECT_EQ(body_json(*r)["error"]["message"], "method " + method + " not allowed");
  }
}

TEST(HttpServer, ChunkedRequestBodyIsDecoded) {
  HttpServer server(test_server_options(), echo_handler);
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(
      c.send("POST /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
             "5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n"));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(body_json(*r)["body"], "hello, world");
}

TEST(HttpServer, AbsoluteFormTargetGivesThePath) {
  HttpServer server(test_server_options(), echo_handler);
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send("GET http://example.com:8000/v1/models?a=b HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(body_json(*r)["path"], "/v1/models");
  EXPECT_EQ(body_json(*r)["query"], "a=b");
}

TEST(HttpServer, HandlerThatThrowsGets500AndServerCarriesOn) {
  HttpServer server(test_server_options(), [](std::shared_ptr<Exchange> ex) {
    if (ex->request().path == "/boom") throw Error("tokenizer exploded");
    echo_handler(ex);
  });
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(get_request("/boom")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  auto j = body_json(*r);
  EXPECT_EQ(j["error"]["message"], "tokenizer exploded");
  EXPECT_EQ(j["error"]["type"], "server_error");
  ASSERT_TRUE(c.send(get_request("/fine")));  // same connection still serves
  r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(HttpServer, ExchangeDroppedWithoutAnswerGets500) {
  HttpServer server(test_server_options(), [](std::shared_ptr<Exchange>) {});
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(get_request("/forgotten")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_NE(body_json(*r)["error"]["message"].get<std::string>().find("without answering"), std::string::npos);
  EXPECT_TRUE(eventually([&] { return server.counters().live_exchanges == 0; }));
}

TEST(HttpServer, ResponseFromAForeignThread) {
  std::mutex mutex;
  std::vector<std::shared_ptr<Exchange>> parked;
  HttpServer server(test_server_options(), [&](std::shared_ptr<Exchange> ex) {
    std::lock_guard lock(mutex);
    parked.push_back(std::move(ex));
  });
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(post_request("/later", "abc")));
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mutex);
    return parked.size() == 1;
  }));
  std::thread engine([&] {
    std::lock_guard lock(mutex);
    Response r;
    r.status = 201;
    r.body = "from the engine: " + parked[0]->request().body;
    parked[0]->respond(r);
    parked[0]->respond(error_response(500, "second answer is ignored"));
  });
  engine.join();
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 201);
  EXPECT_EQ(r->body, "from the engine: abc");
  EXPECT_FALSE(parked[0]->abandoned());
}

TEST(HttpServer, HandlerHeadersCannotSplitTheResponse) {
  HttpServer server(test_server_options(), [](std::shared_ptr<Exchange> ex) {
    Response r;
    r.body = "ok";
    r.headers = {{"X-Bad", "a\r\nSet-Cookie: evil=1"}, {"Content-Length", "999"}, {"Retry-After", "3"}};
    ex->respond(r);
  });
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(get_request("/")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "ok");
  EXPECT_FALSE(r->header("set-cookie"));
  EXPECT_FALSE(r->header("x-bad"));
  EXPECT_EQ(r->header("content-length"), "2");
  EXPECT_EQ(r->header("retry-after"), "3");
}

TEST(HttpServer, ErrorResponseHasOpenAiShape) {
  auto r = error_response(400, "'n' must be an integer", std::string("n"));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.content_type, "application/json");
  auto j = nlohmann::json::parse(r.body);
  EXPECT_EQ(j["error"]["message"], "'n' must be an integer");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "n");
  EXPECT_TRUE(j["error"]["code"].is_null());
  auto s = nlohmann::json::parse(error_response(503, "draining", {}, "x", "").body);
  EXPECT_EQ(s["error"]["type"], "server_error");
  EXPECT_TRUE(s["error"]["param"].is_null());
  EXPECT_EQ(s["error"]["code"], "x");
  // Bytes that are not UTF-8 are replaced, not thrown on.
  auto bad = nlohmann::json::parse(error_response(400, "bad \xff byte").body);
  EXPECT_EQ(bad["error"]["message"], "bad \xEF\xBF\xBD byte");
}

TEST(HttpServer, HeaderFilterAnswersBeforeTheBodyIsRead) {
  std::atomic<int> handled{0};
  ServerOptions o = test_server_options();
  o.header_filter = [](const Request& r) -> std::optional<Response> {
    if (r.header("authorization") == "Bearer good") return std::nullopt;
    auto resp = error_response(401, "missing or wrong API key", {}, "invalid_api_key");
    resp.headers.emplace_back("WWW-Authenticate", "Bearer");
    return resp;
  };
  HttpServer server(o, [&](std::shared_ptr<Exchange> ex) {
    ++handled;
    echo_handler(ex);
  });
  server.start();
  {
    // A large body announced, none sent: the 401 must come without waiting for it.
    TestConn c(server.port());
    ASSERT_TRUE(
        c.send("POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n"
               "Content-Length: 5000000\r\n\r\n"));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    EXPECT_EQ(r->header("www-authenticate"), "Bearer");
    EXPECT_EQ(r->header("connection"), "close");  // the body is still on the wire
    EXPECT_EQ(body_json(*r)["error"]["code"], "invalid_api_key");
    EXPECT_TRUE(c.peer_closed());
  }
  {
    // No body pending: the connection stays usable.
    TestConn c(server.port());
    ASSERT_TRUE(c.send(get_request("/v1/models")));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 401);
    ASSERT_TRUE(c.send(get_request("/v1/models", "Authorization: Bearer good\r\n")));
    r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
  }
  EXPECT_EQ(handled.load(), 1);
}

TEST(HttpServer, HeaderFilterThatThrowsGives500) {
  ServerOptions o = test_server_options();
  o.header_filter = [](const Request&) -> std::optional<Response> { throw Error("key store unavailable"); };
  HttpServer server(o, echo_handler);
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(get_request("/")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 500);
  EXPECT_NE(body_json(*r)["error"]["message"].get<std::string>().find("key store unavailable"), std::string::npos);
}

TEST(HttpServer, ExpectContinue) {
  ServerOptions o = test_server_options();
  o.max_body_bytes = 1000;
  HttpServer server(o, echo_handler);
  server.start();
  {
    TestConn c(server.port());
    ASSERT_TRUE(
        c.send("POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
               "Expect: 100-continue\r\n\r\n"));
    auto interim = c.read_head();
    ASSERT_TRUE(interim);
    EXPECT_EQ(interim->status, 100);
    ASSERT_TRUE(c.send("hello"));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(body_json(*r)["body"], "hello");
  }
  {
    // Too large: the refusal instead of 100 Continue.
    TestConn c(server.port());
    ASSERT_TRUE(
        c.send("POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n"
               "Expect: 100-continue\r\n\r\n"));
    auto r = c.read_head();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 413);
  }
  {
    TestConn c(server.port());
    ASSERT_TRUE(
        c.send("POST /e HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n"
               "Expect: something-else\r\n\r\nhello"));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 417);
  }
}

TEST(HttpServer, BindFailureNamesHostAndPort) {
  HttpServer first(test_server_options(), echo_handler);
  first.start();
  ServerOptions o = test_server_options();
  o.port = first.port();
  HttpServer second(o, echo_handler);
  try {
    second.start();
    FAIL() << "binding a port in use must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())), std::string::npos) << e.what();
  }
  ServerOptions bad = test_server_options();
  bad.host = "not a host name";
  HttpServer third(bad, echo_handler);
  EXPECT_THROW(third.start(), Error);
}

TEST(HttpServer, StopAcceptingRefusesNewConnectionsButServesOpenOnes) {
  HttpServer server(test_server_options(), echo_handler);
  server.start();
  TestConn open(server.port());
  ASSERT_TRUE(open.send(get_request("/before")));
  ASSERT_TRUE(open.read_response());
  server.stop_accepting();
  EXPECT_THROW(TestConn(server.port()), std::runtime_error);  // connection refused
  ASSERT_TRUE(open.send(get_request("/after")));
  auto r = open.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->header("connection"), "close");  // draining: do not reuse
  EXPECT_TRUE(open.peer_closed());
}
