#pragma once
// Admission control and backpressure: decides, before a request enters the engine (and
// before a server sends stream headers), whether there is room for it. Bounded waiting
// queue (requests and prompt tokens not yet started), per-tenant in-flight limits (requests,
// and tokens: prompt + max_tokens x n of each request), and a draining switch for shutdown. Thread-safe: submit paths call admit() from any thread,
// the engine thread reports started() and finished().
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tessera {

// Typed refusals, so the server can answer without guessing.
enum class RejectReason : uint8_t {
  InvalidRequest,  // 400: the request can never be served as asked
  QueueFull,       // 429: the waiting queue is full (requests or tokens); retry later
  TenantLimit,     // 429: this tenant has too many requests or tokens in flight
  Draining,        // 503: the engine is shutting down
};
int http_status(RejectReason r);
std::string_view reject_reason_name(RejectReason r);

struct Rejection {
  RejectReason reason = RejectReason::InvalidRequest;
  std::string message;  // names what is wrong, with the numbers involved
};

struct AdmissionLimits {
  int max_waiting_requests = 4096;       // submitted, not yet scheduled
  int64_t max_waiting_tokens = 1 << 24;  // their prompt tokens
  // Sequences in flight (waiting or running) per tenant: a request counts its n choices, so
  // one request cannot hold n times what the limit says. 0 = no limit; a request with more
  // choices than the limit on its own is invalid (400).
  int max_requests_per_tenant = 0;
  // Tokens in flight per tenant, each request counting prompt + max_tokens x n (what it may
  // hold of the KV cache); 0 = no limit. A request over the limit on its own is invalid (400).
  int64_t max_tokens_per_tenant = 0;
};

class AdmissionControl {
 public:
  explicit AdmissionControl(const AdmissionLimits& limits) : limits_(limits) {}

  // Counts the request in, or says why not (and counts nothing). budget_tokens: prompt +
  // max_tokens x n, for the per-tenant token limit; sequences: its n, for the per-tenant
  // sequence limit.
  std::optional<Rejection> admit(std::string_view tenant, int64_t prompt_tokens, int64_t budget_tokens,
                                 int sequences = 1);
  // The request was scheduled for the first time: it leaves the waiting queue.
  void started(int64_t prompt_tokens);
  // The request left the engine; was_started says whether started() was reported. The
  // token and sequence counts are those given to admit().
  void finished(std::string_view tenant, bool was_started, int64_t prompt_tokens, int64_t budget_tokens,
                int sequences = 1);
  void set_draining(bool on);
  bool draining() const;

  int waiting_requests() const;
  int64_t waiting_tokens() const;
  int in_flight(std::string_view tenant) const;  // sequences
  int64_t tokens_in_flight(std::string_view tenant) const;

 private:
  struct TenantLoad {
    int sequences = 0;
    int64_t tokens = 0;
  };
  AdmissionLimits limits_;
  mutable std::mutex mutex_;
  bool draining_ = false;
  int waiting_requests_ = 0;
  int64_t waiting_tokens_ = 0;
  std::unordered_map<std::string, TenantLoad> per_tenant_;
};

}  // namespace tessera
