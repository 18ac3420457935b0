#pragma once
// Internal to src/server/http/: the state a server shares with its connections and
// exchanges. Held by shared_ptr from all three, so an Exchange a handler keeps after the
// server is gone still has a valid (closed) gate to look at.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

#include "server/http/exchange.h"

namespace boost::asio {
class io_context;
}

namespace tessera::http::detail {

class Connection;

struct ServerState {
  ServerState(ServerOptions options_in, Handler handler_in)
      : options(std::move(options_in)), handler(std::move(handler_in)) {}

  const ServerOptions options;
  const Handler handler;

  // The gate between foreign threads and the io_context. Anything that posts into the
  // io_context from outside holds it shared and checks `open`; stop() closes it
  // exclusively, after which the io_context may be destroyed at any time.
  std::shared_mutex gate;
  bool open = true;                               // guarded by gate
  boost::asio::io_context* io_context = nullptr;  // valid while open

  std::atomic<bool> draining{false};  // stop_accepting(): responses say Connection: close
  std::atomic<bool> stopping{false};  // stop(): accepted sockets are closed at once

  // Open connections. The registry owns them, so a connection whose handler is working
  // (no I/O pending on it) stays alive until its socket is closed.
  std::mutex registry_mutex;
  std::unordered_map<const Connection*, std::shared_ptr<Connection>> registry;

  std::atomic<size_t> open_connections{0};
  std::atomic<size_t> live_connections{0};
  std::atomic<size_t> live_exchanges{0};
  std::atomic<size_t> answering{0};  // connections in Phase::Handling (response not all written)
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> rejected{0};
  std::atomic<uint64_t> abandoned{0};
  std::atomic<uint64_t> read_timeouts{0};
  std::atomic<uint64_t> write_timeouts{0};
};

}  // namespace tessera::http::detail
