// The router's worker choice (src/server/router/worker_choice.h) as pure functions: the
// policy's names, the prompt prefix key, rendezvous hashing, least loaded with turns among
// ties, and the prefill choice's load guard.
#include "server/router/worker_choice.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"

using namespace tessera;
using namespace tessera::router;
using json = nlohmann::json;

TEST(RouterWorkerChoice, PolicyNames) {
  EXPECT_EQ(router_policy_from_name("load"), RouterPolicy::Load);
  EXPECT_EQ(router_policy_from_name("round-robin"), RouterPolicy::RoundRobin);
  EXPECT_EQ(router_policy_name(RouterPolicy::Load), "load");
  EXPECT_EQ(router_policy_name(RouterPolicy::RoundRobin), "round-robin");
  try {
    router_policy_from_name("least-loaded");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--router-policy 'least-loaded' is not one of: load, round-robin");
  }
}

TEST(RouterWorkerChoice, PromptPrefixText) {
  EXPECT_EQ(prompt_prefix_text(json{{"prompt", "hello"}}), "hello");
  EXPECT_EQ(prompt_prefix_text(json{{"prompt", json::array({"hello"})}}), "hello");  // one prompt in a list
  EXPECT_EQ(prompt_prefix_text(json{{"prompt", json::array({1, 2, 3})}}), "[1,2,3]");
  EXPECT_EQ(prompt_prefix_text(json{{"prompt", json::array({json::array({1, 2})})}}), "[1,2]");
  // Messages as JSON with sorted keys: the order the client wrote them in does not matter.
  const json a = json::parse(R"({"messages": [{"role": "system", "content": "be brief"}]})");
  const json b = json::parse(R"({"messages": [{"content": "be brief", "role": "system"}]})");
  EXPECT_EQ(prompt_prefix_text(a), R"([{"content":"be brief","role":"system"}])");
  EXPECT_EQ(prompt_prefix_text(a), prompt_prefix_text(b));
  EXPECT_EQ(prompt_prefix_text(json{{"model", "m"}}), std::nullopt);
  EXPECT_EQ(prompt_prefix_text(json{{"prompt", 7}}), std::nullopt);
  EXPECT_EQ(prompt_prefix_text(json::array()), std::nullopt);
  EXPECT_EQ(prompt_prefix_key(json{{"model", "m"}}), std::nullopt);
  // A long array is written only as far as the key reads, and that far exactly as dump() would.
  json tokens = json::array();
  for (int i = 0; i < 10000; ++i) tokens.push_back(i);
  const std::string text = prompt_prefix_text(json{{"prompt", tokens}}).value();
  EXPECT_GE(text.size(), kPrefixKeyBytes);
  EXPECT_LT(text.size(), 2 * kPrefixKeyBytes);
  EXPECT_EQ(text, tokens.dump().substr(0, text.size()));
}

TEST(RouterWorkerChoice, PrefixKeyReadsTheFirstBytesOnly) {
  const std::string shared(kPrefixKeyBytes, 's');
  EXPECT_EQ(prompt_prefix_text(json{{"prompt", shared + "tail"}}), shared);
  EXPECT_EQ(prompt_prefix_key(json{{"prompt", shared + "one question"}}),
            prompt_prefix_key(json{{"prompt", shared + "another question"}}));
  EXPECT_NE(prompt_prefix_key(json{{"prompt", "x" + shared}}), prompt_prefix_key(json{{"prompt", "y" + shared}}));
  EXPECT_NE(prompt_prefix_key(json{{"prompt", "short one"}}), prompt_prefix_key(json{{"prompt", "short two"}}));
  // Chat: a long system prompt makes the key; later turns do not change it.
  const json system = {{"role", "system"}, {"content", shared}};
  const json one = {{"messages", {system, {{"role", "user"}, {"content", "first"}}}}};
  const json two = {{"messages", {system, {{"role", "user"}, {"content", "second"}}}}};
  EXPECT_EQ(prompt_prefix_key(one), prompt_prefix_key(two));
  ASSERT_TRUE(prompt_prefix_key(one).has_value());
}

TEST(RouterWorkerChoice, LeastLoadedTakesTurnsAmongTheTied) {
  const std::vector<int64_t> idle = {0, 0, 0};
  std::vector<size_t> got;
  for (uint64_t r = 0; r < 6; ++r) got.push_back(least_loaded(idle, r));
  EXPECT_EQ(got, (std::vector<size_t>{0, 1, 2, 0, 1, 2}));
  const std::vector<int64_t> two_tied = {1, 0, 1, 0};
  got.clear();
  for (uint64_t r = 0; r < 4; ++r) got.push_back(least_loaded(two_tied, r));
  EXPECT_EQ(got, (std::vector<size_t>{1, 3, 1, 3}));
  const std::vector<int64_t> one_fewest = {5, 3, 4};
  for (uint64_t r = 0; r < 4; ++r) EXPECT_EQ(least_loaded(one_fewest, r), 1u);
  EXPECT_THROW(least_loaded(std::vector<int64_t>{}, 0), Error);
}

TEST(RouterWorkerChoice, RendezvousSpreadsKeysAndMovesFewWhenAWorkerLeaves) {
  const std::vector<uint64_t> three = {worker_hash("http://a:1"), worker_hash("http://b:1"), worker_hash("http://c:1")};
  const std::vector<uint64_t> without_b = {three[0], three[2]};
  std::vector<int> won(3, 0);
  int moved = 0;
  for (uint64_t key = 0; key < 3000; ++key) {
    const size_t w = rendezvous_worker(key * 0x9e3779b97f4a7c15ull, three);
    EXPECT_EQ(w, rendezvous_worker(key * 0x9e3779b97f4a7c15ull, three));  // deterministic
    ++won[w];
    const size_t after = rendezvous_worker(key * 0x9e3779b97f4a7c15ull, without_b);
    // A key b did not hold stays where it was; b's keys move to either of the others.
    if (w != 1)
      EXPECT_EQ(after, w == 0 ? 0u : 1u) << "key " << key;
    else
      ++moved;
  }
  for (int n : won) EXPECT_GT(n, 800) << "one of three workers won only " << n << " of 3000 keys";
  EXPECT_EQ(moved, won[1]);
}

TEST(RouterWorkerChoice, PrefillAffinityHoldsUntilTheLoadGuard) {
  const std::vector<uint64_t> workers = {worker_hash("http://p0:1"), worker_hash("http://p1:1")};
  const uint64_t key = 42;
  const size_t affine = rendezvous_worker(key, workers);
  const size_t other = 1 - affine;
  std::vector<int64_t> in_flight(2, 0);
  PrefillChoice c = choose_prefill_worker(key, workers, in_flight, 0);
  EXPECT_EQ(c.worker, affine);
  EXPECT_EQ(c.outcome, AffinityOutcome::Hit);
  in_flight[affine] = kAffinitySlack;  // busier, within the slack: kept
  c = choose_prefill_worker(key, workers, in_flight, 0);
  EXPECT_EQ(c.worker, affine);
  EXPECT_EQ(c.outcome, AffinityOutcome::Hit);
  in_flight[affine] = kAffinitySlack + 1;  // past it: the least loaded
  for (uint64_t rotation = 0; rotation < 3; ++rotation) {
    c = choose_prefill_worker(key, workers, in_flight, rotation);
    EXPECT_EQ(c.worker, other);
    EXPECT_EQ(c.outcome, AffinityOutcome::Overloaded);
  }
  in_flight[other] = 1;  // the guard is relative to the least loaded
  c = choose_prefill_worker(key, workers, in_flight, 0);
  EXPECT_EQ(c.worker, affine);
  EXPECT_EQ(c.outcome, AffinityOutcome::Hit);
  // A single worker is always the key's.
  const std::vector<uint64_t> one = {workers[0]};
  const std::vector<int64_t> busy = {100};
  EXPECT_EQ(choose_prefill_worker(key, one, busy, 0).outcome, AffinityOutcome::Hit);
  EXPECT_THROW(choose_prefill_worker(key, workers, busy, 0), Error);  // counts and workers disagree
}
