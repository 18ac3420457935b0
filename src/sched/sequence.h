#pragma once
// What the scheduler knows of a request and of each of its sequences (one per choice).
#include <compare>
#include <cstdint>
#include <string_view>
#include <vector>

#include "kv/block_manager.h"

namespace tessera {

using RequestId = uint64_t;
using SeqId = uint64_t;

enum class FinishReason : uint8_t { None, Stop, Length, Abort, Error };
std::string_view finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error"

// When a sequence stops generating (checked after every token, by the scheduler).
struct StopCriteria {
  int32_t max_tokens = 256;  // output tokens
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;  // end-of-generation tokens do not stop
};

// A request as the scheduler receives it, after admission.
struct SchedRequest {
  RequestId id = 0;
  std::vector<int32_t> prompt;  // [n_prompt], at least one token
  int n = 1;                    // choices; n > 1 forks after the prompt, sharing its KV
  int32_t priority = 0;         // lower runs first (priority policy only)
  StopCriteria stop;
  BlockHash prefix_root;  // prefix_root_hash(model fingerprint, adapter, tenant salt)
  // Logits for every prompt position (prompt logprobs): takes no prefix-cache hits, since
  // cached positions have no logits; its full blocks are still published.
  bool prompt_logits = false;
};

// Waiting and Swapped sequences are in the waiting queue; Swapped ones keep their KV in the
// host tier.
enum class SeqStatus : uint8_t { Waiting, Running, Swapped, Finished };

// Scheduling order: the lower key runs first and is preempted last.
struct OrderKey {
  int64_t priority = 0;  // 0 under FCFS
  uint64_t arrival = 0;  // admission order of the request
  int32_t choice = 0;
  auto operator<=>(const OrderKey&) const = default;
};

struct Sequence {
  SeqId id = 0;
  RequestId request = 0;
  int32_t choice = 0;
  OrderKey key;
  SeqStatus status = SeqStatus::Waiting;
  std::vector<int32_t> tokens;  // prompt, then output
  int32_t n_prompt = 0;
  SeqKv kv;  // kv.n_computed(): tokens whose KV is in the cache
  int32_t n_preemptions = 0;
  // Speculative decoding: tokens proposed to follow `tokens`, verified the next time the
  // sequence is scheduled in decode state (Scheduler::set_draft); never part of `tokens`
  // until verified. Cleared by every update and preemption.
  std::vector<int32_t> draft;
  std::vector<int16_t> draft_parents;  // a tree's (Draft::parents), or empty: a chain

  int n_computed() const { return kv.n_computed(); }
  int n_output() const { return static_cast<int>(tokens.size()) - n_prompt; }
  // Everything but the last token is in KV: the next step computes one token and samples.
  bool decoding() const { return status == SeqStatus::Running && n_computed() + 1 == static_cast<int>(tokens.size()); }
};

}  // namespace tessera
