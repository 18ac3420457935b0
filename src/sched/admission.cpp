#include "sched/admission.h"

#include <sstream>

#include "core/error.h"

namespace tessera {

int http_status(RejectReason r) {
  switch (r) {
    case RejectReason::InvalidRequest:
      return 400;
    case RejectReason::QueueFull:
      return 429;
    case RejectReason::TenantLimit:
      return 429;
    case RejectReason::Draining:
      return 503;
  }
  return 500;
}

std::string_view reject_reason_name(RejectReason r) {
  switch (r) {
    case RejectReason::InvalidRequest:
      return "invalid_request";
    case RejectReason::QueueFull:
      return "queue_full";
    case RejectReason::TenantLimit:
      return "tenant_limit";
    case RejectReason::Draining:
      return "draining";
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

std::optional<Rejection> AdmissionControl::admit(std::string_view tenant, int64_t prompt_tokens, int64_t budget_tokens,
                                                 int sequences) {
  TESSERA_CHECK(prompt_tokens >= 0 && budget_tokens >= prompt_tokens, "admission: budget of ", budget_tokens,
                " tokens for a prompt of ", prompt_tokens);
  TESSERA_CHECK(sequences >= 1, "admission: a request of ", sequences, " sequences");
  const int64_t token_limit = limits_.max_tokens_per_tenant;
  const int seq_limit = limits_.max_requests_per_tenant;
  // Never admissible, whatever the load: not worth a retry.
  if (seq_limit > 0 && sequences > seq_limit)
    return reject(RejectReason::InvalidRequest, "request has ", sequences,
                  " sequences (n) but a tenant may have at most ", seq_limit, " in flight");
  if (token_limit > 0 && budget_tokens > token_limit)
    return reject(RejectReason::InvalidRequest, "request needs ", budget_tokens,
                  " tokens (prompt + max_tokens x n) but a tenant may have at most ", token_limit, " in flight");
  std::lock_guard lock(mutex_);
  if (draining_) return reject(RejectReason::Draining, "the engine is shutting down and admits no new requests");
  if (waiting_requests_ + 1 > limits_.max_waiting_requests)
    return reject(RejectReason::QueueFull, "waiting queue full: ", waiting_requests_, " requests waiting (limit ",
                  limits_.max_waiting_requests, ")");
  if (waiting_tokens_ + prompt_tokens > limits_.max_waiting_tokens)
    return reject(RejectReason::QueueFull, "waiting queue full: ", waiting_tokens_, " prompt tokens waiting + ",
                  prompt_tokens, " exceed the limit of ", limits_.max_waiting_tokens);
  const auto it = per_tenant_.find(std::string(tenant));
  const TenantLoad load = it == per_tenant_.end() ? TenantLoad{} : it->second;
  if (seq_limit > 0 && load.sequences + sequences > seq_limit) {
    return reject(RejectReason::TenantLimit, "tenant has ", load.sequences, " sequences in flight + ", sequences,
                  " for this request exceed the limit of ", seq_limit);
  }
  if (token_limit > 0 && load.tokens + budget_tokens > token_limit) {
    return reject(RejectReason::TenantLimit, "tenant has ", load.tokens, " tokens in flight + ", budget_tokens,
                  " for this request (prompt + max_tokens x n) exceed the limit of ", token_limit);
  }
  TenantLoad& mine = per_tenant_[std::string(tenant)];
  mine.sequences += sequences;
  mine.tokens += budget_tokens;
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

void AdmissionControl::finished(std::string_view tenant, bool was_started, int64_t prompt_tokens, int64_t budget_tokens,
                                int sequences) {
  std::lock_guard lock(mutex_);
  // Every check before any change: a refused release leaves the counts as they were.
  TESSERA_CHECK(was_started || (waiting_requests_ > 0 && waiting_tokens_ >= prompt_tokens),
                "admission: end of a request not counted");
  const auto it = per_tenant_.find(std::string(tenant));
  TESSERA_CHECK(it != per_tenant_.end() && it->second.sequences >= sequences && it->second.tokens >= budget_tokens,
                "admission: end of a request its tenant does not count");
  if (!was_started) {
    --waiting_requests_;
    waiting_tokens_ -= prompt_tokens;
  }
  it->second.tokens -= budget_tokens;
  it->second.sequences -= sequences;
  if (it->second.sequences == 0) {
    TESSERA_CHECK(it->second.tokens == 0, "admission: tenant has ", it->second.tokens,
                  " tokens left with no request in flight");
    per_tenant_.erase(it);
  }
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
  return it == per_tenant_.end() ? 0 : it->second.sequences;
}

int64_t AdmissionControl::tokens_in_flight(std::string_view tenant) const {
  std::lock_guard lock(mutex_);
  const auto it = per_tenant_.find(std::string(tenant));
  return it == per_tenant_.end() ? 0 : it->second.tokens;
}

}  // namespace tessera
