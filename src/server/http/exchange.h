#pragma once
// The contract between the HTTP transport (src/server/http/, Boost.Beast on Asio) and the
// application handlers (src/server/api/). The transport parses and bounds requests, keeps
// connections alive, times out slow peers and frames server-sent events; a handler sees one
// request at a time as an Exchange and answers it, now or later, from any thread.
// Contract: docs/design/http-server.md.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
  std::string method;  // "GET", "POST", ... as received
  std::string target;  // path and query, as received
  std::string path;    // target without the query string
  std::string query;   // after '?', or ""
  Headers headers;     // names lowercased, in arrival order
  std::string body;
  std::string remote;                                 // peer "address:port"
  std::chrono::steady_clock::time_point received_at;  // when the whole request was read

  // The first header with this (lowercase) name.
  std::optional<std::string_view> header(std::string_view name) const;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  Headers headers;  // extra headers (e.g. Retry-After)
  std::string body;
};

// One request and its response. Every method is thread-safe and may be called from any
// thread; the transport serializes the actual I/O on the connection's strand.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const Request& request() const = 0;

  // A complete response. Exactly one of respond() or start_stream() per exchange; later
  // calls are ignored.
  virtual void respond(Response response) = 0;

  // Server-sent events: sends 200 with text/event-stream, no-cache and chunked transfer,
  // then each write() in order, then the end of the body on end_stream().
  virtual void start_stream(Headers extra_headers = {}) = 0;
  virtual void write(std::string data) = 0;  // queued; never blocks
  virtual void end_stream() = 0;
  // Bytes queued by write() and not yet handed to the socket (a slow reader's backlog).
  virtual size_t queued_bytes() const = 0;

  // Runs fn on the connection's executor, after the functions posted before it. Handlers
  // use it to move work off the engine thread (RequestStream's on_event). Functions posted
  // to one exchange never run concurrently. Once the connection is gone they still run,
  // in order, on an I/O thread; after HttpServer::stop() they are dropped.
  virtual void post(std::function<void()> fn) = 0;

  // fn runs once, on the connection's executor, when the peer goes away (closed socket,
  // reset, write timeout, server stop) before the response is complete; at once if that has
  // already happened. Handlers abort their engine request in it. Never runs once the
  // response is complete (its last byte handed to the socket). After HttpServer::stop(),
  // a late on_abandon on an abandoned exchange runs fn on the caller's thread.
  virtual void on_abandon(std::function<void()> fn) = 0;
  virtual bool abandoned() const = 0;
};

// Called on an I/O thread for every well-formed request; must not block. Called
// concurrently for different connections. A throw before answering answers 500.
using Handler = std::function<void(std::shared_ptr<Exchange>)>;

// Runs on an I/O thread once a request's headers are in and checked, before its body is
// read (and before "100 Continue"): a response here (e.g. 401 for a missing API key) is
// sent instead of reading the body, and the handler never sees the request. `request` has
// everything but the body and received_at. Must not block; a throw answers 500.
using HeaderFilter = std::function<std::optional<Response>(const Request& request)>;

struct ServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;  // 0: any free port (see HttpServer::port())
  int io_threads = 2;
  size_t max_header_bytes = 16 * 1024;      // 431 beyond (request line + header fields)
  size_t max_header_count = 100;            // 431 beyond
  size_t max_body_bytes = 8 * 1024 * 1024;  // 413 beyond (Content-Length, or chunked)
  int max_connections = 10000;              // accepted and then closed at once beyond
  // Milliseconds, so tests can use short ones; `std::chrono::seconds{30}` still assigns.
  std::chrono::milliseconds read_timeout{30'000};        // whole request, from its first byte (408)
  std::chrono::milliseconds write_timeout{30'000};       // no progress writing to the peer
  std::chrono::milliseconds keep_alive_timeout{60'000};  // idle between requests
  // A stream whose unsent backlog passes this is abandoned (a reader too slow to keep up).
  size_t max_queued_bytes = 64 * 1024 * 1024;
  HeaderFilter header_filter;  // none: every well-formed request is read
};

// An OpenAI-shaped error: {"error": {"message", "type", "param", "code"}}. type defaults to
// "invalid_request_error" for 4xx and "server_error" for 5xx; param and code are null unless
// given. Handlers may use it too, so every error the server sends has one shape.
Response error_response(int status, std::string_view message, std::optional<std::string> param = std::nullopt,
                        std::optional<std::string> code = std::nullopt, std::string_view type = {});

}  // namespace tessera::http
