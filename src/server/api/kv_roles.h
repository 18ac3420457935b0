#pragma once
// The worker roles of a disaggregated deployment (docs/design/disaggregation.md, "The
// serving roles"): what `tessera serve --role prefill|decode` does with a generation request.
//
//   prefill: the request runs with max_tokens = 1 and a KV lease; the answer carries
//            kv_transfer_params naming the lease (host:port/id of the worker's KV server).
//   decode:  a request whose kv_transfer_params carry a handle reserves the blocks, pulls
//            them (on a pull thread, never an I/O thread) and is submitted with the import;
//            any failure gives the reservation back and the request prefills here instead,
//            counted as a fallback.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "disagg/kv_transport.h"
#include "engine/engine.h"

namespace tessera::api {

enum class ServeRole { Colocated, Prefill, Decode };
// "colocated", "prefill", "decode".
const char* serve_role_name(ServeRole role);
// Throws tessera::Error naming the accepted values.
ServeRole serve_role_from_name(const std::string& name);

struct KvRoleOptions {
  ServeRole role = ServeRole::Colocated;
  // Prefill: the lease each request leaves its prompt's KV under, and where decode workers
  // reach this worker's KV server (the handle's host:port).
  double lease_seconds = 30;
  int block_size = 16;  // the engine's: a prompt of fewer than block_size + 1 tokens gets no lease
  std::string kv_host;
  uint16_t kv_port = 0;
  // Decode: pulls through `puller` (not owned), each within pull_timeout, on pull_threads
  // threads (a pull waits on the network: not on the prompt workers, not on I/O threads).
  disagg::KvPuller* puller = nullptr;
  std::chrono::milliseconds pull_timeout{5000};
  int pull_threads = 4;
  // Both: this worker's transfer counters (fallbacks are counted here); may be null.
  disagg::KvTransferCounters* counters = nullptr;
  // One line per fallback, saying why the KV was not imported; empty: none.
  std::function<void(const std::string&)> log;
};

// A pulled import waiting for its request. The reservation is given back when this is
// destroyed, unless the engine accepted the request that carries it (handed_over()).
class PulledKv {
 public:
  PulledKv(Engine& engine, KvImport import) : engine_(engine), import_(std::move(import)) {}
  ~PulledKv() { give_back(); }
  PulledKv(const PulledKv&) = delete;
  PulledKv& operator=(const PulledKv&) = delete;

  const KvImport& import() const { return import_; }
  // The pulled blocks (the reservation's staging, filled).
  void attach(std::shared_ptr<const KvBlocksPayload> payload) { import_.payload = std::move(payload); }
  // The engine accepted the request carrying import(): the reservation is the request's now.
  void handed_over() { settled_ = true; }
  // Cancels the reservation now (once; never throws: a stopped engine has nothing to give back).
  void give_back();

 private:
  Engine& engine_;
  KvImport import_;
  bool settled_ = false;
};

// What a generation request carries for its role (GenerationPlan::kv).
struct KvPlan {
  // Prefill: > 0 runs the request under a lease of this many seconds.
  double lease_seconds = 0;
  std::string server_host;  // the handle's host:port in the answer
  uint16_t server_port = 0;
  // Decode: where to pull the prompt's KV from, and the import once pulled (null: the pull
  // failed or was not tried; the request prefills locally).
  std::optional<disagg::KvHandle> pull;
  std::shared_ptr<PulledKv> pulled;
  // The role's counters and fallback log (KvRoleOptions), for the submit-time fallback.
  disagg::KvTransferCounters* counters = nullptr;
  std::function<void(const std::string&)> log;
  // Runs a blocking engine call (giving a refused import back) off the connection's
  // executor, on a pull thread; empty: inline.
  std::function<void(std::function<void()>)> off_io;
};

// Decode side, blocking (a pull thread): reserves handle.n_blocks blocks, pulls them within
// options.pull_timeout and returns the import. On any failure (no room, the pull failed or
// timed out, a refused identity or lease) the reservation is given back, the fallback is
// counted and logged, and null is returned: the request prefills locally.
std::shared_ptr<PulledKv> pull_kv(Engine& engine, const KvRoleOptions& options, const disagg::KvHandle& handle);

// A fallback: counts it in `counters` (when set) and logs "kv transfer: <handle>: <why>;
// prefilling locally".
void note_fallback(disagg::KvTransferCounters* counters, const std::function<void(const std::string&)>& log,
                   const std::string& handle, const std::string& why);

}  // namespace tessera::api
