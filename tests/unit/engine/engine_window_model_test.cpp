// Sliding-window KV pool end to end on Gemma 3's block (dummy gemma3-tiny: five local layers
// with a 16-token window per global one, blocks of 4 tokens): the acceptance test at
// 1/32 scale (a 512-token sequence is 32 windows, as 16k tokens are for Gemma 3's 512): the
// local layers hold only the window's blocks while outputs and log-probabilities equal the
// unfreed reference (every layer keeping the whole sequence), with a prefix hit, a fork, and
// swap preemption in the same run. And the capacity the windows buy in a fixed budget.
#include <gtest/gtest.h>

#include <random>

#include "backend/cuda/cuda_factory.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine/engine_summary.h"
#include "engine/model_drafter.h"
#include "unit/engine/engine_run_harness.h"

using namespace tessera;

namespace {

ModelEngineOptions gemma_tiny(int64_t kv_bytes, bool windows, const std::string& device = "cpu") {
  ModelEngineOptions o = test::small_engine_options("dummy:gemma3-tiny:f32", 64, 4, 0, kv_bytes);
  o.session.backend.device = device;
  o.scheduler.max_model_len = 1024;
  o.hybrid_kv_cache = windows;
  return o;
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int n) {
  std::vector<int32_t> t(n);
  for (auto& x : t) x = static_cast<int32_t>(2 + rng() % 4000);
  return t;
}

// tol 0: the same KV read in the same order (CPU). CUDA's decode kernel starts its key splits
// at the window instead of masking what lies before it, so the sums are ordered differently.
void expect_same(const Logprobs& got, const Logprobs& want, const std::string& where, float tol = 0) {
  EXPECT_EQ(got.chosen.token, want.chosen.token) << where;
  if (tol == 0)
    EXPECT_EQ(got.chosen.logprob, want.chosen.logprob) << where;
  else
    EXPECT_NEAR(got.chosen.logprob, want.chosen.logprob, tol) << where;
  ASSERT_EQ(got.top.size(), want.top.size()) << where;
}

Request request(std::vector<int32_t> prompt, int max_tokens) {
  Request r = test::greedy_tokens_request(std::move(prompt), max_tokens);
  r.logprobs = true;
  return r;
}

}  // namespace

// gemma3-tiny's KV: 4 KiB a layer a block (one KV head x 4 tokens x 256 x K,V x f16); the
// global layer 4 KiB a block, the five local ones 20 KiB. 3 MiB hold 128 blocks of every
// layer (512 tokens: a 1024-token context does not fit), or 40 local blocks (4 sequences'
// windows and a 64-token step) and 568 global ones (2272 tokens).
TEST(EngineWindowModel, WindowsBuyCapacityAndTheSummarySaysSo) {
  EXPECT_THROW(ModelEngine(gemma_tiny(3 << 20, false)), Error);
  ModelEngine m(gemma_tiny(3 << 20, true));
  EXPECT_EQ(m.config().window, 16);
  EXPECT_EQ(m.config().n_local_blocks, 40);
  EXPECT_EQ(m.config().n_blocks, 568);
  EXPECT_EQ(m.kv().spec().n_group_layers(true), 5);
  const std::string text = format_engine_summary(describe_engine(m, "dummy:gemma3-tiny:f32"));
  EXPECT_NE(text.find("568 blocks of 4 tokens = 2272 tokens (3.00 MiB)"), std::string::npos) << text;
  EXPECT_NE(text.find("KV windows  5 of 6 layers keep a 16-token window in a pool of 40 blocks; without it the same "
                      "memory holds 512 tokens (the windows hold 4.44x as many)"),
            std::string::npos)
      << text;
}

static void local_layers_hold_only_the_window(const std::string& device, float tol) {
  std::mt19937 rng(3);
  const auto prompt = random_prompt(rng, 64);
  std::vector<Request> reqs;
  reqs.push_back(request(prompt, 448));  // 512 tokens: 32 windows
  auto shared = std::vector<int32_t>(prompt.begin(), prompt.begin() + 48);
  const auto tail = random_prompt(rng, 8);
  shared.insert(shared.end(), tail.begin(), tail.end());
  reqs.push_back(request(shared, 100));  // a prefix hit on the first's blocks
  Request sampled = request(random_prompt(rng, 30), 200);
  sampled.n = 2;  // a fork: copy-on-write of the shared partial block in both pools
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 5;
  reqs.push_back(sampled);

  // Local blocks in use after the first step (the prompt's prefill) in the windowed run.
  const auto run = [&](bool windows, const std::vector<Request>& reqs, int& most_local, EngineStats& stats) {
    ModelEngineOptions o = gemma_tiny(6 << 20, windows, device);
    o.swap_space_bytes = 8 << 20;
    o.scheduler.preemption_mode = PreemptionMode::Swap;
    ModelEngine m(o);
    EngineConfig c = m.config();
    c.check_invariants = true;
    c.n_blocks = 128;  // the 512-token sequence takes them all: the others get preempted
    EngineCore core(c, m.executor());
    std::map<RequestId, std::vector<std::vector<Logprobs>>> out;
    for (size_t i = 0; i < reqs.size(); ++i) {
      core.add(i + 1, reqs[i]);
      out[i + 1].resize(reqs[i].n);
    }
    most_local = 0;
    for (int step = 0; core.has_work(); ++step) {
      const StepResult s = core.step();
      EXPECT_EQ(s.error, "");
      for (const SeqEvent& e : s.events)
        if (e.logprobs) out[e.request][e.choice].push_back(*e.logprobs);
      if (step > 0) most_local = std::max(most_local, core.kv().n_local_blocks() - core.kv().n_local_free());
    }
    EXPECT_TRUE(core.is_idle());
    stats = core.stats();
    return out;
  };
  int most = 0, unused = 0;
  EngineStats st_windowed, st_full;
  const auto windowed = run(true, reqs, unused, st_windowed);
  const auto full = run(false, reqs, unused, st_full);
  for (const auto& [id, choices] : full) {
    ASSERT_EQ(windowed.at(id).size(), choices.size());
    for (size_t c = 0; c < choices.size(); ++c) {
      ASSERT_EQ(choices[c].size(), static_cast<size_t>(reqs[id - 1].sampling.max_tokens)) << id;
      ASSERT_EQ(windowed.at(id)[c].size(), choices[c].size()) << id;
      for (size_t t = 0; t < choices[c].size(); ++t)
        expect_same(windowed.at(id)[c][t], choices[c][t],
                    device + " request " + std::to_string(id) + " token " + std::to_string(t), tol);
    }
  }
  EXPECT_GT(st_windowed.prefix.hit_tokens, 0);
  EXPECT_GT(st_windowed.forks, 0);
  EXPECT_GT(st_windowed.swaps_out, 0) << st_windowed.preemptions << " preemptions, " << st_windowed.swap_fallbacks
                                      << " fallbacks";
  // The 512-token sequence alone: after its prefill its local layers hold one window (16
  // tokens: 4 blocks, 5 where it straddles a block edge) while its global layer grows to 128.
  const auto alone = run(true, {reqs[0]}, most, st_windowed);
  EXPECT_LE(most, 5);
  EXPECT_GE(most, 4);
  for (size_t t = 0; t < full.at(1)[0].size(); ++t)
    expect_same(alone.at(1)[0][t], full.at(1)[0][t], device + " alone", tol);
}

TEST(EngineWindowModel, LocalLayersHoldOnlyTheWindowAndOutputsEqualTheUnfreedReference) {
  local_layers_hold_only_the_window("cpu", 0);
}

// The same run on CUDA: its prefill kernels load zeros for the entries dropped behind the
// window, its decode kernel starts at the window, KV copies, forks and swaps go through the
// device's block ops.
TEST(EngineWindowModel, LocalLayersOnCudaMatchTheUnfreedReference) {
  if (!cuda_compiled() || cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  local_layers_hold_only_the_window("cuda", 2e-3f);
}

// Early exit over the windowed cache (3 draft layers: all local): the draft reads the target's
// local table, whose blocks behind the window are dropped, and writes its positions into
// scratch blocks lent from both pools. Greedy tokens equal the plain run's, the drafts and
// steps equal those of early exit with a cache of its own (which recomputes the window), and
// no block of either pool is left lent.
TEST(EngineWindowModel, EarlyExitOverTheWindowedCacheDraftsWhatItsOwnCacheWould) {
  ModelEngineOptions o = gemma_tiny(6 << 20, true);
  o.speculative.method = SpecMethod::EarlyExit;
  o.speculative.draft_layers = 3;
  o.speculative.num_speculative_tokens = 4;
  o.speculative.adaptive = false;
  ModelEngine m(o);
  std::mt19937 rng(11);
  std::vector<Request> reqs = {request(random_prompt(rng, 40), 48), request(random_prompt(rng, 21), 30)};
  reqs[1].n = 2;
  const std::shared_ptr<ModelDrafter> own = make_model_drafter(
      o.speculative, m.session(), {.block_size = 4, .n_blocks = 600, .max_batch_tokens = 64, .max_seqs = 8});
  const auto run = [&](int mode) {  // 0 plain, 1 over the target's cache, 2 own cache
    return test::run_engine(m, reqs, false, 0, true, [&](EngineConfig& c) {
      if (mode == 0) c.speculative = {};
      if (mode == 2) c.drafter = own;
    });
  };
  const test::RunResult plain = run(0), shared = run(1), separate = run(2);
  for (const auto& [id, o] : plain.out)
    for (size_t c = 0; c < o.tokens.size(); ++c) {
      EXPECT_EQ(shared.out.at(id).tokens[c], o.tokens[c]) << "request " << id << " choice " << c;
      EXPECT_EQ(separate.out.at(id).tokens[c], o.tokens[c]) << "request " << id << " choice " << c;
    }
  EXPECT_GT(shared.stats.spec.draft_tokens, 0);
  EXPECT_EQ(shared.stats.spec.draft_tokens, separate.stats.spec.draft_tokens);
  EXPECT_EQ(shared.stats.spec.accepted_tokens, separate.stats.spec.accepted_tokens);
  EXPECT_EQ(shared.stats.steps, separate.stats.steps);
}
