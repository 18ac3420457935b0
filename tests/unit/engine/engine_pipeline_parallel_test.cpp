// The engine at --pipeline-parallel-size N on the CPU (stages as threads, docs/design/parallel.md,
// "Pipeline parallelism"): the layer split and its refusals; each stage's weights and KV
// constants; the in-process group's point-to-point messages; and, through the serving path,
// the greedy tokens of the single-rank engine with concurrent chunked requests run in
// micro-batches, a prefix-cache hit, an n = 2 fork (copy-on-write on every stage), swap
// preemption (every stage its layers of the host slots), quantized KV whose per-layer
// constants are each stage's layers', n-gram speculation, and a mixture-of-experts model
// (which tensor parallelism refuses). Every KV block is free at the end (run_engine checks).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/kv_codec.h"
#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine/engine_summary.h"
#include "engine/executor_pp.h"
#include "engine/parallel_ranks.h"
#include "engine/session.h"
#include "engine_run_harness.h"
#include "kv/kv_host_ops.h"
#include "model/dummy.h"
#include "model/pp/stage.h"
#include "parallel/local_comm.h"
#include "parallel_harness.h"

using namespace tessera;
using tessera::test::RunResult;
using namespace tessera::test::parallel;

namespace {

ModelEngineOptions pp_options(int pp, int n_blocks = 96) { return options(1, n_blocks, pp); }

class EnginePipelineParallel : public TwoEngines {
 protected:
  static void SetUpTestSuite() { make(pp_options(1), pp_options(2)); }
};

}  // namespace

TEST(PipelinePlan, LayersSplitEvenlyWithTheExtraOnesFirst) {
  ModelConfig c = dummy_preset("smollm2-135m");  // 30 layers
  EXPECT_EQ(plan_pipeline(c, 4).first_layer, (std::vector<int>{0, 8, 16, 23, 30}));
  EXPECT_EQ(plan_pipeline(c, 4).describe(), "layers 0-7 | 8-15 | 16-22 | 23-29");
  EXPECT_EQ(plan_pipeline(c, 1).first_layer, (std::vector<int>{0, 30}));
  EXPECT_EQ(plan_pipeline(c, 30).n_layers(29), 1);
  EXPECT_NE(error_of([&] { plan_pipeline(c, 31); }).find("31 is more stages than the model's 30 layers"),
            std::string::npos);
  EXPECT_NE(error_of([&] { plan_pipeline(dummy_preset("gemma3-tiny"), 2); }).find("does not split gemma3"),
            std::string::npos);
}

TEST(PipelinePlan, StageWeightsAreViewsOfTheirLayers) {
  const auto whole = make_dummy_weights("qwen3-tiny:f32", 3);
  const PipelinePlan plan = plan_pipeline(whole->config, 3);  // layers 0-1 | 2 | 3
  const auto s0 = stage_weights(whole, plan, 0), s1 = stage_weights(whole, plan, 1), s2 = stage_weights(whole, plan, 2);
  EXPECT_EQ(s0->config.n_layer, 2);
  EXPECT_EQ(s1->config.n_layer, 1);
  EXPECT_EQ(s1->stage.first_layer, 2);
  EXPECT_EQ(s2->layers[0].wq.data, whole->layers[3].wq.data);  // a view, no copy
  EXPECT_EQ(s0->tok_embd.data, whole->tok_embd.data);
  EXPECT_EQ(s0->output.data, nullptr);  // the head is the last stage's
  EXPECT_EQ(s1->tok_embd.data, nullptr);
  EXPECT_EQ(s2->output.data, whole->output.data);
  EXPECT_TRUE(s0->stage.first() && !s0->stage.last() && s2->stage.last());
}

TEST(PipelinePlan, AStagesCacheHoldsItsLayersConstants) {
  KvCacheSpec whole = KvCacheSpec::plain(4, 2, 8, 4, 4, DType::F16);
  for (int il = 0; il < 4; ++il) {
    whole.k_mean.push_back(std::vector<float>(16, static_cast<float>(il)));
    whole.local_layers.push_back(il % 2);
  }
  const KvCacheSpec s = whole.layers(2, 2);
  EXPECT_EQ(s.n_layers, 2);
  EXPECT_EQ(s.layer_first, 2);
  EXPECT_EQ(s.k_mean[0][0], 2.0f);
  EXPECT_EQ(s.local_layers, (std::vector<uint8_t>{0, 1}));
  EXPECT_EQ(s.layers(1, 1).layer_first, 3);
  EXPECT_THROW(whole.layers(3, 2), Error);
  // A turbo layer's draws are the model layer's: stage 1's layer 0 is layer 2.
  const KvFormat f = parse_kv_format("turbo4", true);
  EXPECT_EQ(make_kv_constants(f, 2, 64, 2, true, 5, {}), make_kv_constants(f, 2, 64, 2, true, 5, {}));
  EXPECT_NE(make_kv_constants(f, 2, 64, 0, true, 5, {}), make_kv_constants(f, 2, 64, 2, true, 5, {}));
}

TEST(LocalGroupMessages, ArriveInOrderSizedAndAbortWakesAReceiver) {
  LocalGroup g(3);
  const std::vector<float> a = {1, 2, 3}, b = {4, 5};
  g.rank(0).send(a.data(), 3, 2);
  g.rank(0).send(b.data(), 2, 2);
  g.rank(1).send(b.data(), 2, 2);
  std::vector<float> got(3);
  g.rank(2).recv(got.data(), 2, 1);  // from rank 1: its own order, apart from rank 0's
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 2), b);
  g.rank(2).recv(got.data(), 3, 0);
  EXPECT_EQ(got, a);
  EXPECT_NE(error_of([&] { g.rank(2).recv(got.data(), 3, 0); }).find("expected 3 elements from rank 0, which sent 2"),
            std::string::npos);
  EXPECT_THROW(g.rank(1).send(a.data(), 3, 1), Error);  // to itself
  g.rank(0).send(a.data(), 3, 2);                       // never received: dropped by the reset below
  std::string woke;
  std::thread waiter([&] { woke = error_of([&] { g.rank(1).recv(got.data(), 3, 0); }); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  g.abort("stage 0 failed");
  waiter.join();
  EXPECT_NE(woke.find("stage 0 failed"), std::string::npos) << woke;
  EXPECT_THROW(g.rank(0).send(a.data(), 3, 1), Error);  // an aborted group takes nothing
  g.reset();
  g.rank(0).send(b.data(), 2, 2);
  g.rank(2).recv(got.data(), 2, 0);  // the message after the reset, not the one before
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + 2), b);
}

TEST(ParallelRanks, AStageThatFailsReleasesTheOthersAndThePipelineRecovers) {
  BackendOptions cpu;
  cpu.threads = 2;
  ParallelRanks ranks(make_dummy_weights("qwen3-tiny:f32", 3), cpu, {.pipeline = 2}, 16, 1);
  const KvCacheSpec whole = KvCacheSpec::plain(4, 2, 128, 4, 4, DType::F32);
  ranks.run([&](ParallelRanks::Rank& r) {
    r.kv = std::make_unique<KvCache>(*r.backend, ranks.rank_kv_spec(whole, r.index));
    r.runner = std::make_unique<ModelRunner>(*r.model, *r.kv, *r.backend);
  });
  EXPECT_EQ(ranks.rank(1).kv->spec().n_layers, 2);
  EXPECT_EQ(ranks.rank(1).kv->spec().layer_first, 2);
  SequenceBlocks seq;
  seq.blocks = {0, 1};
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  ForwardBatch batch;
  batch.add_sequence(seq, 4, tokens.data(), 5, ForwardBatch::Logits::Last);
  ForwardBatch first = batch;
  first.logits_rows.clear();  // stage 0 computes no logits
  std::vector<float> logits(kVocab);
  // Stage 0 fails before its forward; stage 1 waits for its residual stream.
  try {
    ranks.run([&](ParallelRanks::Rank& r) {
      if (r.index == 0) fail("injected failure");
      r.runner->forward(batch, logits.data());
    });
    ADD_FAILURE() << "a failed stage went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline stage 0: injected failure"), std::string::npos) << e.what();
  }
  // Stage 1 asked for logits it does not compute is refused by name, and the next step runs.
  EXPECT_NE(error_of([&] {
              ranks.run([&](ParallelRanks::Rank& r) { r.runner->forward(batch, logits.data()); });
            }).find("pipeline stage 0 of 2 asked for logits"),
            std::string::npos);
  ranks.run([&](ParallelRanks::Rank& r) { r.runner->forward(r.index == 0 ? first : batch, logits.data()); });
  EXPECT_TRUE(std::isfinite(logits[0]));
}

TEST_F(EnginePipelineParallel, ConcurrentChunkedRequestsInMicroBatchesGiveTheTokensOfOneRank) {
  const RunResult want = test::run_engine(*one_, mixed_requests(), false, 0, false);
  const RunResult got = test::run_engine(*two_, mixed_requests(), false, 0, false);
  expect_same_tokens(got, want, "pp 2");
  EXPECT_EQ(got.stats.steps, want.stats.steps);  // the one scheduler made the same steps
  // A decode step of the four sequences runs as two micro-batches.
  EXPECT_EQ(most_micro_batches(*two_), 2);
  // Four stages of one layer each.
  ModelEngine pp4(pp_options(4));
  EXPECT_EQ(pp4.pipeline_parallel_size(), 4);
  EXPECT_EQ(pp4.kv().spec().n_layers, 1);
  expect_same_tokens(test::run_engine(pp4, mixed_requests(), false, 0, false), want, "pp 4");
}

TEST_F(EnginePipelineParallel, TheThreadedEngineServesClientsOnManyThreads) {
  // The serving path: Engine's own thread steps the stages; four clients submit at once.
  expect_threaded_engine_gives_the_tokens_of(*one_, *two_);
}

TEST_F(EnginePipelineParallel, LogprobsEqualTheSingleRanksExactly) {
  // Each layer runs the same kernels on the same rows; only the thread count and the batch a
  // row shares differ, which the CPU kernels do not sum differently.
  std::vector<Request> reqs = mixed_requests();
  for (Request& r : reqs) {
    r.logprobs = true;
    r.sampling.n_logprobs = 3;
  }
  const RunResult want = test::run_engine(*one_, reqs, false, 0, false);
  const RunResult got = test::run_engine(*two_, reqs, false, 0, false);
  for (const auto& [id, choices] : want.logprobs)
    for (size_t t = 0; t < choices[0].size(); ++t)
      EXPECT_EQ(got.logprobs.at(id)[0][t].chosen.logprob, choices[0][t].chosen.logprob) << id << " token " << t;
}

TEST_F(EnginePipelineParallel, PrefixHitForkAndSwapMoveEveryStagesLayers) {
  const std::vector<Request> reqs = shared_prefix_requests();
  const RunResult hit = test::run_engine(*two_, reqs, true, 0, true);
  EXPECT_GE(hit.stats.prefix.hit_tokens, 20);
  expect_same_tokens(hit, test::run_engine(*one_, reqs, true, 0, false), "prefix hit");

  const Request fork = diverging_fork();
  ModelEngine fresh(pp_options(2));  // a stage that skipped the copy would read unwritten memory
  const RunResult want_fork = test::run_engine(*one_, {fork}, true);
  const RunResult got_fork = test::run_engine(fresh, {fork}, true);
  EXPECT_EQ(got_fork.stats.block_copies, 1);
  EXPECT_NE(want_fork.out.at(1).tokens[0], want_fork.out.at(1).tokens[1]);
  expect_same_tokens(got_fork, want_fork, "fork");

  const RunResult swapped = test::run_engine(*two_, mixed_requests(), false, 14, true, swap_preemption(*two_));
  EXPECT_GT(swapped.stats.swaps_out, 0);
  EXPECT_EQ(swapped.stats.swap_fallbacks, 0);
  // A block moved is both stages' layers: the whole block's bytes.
  EXPECT_EQ(two_->config().kv_block_bytes, kv_block_bytes(one_->kv().spec()));
  expect_same_tokens(swapped, test::run_engine(*one_, mixed_requests(), true, 0, false), "swap");
}

TEST_F(EnginePipelineParallel, EachStageStoresItsLayersSoTheBudgetHoldsMoreBlocks) {
  ModelEngineOptions o1 = pp_options(1, 0), o2 = pp_options(2, 0);
  o1.kv_cache_bytes = o2.kv_cache_bytes = 1 << 20;
  ModelEngine a(o1), b(o2);
  EXPECT_EQ(b.kv().spec().n_layers, 2);
  EXPECT_EQ(b.config().n_blocks, 2 * a.config().n_blocks);
  const EngineSummary s = describe_engine(b, kModel);
  EXPECT_EQ(s.pipeline_parallel_size, 2);
  EXPECT_EQ(s.kv_bytes, kv_block_bytes(a.kv().spec()) * b.config().n_blocks);
  const std::string text = format_engine_summary(s);
  EXPECT_NE(text.find("2 pipeline stages (layers 0-1 | 2-3)"), std::string::npos) << text;
  EXPECT_NE(s.device.find("2 pipeline stages (layers 0-1 | 2-3; in-process group), each cpu (1 threads"),
            std::string::npos)
      << s.device;
}

TEST(EnginePipelineParallelModels, QuantizedKvWindowsExpertsAndNgramSpeculation) {
  const auto same = [](ModelEngineOptions o, const std::string& what) {
    ModelEngine one(o);
    o.pipeline_parallel_size = 2;
    ModelEngine two(o);
    const RunResult want = test::run_engine(one, mixed_requests(), false, 0, false);
    const RunResult got = test::run_engine(two, mixed_requests(), false, 0, false);
    expect_same_tokens(got, want, what);
    return got;
  };
  // TurboQuant keys: stage 1's layers draw their rotations as layers 2 and 3.
  ModelEngineOptions turbo = pp_options(1);
  turbo.session.k_format = parse_kv_format("turbo4", true);
  same(turbo, "turbo4");
  // Sliding windows on every layer (the local pool), and a mixture of experts.
  ModelEngineOptions windows = pp_options(1);
  windows.session.model = "dummy:phi3-tiny:f32";
  same(windows, "windows");
  ModelEngineOptions moe = pp_options(1);
  moe.session.model = "dummy:qwen3moe-tiny:f32";
  same(moe, "mixture of experts");
  // n-gram drafts are verified by the last stage (chains: trees are not offered).
  ModelEngineOptions spec = pp_options(1);
  spec.speculative.method = SpecMethod::Ngram;
  spec.speculative.num_speculative_tokens = 3;
  spec.speculative.prompt_lookup_min = 1;
  spec.speculative.prompt_lookup_max = 2;
  spec.speculative.adaptive = false;
  const RunResult s = same(spec, "ngram");
  EXPECT_GT(s.stats.spec.draft_tokens, 0);
}

TEST(EnginePipelineParallelModels, WhatPipelineParallelismCannotDoIsRefusedByName) {
  const auto expect_error = [](ModelEngineOptions o, const std::string& needle) {
    EXPECT_NE(error_of([&] { ModelEngine e(o); }).find(needle), std::string::npos) << needle;
  };
  expect_error(pp_options(5),
               "--pipeline-parallel-size 5 with dummy:qwen3-tiny:f32: pipeline parallel size 5 is "
               "more stages than the model's 4 layers");
  ModelEngineOptions gemma = pp_options(2);
  gemma.session.model = "dummy:gemma3-tiny:f32";
  expect_error(gemma, "does not split gemma3");
  ModelEngineOptions draft = pp_options(2);
  draft.speculative.method = SpecMethod::EarlyExit;
  draft.speculative.num_speculative_tokens = 2;
  draft.speculative.draft_layers = 1;
  expect_error(draft, "not supported with pipeline parallelism (--pipeline-parallel-size 2)");
  ModelEngine pp2(pp_options(2));
  EXPECT_FALSE(pp2.executor().supports_draft_trees());
  EngineCore core(pp2.config(), pp2.executor());
  Request r = greedy(prompt(9, 3), 2);
  r.kv_lease_seconds = 10;
  const auto rejection = core.validate(r);
  ASSERT_TRUE(rejection.has_value());
  EXPECT_NE(rejection->message.find("KV transfer between engines is not supported with pipeline parallelism"),
            std::string::npos)
      << rejection->message;
  EXPECT_THROW(pp2.executor().make_staging(1), Error);
}

TEST(PipelineParallelSession, FeedRunsEveryStageAndReturnsTheLastOnesLogits) {
  // What `tessera bench model --pipeline-parallel-size N` runs on: a Session whose feed() runs
  // the stages (the ones before the last compute no logits). Its logits are one rank's, to the
  // bit (the same kernels on the same rows); its KV cache stage 0's layers.
  const auto feed = [](int pp) {
    Session s(session_options(1, pp, 2));
    EXPECT_EQ(s.kv().spec().n_layers, pp == 1 ? 4 : 2);
    if (pp > 1) {
      EXPECT_NE(error_of([&] { s.runner(); }).find("runs on 2 parallel ranks (--pipeline-parallel-size 2)"),
                std::string::npos);
    }
    return prompt_logits_then_greedy(s);
  };
  EXPECT_EQ(feed(2), feed(1));
}
