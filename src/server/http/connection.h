#pragma once
// Internal to src/server/http/: one accepted TCP connection. Everything here runs on the
// connection's strand (the socket's executor). Life cycle:
//
//   ReadRequest ──request complete──▶ Handling ──response written──▶ ReadRequest (keep-alive)
//        │  limit/malformed/timeout: error response            │   └─▶ Lingering ─▶ Closed
//        └──────────────────────────────────────────────────────┘        (no keep-alive)
//
// While Handling, one read stays pending so that a peer that goes away is noticed at once
// (EOF or reset abandons the exchange); bytes that arrive meanwhile (pipelined requests)
// are buffered, up to a bound, and parsed after the response. Lingering half-closes the
// socket and discards input for a short while, so the peer reads the last response
// instead of a reset.
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/buffers_range.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "server/http/exchange.h"
#include "server/http/server_state.h"
#include "server/http/wire.h"

namespace tessera::http::detail {

class ExchangeImpl;

// A string body that reserves at most 64 KiB up front whatever Content-Length claims:
// memory grows with bytes actually received (and stops at max_body_bytes).
struct LazyStringBody {
  using value_type = std::string;

  class reader {
   public:
    template <bool isRequest, class Fields>
    reader(boost::beast::http::header<isRequest, Fields>&, value_type& body) : body_(body) {}

    void init(const boost::optional<std::uint64_t>& length, boost::beast::error_code& ec) {
      if (length) body_.reserve(static_cast<size_t>(std::min<std::uint64_t>(*length, 64 * 1024)));
      ec = {};
    }

    template <class ConstBufferSequence>
    std::size_t put(const ConstBufferSequence& buffers, boost::beast::error_code& ec) {
      std::size_t n = 0;
      for (const auto& b : boost::beast::buffers_range_ref(buffers)) {
        body_.append(static_cast<const char*>(b.data()), b.size());
        n += b.size();
      }
      ec = {};
      return n;
    }

    void finish(boost::beast::error_code& ec) { ec = {}; }

   private:
    value_type& body_;
  };
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(boost::asio::ip::tcp::socket socket, std::shared_ptr<ServerState> state);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const boost::asio::any_io_executor& executor() const { return executor_; }

  void start();
  // Closes the socket now; a pending exchange is abandoned. Idempotent.
  void close(const char* reason);

  // From ExchangeImpl's drain; `sequence` identifies the request they answer.
  void exchange_respond(uint64_t sequence, Response response);
  void exchange_start_stream(uint64_t sequence, Headers extra_headers);
  void exchange_write(uint64_t sequence, std::string data, const std::shared_ptr<std::atomic<size_t>>& counter);
  void exchange_end_stream(uint64_t sequence);
  // The handler let go of the exchange without finishing its response.
  void exchange_dropped(uint64_t sequence);

 private:
  enum class Phase { ReadRequest, Handling, Lingering, Closed };
  enum class Reply { None, Waiting, Streaming, Final };

  void set_phase(Phase next);  // keeps ServerState::answering

  struct OutChunk {
    std::string bytes;
    size_t accounted = 0;  // bytes of handler data in it (queued_bytes)
    std::shared_ptr<std::atomic<size_t>> counter;
  };

  // Reading and parsing.
  void begin_request();
  void read_more();
  void on_read(const boost::system::error_code& ec, size_t n);
  void parse();
  bool check_header();  // false: an error response is on its way
  void dispatch();
  void reject(int status, std::string message);
  void send_final_response(Response response, bool keep_alive);

  // Writing.
  void queue(std::string bytes, size_t accounted = 0, std::shared_ptr<std::atomic<size_t>> counter = nullptr);
  void queue_final(std::string bytes);
  void flush();
  void on_write(const boost::system::error_code& ec, size_t n);
  void on_response_written();

  // Timers and closing.
  void arm_read_timer(std::chrono::milliseconds after);
  void on_read_timer();
  void arm_write_timer();
  void start_linger();
  void abandon_current();
  bool is_current(uint64_t sequence) const;
  wire::Persistence persistence() const;

  const std::shared_ptr<ServerState> state_;
  const ServerOptions& options_;
  boost::asio::ip::tcp::socket socket_;
  boost::asio::any_io_executor executor_;
  boost::asio::steady_timer read_timer_;
  boost::asio::steady_timer write_timer_;
  uint64_t read_timer_generation_ = 0;
  uint64_t write_timer_generation_ = 0;
  std::string remote_;

  Phase phase_ = Phase::ReadRequest;
  boost::beast::flat_buffer inbuf_;  // received, not yet parsed
  std::vector<char> readbuf_;        // the pending read's target
  bool reading_ = false;
  bool peer_gone_ = false;        // EOF seen while a write was in flight
  bool request_started_ = false;  // a byte of the next request has arrived
  std::optional<boost::beast::http::request_parser<LazyStringBody>> parser_;
  bool header_checked_ = false;
  Request pending_request_;  // built when the header is in; the body comes at dispatch

  // The current exchange (one at a time; pipelined requests wait in inbuf_).
  uint64_t sequence_ = 0;
  std::weak_ptr<ExchangeImpl> current_;
  Reply reply_ = Reply::None;
  bool head_request_ = false;
  bool http10_ = false;
  bool keep_alive_ = true;

  std::deque<OutChunk> outbox_;
  size_t outbox_offset_ = 0;  // bytes of outbox_.front() already written
  bool writing_ = false;
  bool final_queued_ = false;  // the rest of the response is in the outbox
};

}  // namespace tessera::http::detail
