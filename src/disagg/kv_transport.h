#pragma once
// The KV transport interface (docs/design/disaggregation.md): a prefill engine serves its
// leases, a decode engine pulls one into host staging it reserved. Built: TCP with host
// staging (tcp_transport.h), which any two hosts and CI's CPUs can run. An NCCL send/recv or
// CUDA IPC transport implements the same two roles with device buffers instead of staging;
// they are not built.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "engine/engine.h"
#include "engine/kv_transfer.h"

namespace tessera::disagg {

// Where a lease can be pulled from: the prefill worker's answer. Text form "host:port/id".
struct KvHandle {
  std::string host;
  uint16_t port = 0;
  uint64_t lease = 0;
  int32_t n_blocks = 0;         // blocks under the lease (the decode side reserves this many, at most)
  std::string address() const;  // "host:port/id"
  // Parses address(); throws tessera::Error naming what is wrong.
  static KvHandle parse(const std::string& address, int32_t n_blocks);
};

// What a prefill engine offers a transport: its identity, a lease's blocks staged in host
// memory, and the release after a completed pull. EngineLeaseSource adapts an Engine.
class KvLeaseSource {
 public:
  virtual ~KvLeaseSource() = default;
  virtual KvIdentity identity() const = 0;
  // Throws tessera::Error (unknown or expired lease): the puller gets the message.
  virtual std::shared_ptr<const KvBlocksPayload> stage(uint64_t lease) = 0;
  virtual void release(uint64_t lease) = 0;
};

class EngineLeaseSource final : public KvLeaseSource {
 public:
  explicit EngineLeaseSource(Engine& engine) : engine_(engine) {}
  KvIdentity identity() const override { return engine_.kv_identity(); }
  std::shared_ptr<const KvBlocksPayload> stage(uint64_t lease) override { return engine_.export_kv_lease(lease); }
  void release(uint64_t lease) override { engine_.release_kv_lease(lease); }

 private:
  Engine& engine_;
};

// Counters of one process's transfers, both roles (/metrics: tessera:kv_transfer_*).
struct KvTransferCounters {
  // Prefill side.
  std::atomic<int64_t> served{0};           // pulls answered with every block and acknowledged
  std::atomic<int64_t> serve_failures{0};   // refused (identity, lease, authentication) or broken off
  std::atomic<int64_t> unauthenticated{0};  // of which the Pull's MAC did not verify
  std::atomic<int64_t> bytes_sent{0};
  // Decode side.
  std::atomic<int64_t> pulled{0};
  std::atomic<int64_t> pull_failures{0};  // any reason: the request then prefilled locally
  std::atomic<int64_t> pull_timeouts{0};  // of which the transfer stalled or took too long
  std::atomic<int64_t> bytes_received{0};
  std::atomic<int64_t> pull_micros{0};  // time in successful pulls
  // Requests that came with a handle and prefilled locally instead (the server counts these:
  // no room to reserve, a failed pull, or an import the engine refused).
  std::atomic<int64_t> fallbacks{0};
};

// Pulls a lease's blocks into `staging` (its slots bound how many are taken). Throws
// KvTransferError naming what failed: connection, timeout (the whole pull has `timeout`),
// a refused identity or lease, a bad or corrupted message.
class KvPuller {
 public:
  virtual ~KvPuller() = default;
  virtual std::shared_ptr<KvBlocksPayload> pull(const KvHandle& handle, const KvIdentity& expect,
                                                std::shared_ptr<HostKvTier> staging,
                                                std::chrono::milliseconds timeout) = 0;
};

}  // namespace tessera::disagg
