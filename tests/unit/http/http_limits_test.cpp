// The transport's part of RELIABILITY.md "HTTP": every limit and every malformed input gets
// its status and an OpenAI-shaped error body before the connection closes; slow and
// stalled peers are timed out; the server keeps serving everyone else throughout.
#include <gtest/gtest.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "unit/http/http_test_client.h"
#include "server/http/server.h"

using namespace tessera;
using namespace tessera::http;
using namespace tessera::http::test;
using namespace std::chrono_literals;

namespace {

ServerOptions limit_options() {
  ServerOptions o = test_server_options();
  o.max_header_bytes = 4096;
  o.max_header_count = 20;
  o.max_body_bytes = 10000;
  o.read_timeout = 300ms;
  o.write_timeout = 300ms;
  o.keep_alive_timeout = 300ms;
  return o;
}

void ok_handler(std::shared_ptr<Exchange> ex) {
  Response r;
  r.body = "ok:" + ex->request().body;
  ex->respond(r);
}

class HttpLimits : public ::testing::Test {
 protected:
  void SetUp() override { start(limit_options()); }
  void start(ServerOptions o) {
    server_.reset();
    server_ = std::make_unique<HttpServer>(o, ok_handler);
    server_->start();
  }
  uint16_t port() const { return server_->port(); }

  // The server still answers a normal request on a fresh connection.
  void expect_still_serving() {
    TestConn c(port());
    ASSERT_TRUE(c.send(post_request("/ok", "x")));
    auto r = c.read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "ok:x");
  }

  // Sends raw bytes and expects `status` with an OpenAI-shaped error, then a close.
  void expect_rejected(const std::string& bytes, int status, const std::string& why) {
    SCOPED_TRACE(why);
    TestConn c(port());
    c.send(bytes);  // may fail part-way once the server has answered; the answer counts
    expect_error(c, status);
  }

  static void expect_error(TestConn& c, int status) {
    auto r = c.read_response();
    ASSERT_TRUE(r) << "no response";
    EXPECT_EQ(r->status, status) << r->body;
    EXPECT_EQ(r->header("connection"), "close");
    EXPECT_EQ(r->header("content-type"), "application/json");
    const auto j = nlohmann::json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << r->body;
    ASSERT_TRUE(j.contains("error"));
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    EXPECT_EQ(j["error"]["type"], status < 500 ? "invalid_request_error" : "server_error");
    EXPECT_TRUE(j["error"].contains("param"));
    EXPECT_TRUE(j["error"].contains("code"));
    EXPECT_TRUE(c.peer_closed(/*allow_bytes=*/true));
  }

  std::unique_ptr<HttpServer> server_;
};

}  // namespace

TEST_F(HttpLimits, HeaderTooLargeIs431) {
  expect_rejected("GET / HTTP/1.1\r\nHost: t\r\nX-Big: " + std::string(5000, 'a') + "\r\n\r\n", 431, "one large field");
  expect_rejected("GET /" + std::string(5000, 'p') + " HTTP/1.1\r\nHost: t\r\n\r\n", 431, "a long request line");
  // A header that never ends: answered once the limit is passed, not after buffering all.
  expect_rejected("GET / HTTP/1.1\r\nHost: t\r\n" + std::string(256 * 1024, 'h'), 431, "an endless header");
  expect_still_serving();
}

TEST_F(HttpLimits, TooManyHeaderFieldsIs431) {
  std::string fields;
  for (int i = 0; i < 21; ++i) fields += "X-F" + std::to_string(i) + ": v\r\n";
  expect_rejected("GET / HTTP/1.1\r\nHost: t\r\n" + fields + "\r\n", 431, "21 fields");
  expect_still_serving();
}

TEST_F(HttpLimits, BodyTooLargeIs413) {
  // Content-Length over the limit: refused from the header alone, no body sent.
  expect_rejected("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10001\r\n\r\n", 413, "Content-Length");
  expect_rejected("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999\r\n\r\n", 413, "a huge Content-Length");
  // Chunked: refused once the chunks pass the limit, before the body ends.
  {
    TestConn c(port());
    ASSERT_TRUE(c.send("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk = "fa0\r\n" + std::string(4000, 'c') + "\r\n";
    for (int i = 0; i < 3; ++i) c.send(chunk);  // 12000 bytes, no last chunk
    expect_error(c, 413);
  }
  // At the limit exactly: served.
  TestConn c(port());
  ASSERT_TRUE(c.send(post_request("/", std::string(10000, 'b'))));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body.size(), 3u + 10000u);
}

TEST_F(HttpLimits, MalformedRequestsAre400) {
  const std::string host = "Host: t\r\n";
  const struct {
    std::string bytes, why;
  } cases[] = {
      {"GARBAGE\r\n\r\n", "no request line"},
      {"GET / HTTP/1.1\r\nHost t\r\n\r\n", "field without colon"},
      {"GET / HTTP/1.1\r\n" + host + "Bad Name: x\r\n\r\n", "space in field name"},
      {"GET / HTTP/1.1\r\n" + host + "X: a" + std::string(1, '\0') + "b\r\n\r\n", "NUL in a field value"},
      {"GET /a" + std::string(1, '\0') + "b HTTP/1.1\r\n" + host + "\r\n", "NUL in the target"},
      {"G\x01T / HTTP/1.1\r\n" + host + "\r\n", "control byte in the method"},
      {"GET / HTTP/1.1\r\nHost: t\n\n", "bare LF line endings"},
      {"GET / HTTP/1.1\nHost: t\n\n", "bare LF everywhere"},
      {"POST / HTTP/1.1\nHost: t\nContent-Length: 2\n\nhi", "bare LF with a body"},
      {"GET / HTTP/1.1\r\nHost: t\r\nX: a\n", "bare LF, header not finished (no wait for the timeout)"},
      {"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
       "chunk size not hex"},
      {"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
       "chunk data without CRLF"},
      {"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\nfffffffffffffffffffff\r\n",
       "chunk size overflow"},
      {"POST / HTTP/1.1\r\n" + host +
           "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
           "5\r\nhello\r\n0\r\n\r\n",
       "Content-Length then Transfer-Encoding"},
      {"POST / HTTP/1.1\r\n" + host +
           "Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
           "5\r\nhello\r\n0\r\n\r\n",
       "Transfer-Encoding then Content-Length"},
      {"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
       "Transfer-Encoding twice"},
      {"POST / HTTP/1.1\r\n" + host + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
       "conflicting Content-Lengths"},
      {"POST / HTTP/1.1\r\n" + host + "Content-Length: -1\r\n\r\n", "negative Content-Length"},
      {"POST / HTTP/1.1\r\n" + host + "Content-Length: abc\r\n\r\n", "Content-Length not a number"},
      {"POST / HTTP/1.1\r\n" + host + "Content-Length: 99999999999999999999999\r\n\r\n", "Content-Length overflow"},
      {"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: gzip\r\n\r\nabc", "chunked not last"},
      {"GET / HTTP/1.1\r\n\r\n", "HTTP/1.1 without Host"},
      {"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", "two Hosts"},
  };
  for (const auto& c : cases) expect_rejected(c.bytes, 400, c.why);
  expect_still_serving();
}

TEST_F(HttpLimits, OtherStatusesForUnsupportedRequests) {
  expect_rejected("POST / HTTP/1.1\r\nHost: t\r\n\r\nbody", 411, "POST without a length");
  expect_rejected("PUT / HTTP/1.1\r\nHost: t\r\n\r\n", 411, "PUT without a length");
  expect_rejected("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501,
                  "a coding before chunked");
  expect_rejected("GET / HTTP/2.0\r\nHost: t\r\n\r\n", 505, "HTTP/2.0");
  expect_rejected("GET / HTTP/0.9\r\nHost: t\r\n\r\n", 505, "HTTP/0.9");
  expect_rejected("GET / HTTP/3\r\nHost: t\r\n\r\n", 505, "HTTP/3");
  expect_rejected("GET / FTP/1.1\r\nHost: t\r\n\r\n", 505, "not HTTP");
  // Beast's parser knows 1.0 and 1.1 only; a later 1.x minor version is refused too.
  expect_rejected("GET / HTTP/1.2\r\nHost: t\r\n\r\n", 505, "HTTP/1.2");
  // A GET without a body needs no length.
  TestConn c(port());
  ASSERT_TRUE(c.send("GET / HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_F(HttpLimits, SlowlorisGets408WhileOthersAreServed) {
  TestConn slow(port());
  ASSERT_TRUE(slow.send("GET / HTTP/1.1\r\nHost: t\r\n"));
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    // One header line every 40 ms: never completes within the 300 ms read timeout.
    for (int i = 0; i < 15 && !stop; ++i) {
      std::this_thread::sleep_for(40ms);
      if (!slow.send("X-" + std::to_string(i) + ": y\r\n")) break;
    }
  });
  for (int i = 0; i < 5; ++i) expect_still_serving();
  auto r = slow.read_response();
  stop = true;
  trickle.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 408);
  EXPECT_EQ(r->header("connection"), "close");
  EXPECT_TRUE(slow.peer_closed(/*allow_bytes=*/true));
  EXPECT_GE(server_->counters().read_timeouts, 1u);
}

TEST_F(HttpLimits, ManySlowClientsAreAllTimedOut) {
  constexpr int kSlow = 200;
  std::vector<std::unique_ptr<TestConn>> slow;
  for (int i = 0; i < kSlow; ++i) {
    slow.push_back(std::make_unique<TestConn>(port()));
    ASSERT_TRUE(slow.back()->send("POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Le"));
  }
  expect_still_serving();
  for (auto& c : slow) {
    auto r = c->read_response();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 408);
  }
  slow.clear();
  EXPECT_TRUE(eventually([&] { return server_->open_connections() == 0; }));
  EXPECT_TRUE(eventually([&] { return server_->counters().live_connections == 0; }));
}

TEST_F(HttpLimits, IdleConnectionsAreClosedSilently) {
  {
    TestConn c(port());  // never sends a byte
    EXPECT_TRUE(c.peer_closed());
  }
  {
    TestConn c(port());
    ASSERT_TRUE(c.send(get_request("/")));
    ASSERT_TRUE(c.read_response());
    EXPECT_TRUE(c.peer_closed());  // keep-alive timeout: closed without a response
  }
  EXPECT_TRUE(eventually([&] { return server_->open_connections() == 0; }));
}

TEST_F(HttpLimits, ConnectionsOverTheLimitAreRefused) {
  ServerOptions o = limit_options();
  o.max_connections = 3;
  o.keep_alive_timeout = 10'000ms;
  start(o);
  std::vector<std::unique_ptr<TestConn>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<TestConn>(port()));
    ASSERT_TRUE(held.back()->send(get_request("/")));
    ASSERT_TRUE(held.back()->read_response());
  }
  EXPECT_EQ(server_->open_connections(), 3u);
  {
    TestConn extra(port());
    extra.send(get_request("/"));
    auto r = extra.read_response();
    if (r) {
      EXPECT_EQ(r->status, 503);  // best effort: it may see only the close
    }
    EXPECT_TRUE(extra.peer_closed(true));
  }
  EXPECT_GE(server_->counters().refused, 1u);
  held.pop_back();
  ASSERT_TRUE(eventually([&] { return server_->open_connections() == 2; }));
  TestConn again(port());
  ASSERT_TRUE(again.send(get_request("/")));
  auto r = again.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

namespace {

// A handler that streams as fast as the transport takes it, from another thread, until
// the exchange is abandoned; it records the abandon.
struct Flooder {
  std::atomic<bool> abandoned{false};
  std::atomic<int> abandon_calls{0};
  std::vector<std::thread> threads;
  size_t pause_above = 8u << 20;  // backlog where the writer waits (0: never waits)

  Handler handler() {
    return [this](std::shared_ptr<Exchange> ex) {
      ex->on_abandon([this] {
        ++abandon_calls;
        abandoned = true;
      });
      ex->start_stream();
      threads.emplace_back([this, ex] {
        const std::string block(64 * 1024, 'x');
        const auto give_up = std::chrono::steady_clock::now() + 10s;
        while (!ex->abandoned() && std::chrono::steady_clock::now() < give_up) {
          if (pause_above && ex->queued_bytes() > pause_above) {
            std::this_thread::sleep_for(1ms);
            continue;
          }
          ex->write("data: " + block + "\n\n");
        }
      });
    };
  }
  ~Flooder() {
    for (auto& t : threads) t.join();
  }
};

}  // namespace

TEST_F(HttpLimits, ReaderThatStopsReadingHitsTheWriteTimeout) {
  Flooder flood;
  HttpServer server(limit_options(), flood.handler());
  server.start();
  TestConn c(server.port());
  const int small = 4096;
  setsockopt(c.fd(), SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  ASSERT_TRUE(c.send(get_request("/v1/chat/completions")));
  // Never reads: the server's writes stall, and the write timeout abandons the stream.
  ASSERT_TRUE(eventually([&] { return flood.abandoned.load(); }, 8000ms));
  EXPECT_GE(server.counters().write_timeouts, 1u);
  EXPECT_TRUE(eventually([&] { return server.open_connections() == 0; }));
  EXPECT_EQ(flood.abandon_calls.load(), 1);
}

TEST_F(HttpLimits, StreamBacklogOverTheLimitAbandons) {
  Flooder flood;
  flood.pause_above = 0;  // a producer that ignores queued_bytes()
  ServerOptions o = limit_options();
  o.write_timeout = 10'000ms;  // not the write timeout: the backlog limit
  o.max_queued_bytes = 512 * 1024;
  HttpServer server(o, flood.handler());
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(get_request("/v1/chat/completions")));
  ASSERT_TRUE(eventually([&] { return flood.abandoned.load(); }, 8000ms));
  EXPECT_EQ(server.counters().write_timeouts, 0u);
  EXPECT_EQ(flood.abandon_calls.load(), 1);
}
