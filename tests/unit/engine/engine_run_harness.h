#pragma once
// Runs requests through a fresh EngineCore over a loaded ModelEngine and collects what each
// choice produced, checking the engine's invariants every step and that every KV block is
// free at the end. Shared by the real-model engine tests.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "engine/engine_core.h"
#include "engine/engine_model.h"

namespace tessera::test {

struct RunResult {
  std::map<RequestId, RequestOutput> out;
  std::map<RequestId, std::vector<std::vector<Logprobs>>> logprobs;  // [request][choice][token]
  std::map<RequestId, std::shared_ptr<const std::vector<Logprobs>>> prompt_logprobs;
  EngineStats stats;
};

// Submitted together, or one at a time when `alone`; n_blocks > 0 uses only the first
// n_blocks of the cache; tweak adjusts the config (preemption mode, ...).
inline RunResult run_engine(ModelEngine& model, const std::vector<Request>& requests, bool alone, int n_blocks = 0,
                            bool prefix_caching = true, const std::function<void(EngineConfig&)>& tweak = {}) {
  EngineConfig c = model.config();
  c.check_invariants = true;
  c.prefix_caching = prefix_caching;
  if (n_blocks > 0) c.n_blocks = n_blocks;  // the first n_blocks of the cache
  if (tweak) tweak(c);
  EngineCore core(c, model.executor());
  RunResult result;
  std::map<RequestId, RequestOutput>& out = result.out;
  const auto drain = [&] {
    while (core.has_work()) {
      const StepResult s = core.step();
      EXPECT_EQ(s.error, "");
      for (const auto& [id, entries] : s.prompt_logprobs) result.prompt_logprobs[id] = entries;
      for (const SeqEvent& e : s.events) {
        RequestOutput& o = out[e.request];
        if (e.token >= 0) o.tokens[e.choice].push_back(e.token);
        if (e.finish != FinishReason::None) o.finish[e.choice] = e.finish;
        if (e.logprobs) {
          auto& lp = result.logprobs[e.request];
          lp.resize(o.tokens.size());
          lp[e.choice].push_back(*e.logprobs);
        }
      }
    }
  };
  for (size_t i = 0; i < requests.size(); ++i) {
    const RequestId id = i + 1;
    out[id].tokens.resize(requests[i].n);
    out[id].finish.assign(requests[i].n, FinishReason::None);
    core.add(id, requests[i]);
    if (alone) drain();
  }
  drain();
  result.stats = core.stats();
  EXPECT_TRUE(core.is_idle());
  EXPECT_EQ(core.kv().n_free(), core.kv().n_blocks());
  EXPECT_EQ(core.kv().n_host_free(), core.kv().n_host_blocks());
  return result;
}

}  // namespace tessera::test
