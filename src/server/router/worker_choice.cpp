#include "server/router/worker_choice.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/error.h"

// Header-only: the functions are compiled here, nothing to link (libxxhash-dev, bootstrap.sh).
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace tessera::router {

using json = nlohmann::json;

RouterPolicy router_policy_from_name(std::string_view name) {
  if (name == "load") return RouterPolicy::Load;
  if (name == "round-robin") return RouterPolicy::RoundRobin;
  fail("--router-policy '", name, "' is not one of: load, round-robin");
}

std::string_view router_policy_name(RouterPolicy policy) {
  return policy == RouterPolicy::Load ? "load" : "round-robin";
}

namespace {

// Invalid UTF-8 cannot come from json::parse, but dump() must never throw here.
std::string json_text(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// The array's JSON text, written element by element only until it holds kPrefixKeyBytes: a
// long conversation or token list is not serialized whole for its first kilobyte.
std::string array_text_prefix(const json& array) {
  std::string out = "[";
  for (const json& element : array) {
    if (out.size() >= kPrefixKeyBytes) return out;
    if (out.size() > 1) out += ',';
    out += json_text(element);
  }
  return out + "]";
}

}  // namespace

std::optional<std::string> prompt_prefix_text(const json& body) {
  if (!body.is_object()) return std::nullopt;
  if (const auto p = body.find("prompt"); p != body.end()) {
    const json& prompt = p->is_array() && p->size() == 1 && !(*p)[0].is_number() ? (*p)[0] : *p;
    if (prompt.is_string()) return prompt.get_ref<const std::string&>().substr(0, kPrefixKeyBytes);
    if (prompt.is_array()) return array_text_prefix(prompt);  // token ids: "[1,2,3": shared ids, shared bytes
    return std::nullopt;
  }
  if (const auto m = body.find("messages"); m != body.end() && m->is_array()) return array_text_prefix(*m);
  return std::nullopt;
}

std::optional<uint64_t> prompt_prefix_key(const json& body) {
  const std::optional<std::string> t = prompt_prefix_text(body);
  if (!t) return std::nullopt;
  return XXH3_64bits(t->data(), std::min(t->size(), kPrefixKeyBytes));
}

uint64_t worker_hash(std::string_view url) { return XXH3_64bits(url.data(), url.size()); }

size_t rendezvous_worker(uint64_t key, std::span<const uint64_t> worker_hashes) {
  TESSERA_CHECK(!worker_hashes.empty(), "rendezvous_worker: no workers");
  size_t best = 0;
  uint64_t best_weight = 0;
  for (size_t i = 0; i < worker_hashes.size(); ++i) {
    // The key hashed with the worker as seed: independent weights per worker, so removing
    // one only moves the keys it won.
    const uint64_t weight = XXH3_64bits_withSeed(&key, sizeof key, worker_hashes[i]);
    if (i == 0 || weight > best_weight) {
      best = i;
      best_weight = weight;
    }
  }
  return best;
}

size_t least_loaded(std::span<const int64_t> in_flight, uint64_t rotation) {
  TESSERA_CHECK(!in_flight.empty(), "least_loaded: no workers");
  const int64_t fewest = *std::min_element(in_flight.begin(), in_flight.end());
  const auto tied = static_cast<uint64_t>(std::count(in_flight.begin(), in_flight.end(), fewest));
  uint64_t skip = rotation % tied;
  for (size_t i = 0; i < in_flight.size(); ++i)
    if (in_flight[i] == fewest && skip-- == 0) return i;
  return 0;  // unreachable: skip < tied
}

PrefillChoice choose_prefill_worker(uint64_t key, std::span<const uint64_t> worker_hashes,
                                    std::span<const int64_t> in_flight, uint64_t rotation) {
  TESSERA_CHECK(worker_hashes.size() == in_flight.size(), "choose_prefill_worker: ", worker_hashes.size(),
                " workers but ", in_flight.size(), " in-flight counts");
  const size_t affine = rendezvous_worker(key, worker_hashes);
  const int64_t fewest = *std::min_element(in_flight.begin(), in_flight.end());
  if (in_flight[affine] <= fewest + kAffinitySlack) return {affine, AffinityOutcome::Hit};
  return {least_loaded(in_flight, rotation), AffinityOutcome::Overloaded};
}

}  // namespace tessera::router
