#include "sched/admission.h"

#include <sstream>

#include "core/error.h"

namespace tessera {

int http_status(RejectReason r) {
  switch (r) {
    case RejectReason::InvalidRequest: return 400;
    case RejectReason::QueueFull: return 429;
    case RejectReason::TenantLimit: return 429;
    case RejectReason::Draining: return 503;
  }
  return 500;
}

std::string_view reject_reason_name(RejectReason r) {
  switch (r) {
    case RejectReason::InvalidRequest: return "invalid_request";
    case RejectReason::QueueFull: return "queue_full";
    case RejectReason::TenantLimit: return "tenant_limit";
    case RejectReason::Draining: return "draining";
  }
  return "unknown";
}

namespace {
template <typename... Parts>
Rejection reject(RejectReason reason, Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return Rejection{reason, os.str()};
}
}  // namespace

std::optional<Rejection> AdmissionControl::admit(std::string_view tenant, int64_t prompt_tokens) {
  std::lock_guard lock(mutex_);
  if (draining_) return reject(RejectReason::Draining, "the engine is shutting down and admits no new requests");
  if (waiting_requests_ + 1 > limits_.max_waiting_requests)
    return reject(RejectReason::QueueFull, "waiting queue full: ", waiting_requests_, " requests waiting (limit ",
                  limits_.max_waiting_requests, ")");
  if (waiting_tokens_ + prompt_tokens > limits_.max_waiting_tokens)
    return reject(RejectReason::QueueFull, "waiting queue full: ", waiting_tokens_, " prompt tokens waiting + ",
                  prompt_tokens, " exceed the limit of ", limits_.max_waiting_tokens);
  int& mine = per_tenant_[std::string(tenant)];
  if (limits_.max_requests_per_tenant > 0 && mine >= limits_.max_requests_per_tenant) {
    return reject(RejectReason::TenantLimit, "tenant has ", mine, " requests in flight (limit ",
                  limits_.max_requests_per_tenant, ")");
  }
  ++mine;
  ++waiting_requests_;
  waiting_tokens_ += prompt_tokens;
  return std::nullopt;
}

void AdmissionControl::started(int64_t prompt_tokens) {
  std::lock_guard lock(mutex_);
  TESSERA_CHECK(waiting_requests_ > 0 && waiting_tokens_ >= prompt_tokens, "admission: start of a request not counted");
  --waiting_requests_;
  waiting_tokens_ -= prompt_tokens;
}

void AdmissionControl::finished(std::string_view tenant, bool was_started, int64_t prompt_tokens) {
  std::lock_guard lock(mutex_);
  if (!was_started) {
    TESSERA_CHECK(waiting_requests_ > 0 && waiting_tokens_ >= prompt_tokens, "admission: end of a request not counted");
    --waiting_requests_;
    waiting_tokens_ -= prompt_tokens;
  }
  const auto it = per_tenant_.find(std::string(tenant));
  TESSERA_CHECK(it != per_tenant_.end() && it->second > 0, "admission: end of a request of an unknown tenant");
  if (--it->second == 0) per_tenant_.erase(it);
}

void AdmissionControl::set_draining(bool on) {
  std::lock_guard lock(mutex_);
  draining_ = on;
}

bool AdmissionControl::draining() const {
  std::lock_guard lock(mutex_);
  return draining_;
}

int AdmissionControl::waiting_requests() const {
  std::lock_guard lock(mutex_);
  return waiting_requests_;
}

int64_t AdmissionControl::waiting_tokens() const {
  std::lock_guard lock(mutex_);
  return waiting_tokens_;
}

int AdmissionControl::in_flight(std::string_view tenant) const {
  std::lock_guard lock(mutex_);
  const auto it = per_tenant_.find(std::string(tenant));
  return it == per_tenant_.end() ? 0 : it->second;
}

}  // namespace tessera
