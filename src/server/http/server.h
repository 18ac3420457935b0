#pragma once
// The HTTP/1.1 server: Boost.Beast parsing on Asio, a fixed pool of I/O threads, one strand
// per connection (no thread per connection). Requests reach the Handler as Exchanges
// (exchange.h). Threading, ownership, limits and shutdown: docs/design/http-server.md.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "server/http/exchange.h"

namespace tessera::http {

// What the transport has seen, for tests and metrics. Counters from `accepted` on only grow.
struct ServerCounters {
  size_t open_connections = 0;  // sockets open now
  size_t live_connections = 0;  // connection objects in memory (open or finishing)
  size_t live_exchanges = 0;    // Exchange objects in memory (held by handlers or queued)
  size_t answering = 0;         // connections answering a request now, last byte not yet written
  uint64_t accepted = 0;        // connections accepted and served
  uint64_t refused = 0;         // connections closed at once (max_connections, stopping)
  uint64_t requests = 0;        // requests handed to the handler
  uint64_t rejected = 0;        // requests answered by the transport with a 4xx/5xx
  uint64_t abandoned = 0;       // exchanges abandoned (peer gone, timeout, stop)
  uint64_t read_timeouts = 0;   // 408s and idle closes
  uint64_t write_timeouts = 0;  // peers that stopped reading
};

class HttpServer {
 public:
  HttpServer(ServerOptions options, Handler handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds host:port (throws tessera::Error naming them on failure) and runs io_threads
  // threads. Once only.
  void start();
  // The bound port (useful with port 0). Valid after start().
  uint16_t port() const;
  // Closes the listener: new connections are refused; existing ones carry on, and their
  // responses from now on say "Connection: close". Returns once the listener is closed
  // (when called from outside the I/O threads).
  void stop_accepting();
  // Closes every connection (pending exchanges get on_abandon, on their strands), then
  // joins the I/O threads. Exchange calls made afterwards do nothing, except that
  // on_abandon on an abandoned exchange runs its function at once on the caller's thread.
  // Must not be called from a handler or an I/O thread (it waits for them).
  void stop();

  size_t open_connections() const;
  ServerCounters counters() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::http
