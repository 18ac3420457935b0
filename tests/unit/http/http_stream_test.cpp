// Server-sent events and the life of an exchange: stream framing, a thousand concurrent
// streams fed from a foreign thread, peers that leave mid-stream (on_abandon exactly once,
// nothing left in memory), ordering of posted work, and stop() with streams open.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "unit/http/http_test_client.h"
#include "server/http/server.h"

using namespace tessera;
using namespace tessera::http;
using namespace tessera::http::test;
using namespace std::chrono_literals;

namespace {

// Exchanges parked by the handler, as an engine would hold them.
struct Parked {
  std::mutex mutex;
  std::vector<std::shared_ptr<Exchange>> exchanges;

  void add(std::shared_ptr<Exchange> ex) {
    std::lock_guard lock(mutex);
    exchanges.push_back(std::move(ex));
  }
  size_t size() {
    std::lock_guard lock(mutex);
    return exchanges.size();
  }
  std::vector<std::shared_ptr<Exchange>> take() {
    std::lock_guard lock(mutex);
    return std::move(exchanges);
  }
  bool wait_for(size_t n) {
    return eventually([&] { return size() >= n; }, 10'000ms);
  }
};

std::string event(int id, int seq) {
  return "data: {\"id\":" + std::to_string(id) + ",\"seq\":" + std::to_string(seq) + "}\n\n";
}

}  // namespace

TEST(HttpStream, SseHeadersChunksAndReuse) {
  Parked parked;
  HttpServer server(test_server_options(), [&](std::shared_ptr<Exchange> ex) {
    if (ex->request().path == "/plain") {
      Response r;
      r.body = "plain";
      return ex->respond(r);
    }
    ex->start_stream({{"X-Request-Id", "req-1"}});
    parked.add(ex);
  });
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(post_request("/v1/chat/completions", R"({"stream":true})")));
  ASSERT_TRUE(parked.wait_for(1));
  EXPECT_EQ(server.counters().answering, 1u);  // a drain waits for this one
  auto head = c.read_head();
  ASSERT_TRUE(head);
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->header("content-type"), "text/event-stream");
  EXPECT_EQ(head->header("cache-control"), "no-cache");
  EXPECT_EQ(head->header("connection"), "keep-alive");
  EXPECT_EQ(head->header("transfer-encoding"), "chunked");
  EXPECT_EQ(head->header("x-request-id"), "req-1");
  EXPECT_FALSE(head->header("content-length"));

  auto ex = parked.take().at(0);
  std::thread engine([ex] {
    for (int i = 0; i < 3; ++i) ex->write(event(7, i));
    ex->write("");  // an empty write must not end the chunked body
    ex->write("data: [DONE]\n\n");
    ex->end_stream();
    ex->write("after the end: dropped");
  });
  engine.join();
  // Each write arrives as its own chunk (flushed, not coalesced into one at the end).
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c.read_chunk(), event(7, i));
  EXPECT_EQ(c.read_chunk(), "data: [DONE]\n\n");
  EXPECT_EQ(c.read_chunk(), "");  // last chunk
  EXPECT_TRUE(eventually([&] { return ex->queued_bytes() == 0; }));
  EXPECT_TRUE(eventually([&] { return server.counters().answering == 0; }));  // all written
  EXPECT_FALSE(ex->abandoned());
  // The connection carries on after the stream.
  ASSERT_TRUE(c.send(get_request("/plain")));
  auto r = c.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "plain");
}

TEST(HttpStream, Http10StreamEndsWithTheConnection) {
  HttpServer server(test_server_options(), [](std::shared_ptr<Exchange> ex) {
    ex->start_stream();
    ex->write("data: a\n\n");
    ex->write("data: b\n\n");
    ex->end_stream();
  });
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send("GET /s HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"));
  auto r = c.read_response();  // no length, not chunked: the body runs to the close
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->header("transfer-encoding"));
  EXPECT_EQ(r->header("connection"), "close");
  EXPECT_EQ(r->body, "data: a\n\ndata: b\n\n");
}

TEST(HttpStream, HeadStreamSendsHeadersOnly) {
  HttpServer server(test_server_options(), [](std::shared_ptr<Exchange> ex) {
    ex->start_stream();
    ex->write("data: not for HEAD\n\n");
    ex->end_stream();
  });
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send("HEAD /s HTTP/1.1\r\nHost: t\r\n\r\n"));
  auto r = c.read_response(/*head_request=*/true);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->header("content-type"), "text/event-stream");
  ASSERT_TRUE(c.send("HEAD /s HTTP/1.1\r\nHost: t\r\n\r\n"));
  r = c.read_response(true);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status_line, "HTTP/1.1 200 OK");  // nothing of the body came in between
}

TEST(HttpStream, ThousandConcurrentStreamsFromAForeignThread) {
  constexpr int kStreams = 1000;
  constexpr int kEvents = 5;
  Parked parked;
  HttpServer server(test_server_options(), [&](std::shared_ptr<Exchange> ex) {
    ex->start_stream();
    parked.add(std::move(ex));
  });
  server.start();

  std::vector<int> fds;
  for (int i = 0; i < kStreams; ++i) {
    fds.push_back(connect_loopback(server.port()));
    const std::string req = get_request("/s/" + std::to_string(i));
    ASSERT_EQ(::send(fds.back(), req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    ::fcntl(fds.back(), F_SETFL, ::fcntl(fds.back(), F_GETFL) | O_NONBLOCK);
  }
  ASSERT_TRUE(parked.wait_for(kStreams));
  EXPECT_EQ(server.open_connections(), static_cast<size_t>(kStreams));
  EXPECT_LE(server.counters().live_exchanges, static_cast<size_t>(kStreams));

  auto exchanges = parked.take();
  std::thread engine([&] {
    for (int e = 0; e < kEvents; ++e)
      for (auto& ex : exchanges) {
        const int id = std::stoi(ex->request().path.substr(3));
        ex->write(event(id, e));
      }
    for (auto& ex : exchanges) ex->end_stream();
  });

  // Read every socket until its last chunk, with poll (no thread per client either).
  std::vector<std::string> received(kStreams);
  std::vector<bool> done(kStreams, false);
  int finished = 0;
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  std::vector<pollfd> pfds(kStreams);
  while (finished < kStreams && std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < kStreams; ++i) pfds[i] = {done[i] ? -1 : fds[i], POLLIN, 0};
    ::poll(pfds.data(), pfds.size(), 100);
    for (int i = 0; i < kStreams; ++i) {
      if (done[i] || !(pfds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[8192];
      const ssize_t n = ::recv(fds[i], buf, sizeof buf, 0);
      if (n > 0) received[i].append(buf, static_cast<size_t>(n));
      const bool ended = received[i].size() >= 5 && received[i].compare(received[i].size() - 5, 5, "0\r\n\r\n") == 0;
      if (n == 0 || ended) {
        done[i] = true;
        ++finished;
      }
    }
  }
  engine.join();
  ASSERT_EQ(finished, kStreams);
  for (int i = 0; i < kStreams; ++i) {
    std::string expected_body;
    for (int e = 0; e < kEvents; ++e) {
      const std::string ev = event(i, e);
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", ev.size());
      expected_body += size + ev + "\r\n";
    }
    expected_body += "0\r\n\r\n";
    const size_t body_at = received[i].find("\r\n\r\n");
    ASSERT_NE(body_at, std::string::npos) << i;
    EXPECT_EQ(received[i].substr(body_at + 4), expected_body) << "stream " << i;
  }
  for (auto& ex : exchanges) EXPECT_FALSE(ex->abandoned());
  exchanges.clear();
  // Queued calls may hold the last references a moment longer.
  EXPECT_TRUE(eventually([&] { return server.counters().live_exchanges == 0; }));
  for (int fd : fds) ::close(fd);
  EXPECT_TRUE(eventually([&] { return server.open_connections() == 0; }));
  EXPECT_TRUE(eventually([&] { return server.counters().live_connections == 0; }));
}

TEST(HttpStream, ClientsThatLeaveMidStreamAreAbandonedOnce) {
  constexpr int kClients = 100;
  std::array<std::atomic<int>, kClients> abandon_calls{};
  std::array<std::atomic<bool>, kClients> hook_saw_abandoned{};
  Parked parked;
  HttpServer server(test_server_options(), [&](std::shared_ptr<Exchange> ex) {
    const int id = std::stoi(ex->request().path.substr(3));
    std::weak_ptr<Exchange> weak = ex;
    ex->on_abandon([&, id, weak] {
      ++abandon_calls[id];
      if (auto alive = weak.lock()) hook_saw_abandoned[id] = alive->abandoned();
    });
    ex->start_stream();
    parked.add(std::move(ex));
  });
  server.start();

  // The engine: an event to every live stream each millisecond; survivors (every fifth
  // client) end after 20 events, the rest stream until their client leaves.
  std::atomic<bool> stop_engine{false};
  std::thread engine([&] {
    std::vector<std::shared_ptr<Exchange>> live;
    std::map<int, int> sent;  // by client id
    while (!stop_engine) {
      for (auto& ex : parked.take()) live.push_back(std::move(ex));
      for (auto it = live.begin(); it != live.end();) {
        auto& ex = *it;
        const int id = std::stoi(ex->request().path.substr(3));
        if (ex->abandoned()) {
          it = live.erase(it);  // as an engine would after aborting the request
          continue;
        }
        ex->write(event(id, sent[id]++));
        if (id % 5 == 0 && sent[id] == 20) {
          ex->end_stream();
          it = live.erase(it);
          continue;
        }
        ++it;
      }
      std::this_thread::sleep_for(1ms);
    }
  });

  std::vector<std::unique_ptr<TestConn>> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.push_back(std::make_unique<TestConn>(server.port()));
    ASSERT_TRUE(clients.back()->send(get_request("/s/" + std::to_string(i))));
  }
  std::mt19937 rng(1234);
  for (int i = 0; i < kClients; ++i) {
    auto& c = *clients[i];
    auto head = c.read_head();
    ASSERT_TRUE(head) << i;
    ASSERT_EQ(head->status, 200);
    const int keep = i % 5 == 0 ? 20 : static_cast<int>(rng() % 6);
    for (int e = 0; e < keep; ++e) ASSERT_EQ(c.read_chunk(), event(i, e)) << i;
    if (i % 5 == 0) {
      EXPECT_EQ(c.read_chunk(), "");
    } else if (i % 2) {
      c.reset();  // RST
    } else {
      c.close();  // FIN
    }
  }
  for (int i = 0; i < kClients; ++i) {
    if (i % 5 == 0) continue;
    EXPECT_TRUE(eventually([&] { return abandon_calls[i].load() == 1; })) << i;
  }
  stop_engine = true;
  engine.join();
  clients.clear();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(abandon_calls[i].load(), i % 5 == 0 ? 0 : 1) << i;
    if (i % 5 != 0) {
      EXPECT_TRUE(hook_saw_abandoned[i].load()) << i;
    }
  }
  EXPECT_TRUE(eventually([&] { return server.counters().live_exchanges == 0; }));
  EXPECT_TRUE(eventually([&] { return server.open_connections() == 0; }));
  EXPECT_TRUE(eventually([&] { return server.counters().live_connections == 0; }));
  EXPECT_EQ(server.counters().abandoned, static_cast<uint64_t>(kClients - kClients / 5));
}

TEST(HttpStream, AbandonWhileTheHandlerWorksAndLateHooks) {
  Parked parked;
  HttpServer server(test_server_options(), [&](std::shared_ptr<Exchange> ex) { parked.add(ex); });
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(post_request("/v1/completions", "{}")));
  ASSERT_TRUE(parked.wait_for(1));
  auto ex = parked.take().at(0);
  std::atomic<int> calls{0};
  std::atomic<bool> on_test_thread{false};
  const auto test_thread = std::this_thread::get_id();
  ex->on_abandon([&] {
    ++calls;
    if (std::this_thread::get_id() == test_thread) on_test_thread = true;
  });
  ex->on_abandon([&] { ++calls; });
  EXPECT_FALSE(ex->abandoned());
  c.close();  // no response yet: the pending read notices
  ASSERT_TRUE(eventually([&] { return calls.load() == 2; }));
  EXPECT_TRUE(ex->abandoned());
  EXPECT_FALSE(on_test_thread.load());
  ex->on_abandon([&] { ++calls; });  // already abandoned: runs at once (on the executor)
  EXPECT_TRUE(eventually([&] { return calls.load() == 3; }));
  ex->respond(Response{});  // too late: ignored, no crash
  ex->start_stream();
  ex->write("x");
  std::atomic<int> posted{0};
  ex->post([&] { ++posted; });  // still runs, though the connection is gone
  EXPECT_TRUE(eventually([&] { return posted.load() == 1; }));
  std::this_thread::sleep_for(20ms);
  EXPECT_EQ(calls.load(), 3);

  // A completed exchange never fires its hooks.
  HttpServer quick(test_server_options(), [&](std::shared_ptr<Exchange> e) {
    e->on_abandon([&] { ++calls; });
    e->respond(Response{});
    parked.add(e);
  });
  quick.start();
  TestConn d(quick.port());
  ASSERT_TRUE(d.send(get_request("/")));
  ASSERT_TRUE(d.read_response());
  d.close();
  auto done = parked.take();
  ASSERT_EQ(done.size(), 1u);
  done[0]->on_abandon([&] { ++calls; });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(done[0]->abandoned());
  EXPECT_EQ(calls.load(), 3);
}

TEST(HttpStream, PostedWorkRunsInOrderAndNeverConcurrently) {
  Parked parked;
  HttpServer server(test_server_options(), [&](std::shared_ptr<Exchange> ex) { parked.add(ex); });
  server.start();
  TestConn c(server.port());
  ASSERT_TRUE(c.send(get_request("/")));
  ASSERT_TRUE(parked.wait_for(1));
  auto ex = parked.take().at(0);

  constexpr int kPerThread = 3000;
  std::vector<std::pair<int, int>> log;  // unguarded on purpose: the executor serializes
  std::atomic<bool> inside{false};
  std::atomic<bool> overlapped{false};
  auto poster = [&](int who) {
    for (int i = 0; i < kPerThread; ++i) {
      ex->post([&, who, i] {
        if (inside.exchange(true)) overlapped = true;
        log.emplace_back(who, i);
        inside = false;
      });
    }
  };
  std::thread a(poster, 0), b(poster, 1);
  a.join();
  b.join();
  std::atomic<bool> all_done{false};
  ex->post([&] { all_done = true; });
  ASSERT_TRUE(eventually([&] { return all_done.load(); }));
  EXPECT_FALSE(overlapped.load());
  ASSERT_EQ(log.size(), 2u * kPerThread);
  int next[2] = {0, 0};
  for (auto [who, i] : log) EXPECT_EQ(i, next[who]++);
  Response r;
  r.body = "done";
  ex->respond(r);
  auto resp = c.read_response();
  ASSERT_TRUE(resp);
  EXPECT_EQ(resp->body, "done");
}

TEST(HttpStream, ManyConnectionsOpenedAndDropped) {
  std::atomic<int> abandoned{0};
  Parked parked;
  HttpServer server(test_server_options(), [&](std::shared_ptr<Exchange> ex) {
    ex->on_abandon([&] { ++abandoned; });
    if (ex->request().path == "/stream") ex->start_stream();
    parked.add(std::move(ex));
  });
  server.start();
  constexpr int kEach = 100;
  {
    std::vector<std::unique_ptr<TestConn>> conns;
    for (int i = 0; i < kEach; ++i) {
      conns.push_back(std::make_unique<TestConn>(server.port()));
      conns.back()->send(get_request(i % 2 ? "/stream" : "/wait"));  // then leave
      conns.push_back(std::make_unique<TestConn>(server.port()));
      conns.back()->send("POST /partial HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nab");
      conns.push_back(std::make_unique<TestConn>(server.port()));  // connects only
    }
    ASSERT_TRUE(parked.wait_for(kEach));
    for (size_t i = 0; i < conns.size(); ++i) {
      if (i % 2) {
        conns[i]->reset();
      } else {
        conns[i]->close();
      }
    }
  }
  ASSERT_TRUE(eventually([&] { return abandoned.load() == kEach; }));
  // Answers from an engine that has not noticed yet: ignored, no crash.
  auto held = parked.take();
  std::thread engine([&] {
    for (auto& ex : held) {
      ex->write("data: late\n\n");
      ex->respond(Response{});
      ex->end_stream();
    }
  });
  engine.join();
  EXPECT_TRUE(eventually([&] { return server.open_connections() == 0; }));
  EXPECT_TRUE(eventually([&] { return server.counters().live_connections == 0; }));
  held.clear();  // the last references go when their queued calls have drained
  EXPECT_TRUE(eventually([&] { return server.counters().live_exchanges == 0; }));
  TestConn fine(server.port());
  ASSERT_TRUE(fine.send(get_request("/wait")));
  ASSERT_TRUE(parked.wait_for(1));
  parked.take().at(0)->respond(Response{});
  auto r = fine.read_response();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST(HttpStream, StopWithStreamsOpenAbandonsThemAll) {
  constexpr int kStreams = 20;
  std::atomic<int> abandoned{0};
  Parked parked;
  auto server = std::make_unique<HttpServer>(test_server_options(), [&](std::shared_ptr<Exchange> ex) {
    ex->on_abandon([&] { ++abandoned; });
    ex->start_stream();
    parked.add(std::move(ex));
  });
  server->start();
  std::vector<std::unique_ptr<TestConn>> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.push_back(std::make_unique<TestConn>(server->port()));
    ASSERT_TRUE(clients.back()->send(get_request("/s/" + std::to_string(i))));
  }
  ASSERT_TRUE(parked.wait_for(kStreams));
  auto held = parked.take();
  std::atomic<bool> stop_engine{false};
  std::thread engine([&] {  // keeps writing through the stop and after it
    int seq = 0;
    while (!stop_engine) {
      for (auto& ex : held) {
        ex->write(event(0, seq));
        ex->post([] {});
      }
      ++seq;
      std::this_thread::sleep_for(1ms);
    }
  });
  std::this_thread::sleep_for(20ms);
  server->stop();
  EXPECT_EQ(abandoned.load(), kStreams);  // all hooks ran before stop() returned
  EXPECT_EQ(server->open_connections(), 0u);
  for (auto& c : clients) {
    auto head = c->read_head();
    ASSERT_TRUE(head);
    EXPECT_TRUE(c->peer_closed(/*allow_bytes=*/true));
  }
  // After stop: on_abandon on an abandoned exchange runs at once, on this thread.
  held[0]->on_abandon([&] { ++abandoned; });
  EXPECT_EQ(abandoned.load(), kStreams + 1);
  // The server goes away while exchanges are still held and used.
  server.reset();
  std::this_thread::sleep_for(10ms);
  stop_engine = true;
  engine.join();
  for (auto& ex : held) {
    EXPECT_TRUE(ex->abandoned());
    ex->end_stream();
    ex->on_abandon([&] { ++abandoned; });
  }
  EXPECT_EQ(abandoned.load(), 2 * kStreams + 1);
  held.clear();
}
