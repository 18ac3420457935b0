#pragma once
// The TCP transport with host staging (Boost.Asio): the prefill worker listens on a port of
// its own and streams a lease's blocks (one checksummed message each, kv_wire.h) to the
// decode worker that pulls them, which acknowledges the last; only then is the lease
// released. Every read and write has a deadline, so a stalled peer ends the transfer instead
// of holding a thread or a reservation.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "disagg/kv_transport.h"

namespace tessera::disagg {

struct TcpKvServerOptions {
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0: any free port (port() says which)
  // Each message's read or write on a connection must finish within this.
  std::chrono::milliseconds io_timeout{10000};
  // The pre-shared secret (kv_auth.h): with one, a pull must authenticate and every frame is
  // MACed; empty: none (then bind to loopback or a private network only).
  std::string secret;
};

// Serves a KvLeaseSource's leases. One thread accepts; each pull runs on its own thread.
class TcpKvServer {
 public:
  TcpKvServer(KvLeaseSource& source, TcpKvServerOptions options, KvTransferCounters* counters = nullptr);
  ~TcpKvServer();  // stop()
  TcpKvServer(const TcpKvServer&) = delete;
  TcpKvServer& operator=(const TcpKvServer&) = delete;
  // Binds (throws tessera::Error naming host:port on failure) and starts accepting.
  void start();
  uint16_t port() const;
  const std::string& host() const;
  // Stops accepting, then waits for the pulls in progress (each bounded by io_timeout).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TcpKvPuller final : public KvPuller {
 public:
  // secret: as the server's (TcpKvServerOptions::secret); a puller with one refuses a server
  // without, and the other way round.
  explicit TcpKvPuller(KvTransferCounters* counters = nullptr, std::string secret = {})
      : counters_(counters), secret_(std::move(secret)) {}
  std::shared_ptr<KvBlocksPayload> pull(const KvHandle& handle, const KvIdentity& expect,
                                        std::shared_ptr<HostKvTier> staging,
                                        std::chrono::milliseconds timeout) override;

 private:
  KvTransferCounters* counters_;
  std::string secret_;
};

}  // namespace tessera::disagg
