#pragma once
// Internal to src/server/http/: the Exchange handed to handlers.
//
// Every call from a handler (any thread) becomes an operation in the exchange's own FIFO;
// one drain at a time runs them on the connection's strand, so they apply in call order
// and never concurrently with the connection's I/O. The exchange holds only a weak
// reference to its connection: a handler that keeps an exchange does not keep the socket,
// buffers or timers alive. Once the connection is gone (the exchange is then abandoned or
// complete), posted functions still run in order on the io_context, and response calls
// are dropped. Once the server has stopped, everything is dropped except on_abandon on an
// abandoned exchange, which runs on the caller's thread.
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "server/http/exchange.h"
#include "server/http/server_state.h"

namespace tessera::http::detail {

class Connection;

class ExchangeImpl final : public Exchange, public std::enable_shared_from_this<ExchangeImpl> {
 public:
  ExchangeImpl(Request request, std::weak_ptr<Connection> connection, uint64_t sequence,
               std::shared_ptr<ServerState> state);
  ~ExchangeImpl() override;

  const Request& request() const override { return request_; }
  void respond(Response response) override;
  void start_stream(Headers extra_headers) override;
  void write(std::string data) override;
  void end_stream() override;
  size_t queued_bytes() const override { return queued_->load(); }
  void post(std::function<void()> fn) override;
  void on_abandon(std::function<void()> fn) override;
  bool abandoned() const override { return abandoned_.load(); }

  // Connection side, on its strand.
  void abandon_now();   // runs the abandon hooks, once; no-op when complete
  void complete_now();  // the response is out: hooks are dropped and never run
  bool answered() const { return answered_.load(); }
  // Shared with the connection's outbox, which outlives a dropped exchange.
  const std::shared_ptr<std::atomic<size_t>>& queued_counter() const { return queued_; }

 private:
  enum class OpKind { Respond, StartStream, Write, EndStream, Post, OnAbandon };
  struct Op {
    OpKind kind;
    Response response;
    Headers headers;
    std::string data;
    std::function<void()> fn;
  };

  void enqueue(Op op);
  void schedule_drain();
  void drain(Connection* connection);  // nullptr: the connection is gone
  void run(Op& op, Connection* connection);
  void drop_after_stop();

  const Request request_;
  const std::weak_ptr<Connection> connection_;
  const uint64_t sequence_;  // the connection's request number, to ignore stale calls
  const std::shared_ptr<ServerState> state_;
  const std::shared_ptr<std::atomic<size_t>> queued_;

  std::atomic<bool> answered_{false};  // respond() or start_stream() was called
  std::atomic<bool> stream_started_{false};
  std::atomic<bool> stream_ended_{false};
  std::atomic<bool> abandoned_{false};
  std::atomic<bool> completed_{false};

  std::mutex mutex_;  // guards the rest
  std::deque<Op> ops_;
  bool draining_ = false;  // a drain is scheduled or running
  std::vector<std::function<void()>> abandon_hooks_;
};

// Runs a function from outside code (handler, hook, posted work) on an I/O thread: an
// exception is reported on stderr instead of unwinding through Asio and ending the thread.
void run_guarded(const std::function<void()>& fn, const char* what) noexcept;

}  // namespace tessera::http::detail
