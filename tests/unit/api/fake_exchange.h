#pragma once
// An in-memory http::Exchange for driving the real handlers without sockets. Posted functions
// run in order on one executor thread (like a connection's strand); tests wait for the
// response or the end of the stream, read SSE frames, and can play a client that goes away.
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "server/http/exchange.h"

namespace api_test {

// How long a test waits for a response, a stream write or the engine to go idle before it
// fails. Generous: under TSan on a loaded 2-core machine one 3 x 24-token request on the real
// model took over a minute; a hang still fails, later.
inline constexpr std::chrono::seconds kTestWait{300};

class FakeExecutor {
 public:
  FakeExecutor() : thread_([this] { run(); }) {}
  ~FakeExecutor() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Notifies under the lock: a poster on another thread (a prompt worker) must be out of
  // notify_all before the destructor (which takes the lock) can destroy the condition variable.
  void post(std::function<void()> fn) {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(fn));
    cv_.notify_all();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        fn = std::move(queue_.front());
        queue_.pop_front();
      }
      fn();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

class FakeExchange : public tessera::http::Exchange {
 public:
  FakeExchange(FakeExecutor& executor, tessera::http::Request request)
      : executor_(executor), request_(std::move(request)) {
    request_.received_at = std::chrono::steady_clock::now();
  }

  const tessera::http::Request& request() const override { return request_; }
  void respond(tessera::http::Response response) override {
    std::lock_guard lock(mutex_);
    if (started_ || done_) return;
    response_ = std::move(response);
    done_ = true;
    cv_.notify_all();
  }
  void start_stream(tessera::http::Headers) override {
    std::lock_guard lock(mutex_);
    if (started_ || done_) return;
    started_ = true;
    response_.status = 200;
    response_.content_type = "text/event-stream";
    cv_.notify_all();
  }
  void write(std::string data) override {
    std::lock_guard lock(mutex_);
    if (!started_ || done_ || abandoned_) return;
    response_.body += data;
    ++writes_;
    cv_.notify_all();
  }
  void end_stream() override {
    std::lock_guard lock(mutex_);
    if (!started_ || done_) return;
    done_ = true;
    cv_.notify_all();
  }
  size_t queued_bytes() const override { return 0; }
  void post(std::function<void()> fn) override { executor_.post(std::move(fn)); }
  void on_abandon(std::function<void()> fn) override {
    std::lock_guard lock(mutex_);
    if (abandoned_)
      executor_.post(std::move(fn));
    else
      on_abandon_ = std::move(fn);
  }
  bool abandoned() const override {
    std::lock_guard lock(mutex_);
    return abandoned_;
  }

  // Test side: the client goes away.
  void abandon() {
    std::function<void()> fn;
    {
      std::lock_guard lock(mutex_);
      abandoned_ = true;
      fn = std::move(on_abandon_);
    }
    if (fn) executor_.post(std::move(fn));
  }
  // Waits for a complete response or stream end; false on timeout.
  bool wait_done(std::chrono::seconds timeout = kTestWait) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return done_; });
  }
  // Waits until at least n writes reached the stream.
  bool wait_writes(int n, std::chrono::seconds timeout = kTestWait) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return writes_ >= n || done_; });
  }
  tessera::http::Response response() const {
    std::lock_guard lock(mutex_);
    return response_;
  }
  bool streamed() const {
    std::lock_guard lock(mutex_);
    return started_;
  }
  nlohmann::json json() const { return nlohmann::json::parse(response().body); }

 private:
  FakeExecutor& executor_;
  tessera::http::Request request_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  tessera::http::Response response_;
  bool started_ = false, done_ = false, abandoned_ = false;
  int writes_ = 0;
  std::function<void()> on_abandon_;
};

// The "data: ..." payloads of an SSE body, in order ("[DONE]" included as text).
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) {
      out.push_back("<unterminated>" + body.substr(pos));
      break;
    }
    const std::string frame = body.substr(pos, end - pos);
    out.push_back(frame.rfind("data: ", 0) == 0 ? frame.substr(6) : "<bad frame>" + frame);
    pos = end + 2;
  }
  return out;
}

}  // namespace api_test
