// The serving engine over the real model (SmolLM2-135M) with quantized KV caches: batching,
// prefix-cache hits, recompute and swap preemption and forks (copy-on-write of partial
// blocks) give the same greedy tokens as each request run alone in the same format, because
// a block carries its own scales and its bytes move unchanged. Formats whose codes depend
// only on the token (fp8, int8, int4:gN, turbo) are batch-invariant. KIVI keys (int4 per
// channel) re-code a page as it fills, so their bytes depend on how a prompt was chunked:
// not batch-invariant, not checked here (their block copies are, in kv_quant_test.cpp).
// Skipped without the model.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>

#include "engine_run_harness.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;
using tessera::test::run_engine;
using tessera::test::RunResult;
using tessera::test::small_engine_options;

namespace {

// "+rope": turbo keys centered by position (store k − R(p)·m) with a synthetic pre-RoPE mean
// m: the store and attention must agree on each key's position through prefix hits,
// preemption, swap and forks.
std::unique_ptr<ModelEngine> engine_for(const std::string& name, const SpeculativeConfig& speculative = {}) {
  ModelEngineOptions o =
      small_engine_options(test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"), 32, 8, 128, 16ll << 20);
  const bool rope = name.ends_with("+rope");
  const std::string format = rope ? name.substr(0, name.size() - 5) : name;
  o.session.k_format = parse_kv_format(format, true);
  o.session.v_format = parse_kv_format(format, false);
  if (rope) {
    const int layers = 30, kvd = 3 * 64;  // SmolLM2-135M
    for (int l = 0; l < layers; ++l) {
      std::vector<float> m(kvd);
      for (int i = 0; i < kvd; ++i) m[i] = 0.5f * std::sin(0.7f * i + l);
      o.session.k_mean.push_back(m);
      std::vector<float> f(32);
      for (int i = 0; i < 32; ++i) f[i] = static_cast<float>(std::pow(100000.0, -2.0 * i / 64));
      o.session.k_rope_freq.push_back(f);
    }
    o.session.k_rope_dim = 64;
  }
  o.swap_space_bytes = 4ll << 20;
  o.speculative = speculative;
  return std::make_unique<ModelEngine>(o);
}

std::vector<Request> prompts(ModelEngine& m) {
  std::vector<Request> out;
  const std::string system = "You are a careful assistant. Answer briefly. ";
  for (const char* p : {"The three primary colors are", "def fibonacci(n):", "In 1969, the first humans landed on"}) {
    Request r;
    r.prompt = m.session().tokenizer().encode(system + p, true, false);  // shared prefix: cache hits
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 6;
    r.sampling.ignore_eos = true;
    out.push_back(r);
  }
  return out;
}

void expect_same(const RunResult& got, const RunResult& want, const std::string& what) {
  for (const auto& [id, o] : want.out) EXPECT_EQ(got.out.at(id).tokens[0], o.tokens[0]) << what << ", request " << id;
}

}  // namespace

TEST(EngineQuantKv, TokenWiseFormatsAreBatchPrefixPreemptionAndForkInvariant) {
  if (!std::filesystem::exists(test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"))) GTEST_SKIP() << "no model";
  for (const char* format : {"turbo3", "turbo3+rope", "fp8_e4m3:token"}) {
    SCOPED_TRACE(format);
    auto m = engine_for(format);
    const std::vector<Request> reqs = prompts(*m);
    const RunResult alone = run_engine(*m, reqs, true, 0, false);
    expect_same(run_engine(*m, reqs, false, 0, false), alone, "batched");
    const RunResult cached = run_engine(*m, reqs, true, 0, true);  // later requests hit the system prompt's blocks
    EXPECT_GT(cached.stats.prefix.hit_tokens, 0);
    expect_same(cached, alone, "prefix cache hits");
    const RunResult tight = run_engine(*m, reqs, false, 13, true);  // 3 x ~19 tokens in 13 blocks of 4
    EXPECT_GT(tight.stats.preemptions, 0);
    expect_same(tight, alone, "recompute preemption");
    const RunResult swapped = run_engine(*m, reqs, false, 13, true, [&](EngineConfig& c) {
      c.scheduler.preemption_mode = PreemptionMode::Swap;
      c.n_host_blocks = m->executor().n_host_blocks();
    });
    EXPECT_GT(swapped.stats.swaps_out, 0);
    expect_same(swapped, alone, "swap preemption");
    Request forked = reqs[0];
    forked.n = 3;
    const RunResult f = run_engine(*m, {forked}, true, 0, false);
    EXPECT_GT(f.stats.block_copies + (forked.prompt.size() % 4 == 0 ? 1 : 0), 0);
    for (int c = 0; c < 3; ++c) EXPECT_EQ(f.out.at(1).tokens[c], alone.out.at(1).tokens[0]) << "choice " << c;
  }
}

// Early exit over a quantized target cache: the draft reads the target's codes and scales for
// its first layers and writes its own positions into lent scratch blocks (a copy of the
// partly filled block, its scales with it), never into the target's. Greedy outputs equal
// the plain run's in the same format, with prefix hits and a pool tight enough to preempt.
TEST(EngineQuantKv, EarlyExitOverAQuantizedCacheGivesThePlainTokens) {
  if (!std::filesystem::exists(test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf"))) GTEST_SKIP() << "no model";
  SpeculativeConfig early_exit;
  early_exit.method = SpecMethod::EarlyExit;
  early_exit.draft_layers = 12;
  early_exit.num_speculative_tokens = 3;
  early_exit.adaptive = false;
  for (const char* format : {"turbo3", "int8"}) {
    SCOPED_TRACE(format);
    auto m = engine_for(format, early_exit);
    const std::vector<Request> reqs = prompts(*m);
    const RunResult plain = run_engine(*m, reqs, true, 0, false, [](EngineConfig& c) { c.speculative = {}; });
    const RunResult cached = run_engine(*m, reqs, true, 0, true);  // later requests hit the system prompt
    EXPECT_GT(cached.stats.spec.draft_tokens, 0);
    EXPECT_GT(cached.stats.prefix.hit_tokens, 0);
    expect_same(cached, plain, "early exit, prefix hits");
    expect_same(run_engine(*m, reqs, false, 0, false), plain, "early exit, batched");
    const RunResult tight = run_engine(*m, reqs, false, 13, true);
    EXPECT_GT(tight.stats.preemptions, 0);
    expect_same(tight, plain, "early exit, recompute preemption");
  }
}
