#pragma once
// How the router picks a worker (docs/design/disaggregation.md, "The router"). Pure functions
// of the workers' in-flight call counts and a request's prompt prefix: the router counts and
// locks (router.cpp), these only decide, so they are tested on their own.
//
// Policy `load` (the default):
// - decode: the worker with the fewest calls in flight, ties taken in turn;
// - prefill: prefix affinity with a load guard (the idea of SGLang's cache-aware router and
//   llm-d's prefix scorer). A key hashes the first kPrefixKeyBytes of the request's prompt;
//   rendezvous (highest-random-weight) hashing of (key, worker URL) names the worker whose
//   prefix cache likely holds it, so requests sharing a system prompt and early turns meet
//   there, and adding or removing a worker moves only the keys it wins or held. That worker
//   is passed over when it has more than kAffinitySlack calls in flight beyond the least
//   loaded one: the least loaded takes the request instead.
// Policy `round-robin`: each list in turn, whatever the load.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tessera::router {

enum class RouterPolicy { Load, RoundRobin };

// "load" or "round-robin"; throws tessera::Error naming --router-policy and both values.
RouterPolicy router_policy_from_name(std::string_view name);
std::string_view router_policy_name(RouterPolicy policy);

// The prompt bytes that make a prefix key: about the first 250 tokens. Enough to tell system
// prompts apart; requests that share fewer leading bytes than this get different keys (a
// prefix tree would match shorter shared prefixes; this is the cheap, stateless version).
constexpr size_t kPrefixKeyBytes = 1024;
// How many calls in flight the affinity worker may have beyond the least loaded worker
// before the request goes to the least loaded instead. A prefix cache hit saves a prefill;
// queueing behind more than a couple of prefills costs more than that.
constexpr int64_t kAffinitySlack = 2;

// The text a prefix key hashes: a completion's prompt (the string; a token array as its JSON
// text; a one-element list as its element) or a chat request's messages as JSON (keys sorted,
// so equal messages give equal text). Only as much as the key reads: a string's first
// kPrefixKeyBytes, an array's elements until they fill them. nullopt when the body has neither.
std::optional<std::string> prompt_prefix_text(const nlohmann::json& body);
// XXH3 of the first kPrefixKeyBytes of prompt_prefix_text; nullopt when it has none.
std::optional<uint64_t> prompt_prefix_key(const nlohmann::json& body);

// A worker's identity for rendezvous hashing (XXH3 of its URL).
uint64_t worker_hash(std::string_view url);
// The worker with the highest weight for this key (ties: the lower index). Workers non-empty.
size_t rendezvous_worker(uint64_t key, std::span<const uint64_t> worker_hashes);

// The worker with the fewest calls in flight; among the k tied for fewest, the
// (rotation mod k)-th, so that successive choices over an idle cluster take each in turn.
size_t least_loaded(std::span<const int64_t> in_flight, uint64_t rotation);

enum class AffinityOutcome {
  Hit,         // the key's rendezvous worker took the request
  Overloaded,  // it had more than kAffinitySlack calls beyond the least loaded: that one took it
};

struct PrefillChoice {
  size_t worker = 0;
  AffinityOutcome outcome = AffinityOutcome::Hit;
};

// worker_hashes and in_flight: one entry per prefill worker, in the same order.
PrefillChoice choose_prefill_worker(uint64_t key, std::span<const uint64_t> worker_hashes,
                                    std::span<const int64_t> in_flight, uint64_t rotation);

}  // namespace tessera::router
