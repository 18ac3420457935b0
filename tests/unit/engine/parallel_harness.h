#pragma once
// What the tensor- and pipeline-parallel engine tests share: the dummy qwen3-tiny in F32 (4
// layers, 4 heads, 2 KV heads, a 4096-token vocabulary), engine options at 16 tokens a step
// (longer prompts prefill in chunks), and a mix of concurrent greedy requests whose tokens
// are compared with the single-rank engine's.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine/executor_pp.h"
#include "engine/session.h"
#include "engine_run_harness.h"

namespace tessera::test::parallel {

constexpr const char* kModel = "dummy:qwen3-tiny:f32";
constexpr int kVocab = 4096;

// tp x pp ranks, 16 tokens a step, 4 sequences, blocks of 4.
inline ModelEngineOptions options(int tp, int n_blocks = 96, int pp = 1) {
  ModelEngineOptions o = small_engine_options(kModel, 16, 4, n_blocks);
  o.session.dummy_seed = 7;
  o.swap_space_bytes = 4ll << 20;
  o.tensor_parallel_size = tp;
  o.pipeline_parallel_size = pp;
  return o;
}

// What f throws (a tessera::Error's message), or "(accepted)".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

inline std::vector<int32_t> prompt(int n, uint32_t seed) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = static_cast<int32_t>((seed * 2654435761u + i * 40503u) % kVocab);
  return p;
}

// A Session over tp x pp ranks, as `tessera bench model -tp T -pp P` makes one: 8 tokens a
// forward, blocks of 4, a 16-token cache.
inline SessionOptions session_options(int tp, int pp, int threads) {
  SessionOptions so;
  so.model = kModel;
  so.dummy_seed = 7;
  so.backend.threads = threads;
  so.ctx = 64;
  so.kv_tokens = 16;
  so.max_batch_tokens = 8;
  so.block_size = 4;
  so.tensor_parallel_size = tp;
  so.pipeline_parallel_size = pp;
  return so;
}

// A 13-token prompt fed in two chunks, then one greedy step: the last row's logits, then the
// greedy token (as a float). The sequence's blocks are given back.
inline std::vector<float> prompt_logits_then_greedy(Session& s) {
  SequenceBlocks seq;
  std::vector<float> logits;
  s.feed(seq, prompt(13, 4), ForwardBatch::Logits::Last, logits);
  logits.push_back(static_cast<float>(s.decode_greedy(seq, 5)));
  seq.release_all(s.pool());
  return logits;
}

inline Request greedy(std::vector<int32_t> p, int max_tokens) {
  return greedy_tokens_request(std::move(p), max_tokens);
}

// Four prompts of 9 to 30 tokens (chunked at 16), 8 tokens each.
inline std::vector<Request> mixed_requests() {
  std::vector<Request> r;
  const int lengths[] = {13, 30, 9, 22};
  for (int i = 0; i < 4; ++i) r.push_back(greedy(prompt(lengths[i], 11 + i), 8));
  return r;
}

// The most micro-batches any step ran in, the mixed requests run on a pipelined engine.
inline int most_micro_batches(ModelEngine& pipelined) {
  int most = 0;
  EngineCore core(pipelined.config(), pipelined.executor());
  for (int i = 0; i < 4; ++i) core.add(i + 1, mixed_requests()[i]);
  while (core.has_work()) {
    core.step();
    most = std::max(most, dynamic_cast<PipelineParallelExecutor&>(pipelined.executor()).last_micro_batches());
  }
  return most;
}

inline void expect_same_tokens(const RunResult& got, const RunResult& want, const std::string& what) {
  ASSERT_EQ(got.out.size(), want.out.size()) << what;
  for (const auto& [id, o] : want.out) {
    ASSERT_EQ(got.out.at(id).tokens.size(), o.tokens.size()) << what << " request " << id;
    for (size_t c = 0; c < o.tokens.size(); ++c) {
      EXPECT_FALSE(o.tokens[c].empty()) << what;
      EXPECT_EQ(got.out.at(id).tokens[c], o.tokens[c]) << what << " request " << id << " choice " << c;
    }
  }
}

// Two requests sharing a 20-token prefix: the second hits the first's full blocks.
inline std::vector<Request> shared_prefix_requests() {
  const std::vector<int32_t> shared = prompt(20, 99);
  std::vector<Request> reqs;
  for (uint32_t s : {1u, 2u}) {
    std::vector<int32_t> p = shared;
    for (int32_t t : prompt(5, s)) p.push_back(t);
    reqs.push_back(greedy(p, 6));
  }
  return reqs;
}

// An n = 2 fork of 13 prompt tokens (a partial last block: the second choice writes into a
// copy of it) whose seeded choices diverge, so each reads its own copy.
inline Request diverging_fork() {
  Request r = greedy(prompt(13, 5), 6);
  r.n = 2;
  r.sampling.temperature = 1.0f;
  r.sampling.seed = 42;
  return r;
}

// Swap preemption into the engine's host slots.
inline std::function<void(EngineConfig&)> swap_preemption(ModelEngine& e) {
  return [&e](EngineConfig& c) {
    c.scheduler.preemption_mode = PreemptionMode::Swap;
    c.n_host_blocks = e.executor().n_host_blocks();
  };
}

// The serving path: the threaded Engine over `parallel`'s executor, four clients submitting
// the mixed requests at once, must give the tokens of `one` run through EngineCore.
inline void expect_threaded_engine_gives_the_tokens_of(ModelEngine& one, ModelEngine& parallel) {
  const std::vector<Request> reqs = mixed_requests();
  const RunResult want = run_engine(one, reqs, false, 0, false);
  std::vector<RequestOutput> got(reqs.size());
  {
    Engine engine(parallel.config(), parallel.executor());
    std::vector<std::thread> clients;
    for (size_t i = 0; i < reqs.size(); ++i)
      clients.emplace_back([&, i] {
        SubmitResult r = engine.submit(reqs[i]);
        ASSERT_TRUE(r.stream) << "request " << i << " refused";
        got[i] = r.stream->collect();
      });
    for (std::thread& t : clients) t.join();
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(got[i].error, "");
    ASSERT_EQ(got[i].tokens.size(), 1u);
    EXPECT_EQ(got[i].tokens[0], want.out.at(i + 1).tokens[0]) << "request " << i;
  }
}

// A suite's two engines, one rank and `ranks`, made once for the suite.
class TwoEngines : public ::testing::Test {
 protected:
  static void make(const ModelEngineOptions& one, const ModelEngineOptions& two) {
    one_ = new ModelEngine(one);
    two_ = new ModelEngine(two);
  }
  static void TearDownTestSuite() {
    delete one_;
    delete two_;
    one_ = two_ = nullptr;
  }
  inline static ModelEngine* one_ = nullptr;
  inline static ModelEngine* two_ = nullptr;
};

}  // namespace tessera::test::parallel
