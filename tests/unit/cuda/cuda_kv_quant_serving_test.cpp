// Serving with a quantized KV cache on CUDA (graphs, prefix hits, forks, swap preemption)
// against the same run on the CPU backend: the dummy SmolLM2-135M shape (head_dim 64, GQA 3)
// with int8, int4 (KIVI keys) and turbo3.5:qjl caches. Every request must complete; the tokens
// are compared with the CPU's and the agreement printed, under a loose bound: greedy picks
// among the near-tied logits of random weights drift apart once one flips. Measured
// (2026-12-03, H200): int8 168/168, int4 166/168, turbo3.5:qjl (then named turbo3.5) 138/168 with the first token
// of 2 of the 7 choices different -- not explained yet (the unit tests find turbo's stored
// bytes equal and its prefill attention within 1e-4 of the CPU's).
#include <cstdio>
#include <map>

#include "cuda_test_util.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

ModelEngineOptions options(const std::string& device, const std::string& fmt) {
  ModelEngineOptions o;
  o.session.model = "dummy:smollm2-135m:f32";
  o.session.backend.device = device;
  o.session.backend.threads = 2;
  o.session.block_size = 8;
  o.session.k_format = parse_kv_format(fmt, true);
  o.session.v_format = parse_kv_format(fmt, false);
  o.scheduler.max_num_batched_tokens = 48;
  o.scheduler.max_num_seqs = 8;
  o.scheduler.max_model_len = 160;
  o.scheduler.preemption_mode = PreemptionMode::Swap;
  o.kv_cache_bytes = 32ll << 20;
  o.max_kv_blocks = 24;  // tight: preempts and swaps
  o.swap_space_bytes = 16ll << 20;
  return o;
}

std::map<RequestId, std::vector<std::vector<int32_t>>> run(ModelEngine& engine) {
  EngineConfig c = engine.config();
  c.check_invariants = true;
  EngineCore core(c, engine.executor());
  std::map<RequestId, std::vector<std::vector<int32_t>>> tokens;
  const int32_t n_vocab = engine.session().config().n_vocab;
  for (RequestId id = 1; id <= 6; ++id) {
    Request r;
    for (int i = 0; i < 11 + static_cast<int>(id) * 5; ++i)  // 1-3 share a 11-token prefix
      r.prompt.push_back(static_cast<int32_t>(((id <= 3 && i < 11 ? 1 : id) * 7919 + i * 104729) % n_vocab));
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 24;
    r.sampling.ignore_eos = true;
    if (id == 4) r.n = 2;  // a fork: copy-on-write of a partial block
    tokens[id].resize(r.n);
    core.add(id, r);
  }
  while (core.has_work()) {
    const StepResult s = core.step();
    EXPECT_EQ(s.error, "");
    for (const SeqEvent& e : s.events)
      if (e.token >= 0) tokens[e.request][e.choice].push_back(e.token);
  }
  return tokens;
}

}  // namespace

TEST(CudaKvQuantServing, QuantizedCacheServesLikeTheCpu) {
  TESSERA_REQUIRE_CUDA();
  for (const char* fmt : {"int8", "int4", "turbo3.5:qjl"}) {
    SCOPED_TRACE(fmt);
    ModelEngine cpu(options("cpu", fmt));
    ModelEngine gpu(options("cuda", fmt));
    ASSERT_EQ(cpu.config().n_blocks, gpu.config().n_blocks);
    const auto c = run(cpu), g = run(gpu);
    size_t same = 0, total = 0, first = 0, n_choices = 0;
    for (const auto& [id, choices] : c)
      for (size_t k = 0; k < choices.size(); ++k) {
        ASSERT_EQ(g.at(id)[k].size(), 24u) << "request " << id;
        first += g.at(id)[k][0] == choices[k][0];
        ++n_choices;
        for (size_t i = 0; i < choices[k].size(); ++i) same += g.at(id)[k][i] == choices[k][i];
        total += choices[k].size();
      }
    std::printf("  %s: %zu of %zu tokens as on the CPU, first tokens %zu of %zu\n", fmt, same, total, first, n_choices);
    EXPECT_GE(same, total / 2) << "a loose bound: the runs drift apart after a flipped pick";
  }
}
