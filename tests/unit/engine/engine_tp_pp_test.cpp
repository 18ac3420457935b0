// Tensor and pipeline parallelism together on the CPU (docs/design/parallel.md, "Tensor and
// pipeline parallelism together"): 2 pipeline stages of 2 tensor-parallel ranks each, every
// rank a thread with its shard of its stage's layers. Through the serving path: the greedy
// tokens of the single-rank engine with concurrent chunked requests in micro-batches, the
// threaded engine, a prefix hit, an n = 2 fork (a block copy on every rank) and swap
// preemption (every rank its heads of its layers); each rank's cache and weights; a failing
// rank named by stage and tensor rank, the group recovering; the session's logits; the
// summary, kv-plan and what stays refused. Every KV block is free at the end (run_engine).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "core/error.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine/engine_summary.h"
#include "engine/executor_pp.h"
#include "engine/parallel_ranks.h"
#include "engine/session.h"
#include "engine_run_harness.h"
#include "model/dummy.h"
#include "parallel_harness.h"

using namespace tessera;
using tessera::test::RunResult;
using namespace tessera::test::parallel;

namespace {

class EngineTpPp : public TwoEngines {
 protected:
  static void SetUpTestSuite() { make(options(1), options(2, 96, 2)); }
};

}  // namespace

TEST(ParallelLayout, RanksAreTensorRanksWithinStages) {
  const ParallelLayout l{.tensor = 2, .pipeline = 3};
  EXPECT_EQ(l.size(), 6);
  EXPECT_EQ(l.stage_of(3), 1);
  EXPECT_EQ(l.tensor_rank_of(3), 1);
  EXPECT_EQ(l.sampling_rank(), 4);  // tensor rank 0 of the last stage
  EXPECT_FALSE(l.computes_logits(3));
  EXPECT_TRUE(l.computes_logits(5));
  EXPECT_EQ(l.flag(), "--tensor-parallel-size 2 --pipeline-parallel-size 3");
  EXPECT_EQ(l.kind(), "tensor and pipeline");
  EXPECT_EQ(l.rank_name(3), "pipeline stage 1, tensor parallel rank 1");
  EXPECT_EQ((ParallelLayout{.pipeline = 3}).rank_name(2), "pipeline stage 2");
  EXPECT_EQ((ParallelLayout{.tensor = 2}).sampling_rank(), 0);
  EXPECT_EQ((ParallelLayout{.pipeline = 3}).sampling_rank(), 2);
}

TEST_F(EngineTpPp, ConcurrentChunkedRequestsGiveTheTokensOfOneRank) {
  EXPECT_EQ(two_->tensor_parallel_size(), 2);
  EXPECT_EQ(two_->pipeline_parallel_size(), 2);
  const RunResult want = test::run_engine(*one_, mixed_requests(), false, 0, false);
  const RunResult got = test::run_engine(*two_, mixed_requests(), false, 0, false);
  expect_same_tokens(got, want, "tp 2 x pp 2");
  EXPECT_EQ(got.stats.steps, want.stats.steps);
  // A decode step of the four sequences runs as two micro-batches (one per stage).
  EXPECT_EQ(most_micro_batches(*two_), 2);
}

TEST_F(EngineTpPp, TheThreadedEngineServesClientsOnManyThreads) {
  expect_threaded_engine_gives_the_tokens_of(*one_, *two_);
}

TEST_F(EngineTpPp, PrefixHitForkAndSwapMoveEveryRanksPart) {
  {
    const std::vector<Request> reqs = shared_prefix_requests();
    const RunResult want = test::run_engine(*one_, reqs, true, 0, false);
    const RunResult got = test::run_engine(*two_, reqs, true, 0, true);
    EXPECT_GE(got.stats.prefix.hit_tokens, 20);
    expect_same_tokens(got, want, "prefix hit");
  }
  {
    // A fresh engine: a rank that skipped the block copy would read memory no test wrote.
    ModelEngine fresh(options(2, 96, 2));
    const Request r = diverging_fork();
    const RunResult want = test::run_engine(*one_, {r}, true);
    const RunResult got = test::run_engine(fresh, {r}, true);
    EXPECT_EQ(got.stats.block_copies, 1);
    EXPECT_NE(want.out.at(1).tokens[0], want.out.at(1).tokens[1]);
    expect_same_tokens(got, want, "fork");
  }
  {
    const RunResult want = test::run_engine(*one_, mixed_requests(), true, 0, false);
    const RunResult got = test::run_engine(*two_, mixed_requests(), false, 14, true, swap_preemption(*two_));
    EXPECT_GT(got.stats.swaps_out, 0);
    EXPECT_EQ(got.stats.swaps_in, got.stats.swaps_out);
    // A block's bytes: 4 ranks, each its KV head (of 2) of its 2 layers (of 4).
    EXPECT_EQ(two_->config().kv_block_bytes, 4 * kv_block_bytes(two_->kv().spec()));
    expect_same_tokens(got, want, "swap");
  }
}

TEST_F(EngineTpPp, EachRankHoldsItsHeadsOfItsStagesLayers) {
  EXPECT_EQ(two_->kv().spec().n_layers, 2);
  EXPECT_EQ(two_->kv().spec().n_kv_heads, 1);
  // A budget under the cap holds 4x the blocks of one rank's (each rank a quarter of a block).
  ModelEngineOptions o1 = options(1, 0), o4 = options(2, 0, 2);
  o1.kv_cache_bytes = o4.kv_cache_bytes = 1 << 20;
  ModelEngine a(o1), b(o4);
  EXPECT_EQ(b.config().n_blocks, 4 * a.config().n_blocks);
  const EngineSummary s = describe_engine(b, kModel);
  const std::string text = format_engine_summary(s);
  EXPECT_NE(text.find("2 tensor-parallel ranks in each of 2 pipeline stages (layers 0-1 | 2-3)"), std::string::npos)
      << text;
  EXPECT_NE(s.device.find("2 pipeline stages (layers 0-1 | 2-3; in-process group) of 2 tensor-parallel ranks"),
            std::string::npos)
      << s.device;
}

TEST(ParallelRanksTpPp, ShardsOfStagesAndAFailingRankNamedByBoth) {
  BackendOptions cpu;
  cpu.threads = 4;
  const auto whole = make_dummy_weights("qwen3-tiny:f32", 3);
  ParallelRanks ranks(whole, cpu, {.tensor = 2, .pipeline = 2}, 16, 1);
  ASSERT_EQ(ranks.size(), 4);
  // Rank 3: tensor rank 1 of stage 1 (layers 2-3): its heads of layer 2, the head's slice.
  const ModelWeights& w3 = *ranks.rank(3).weights;
  EXPECT_EQ(w3.stage.index, 1);
  EXPECT_EQ(w3.shard.rank, 1);
  EXPECT_EQ(w3.config.n_layer, 2);
  EXPECT_EQ(w3.config.n_head, whole->config.n_head / 2);
  EXPECT_EQ(w3.tok_embd.data, nullptr);
  EXPECT_EQ(w3.output.rows, whole->config.n_vocab / 2);  // tied: a slice of the embedding rows
  EXPECT_EQ(ranks.rank(1).weights->output.data, nullptr);
  EXPECT_EQ(ranks.rank(1).weights->tok_embd.rows, whole->config.n_vocab / 2);
  const KvCacheSpec spec = ranks.rank_kv_spec(KvCacheSpec::plain(4, 2, 128, 4, 4, DType::F32), 3);
  EXPECT_EQ(spec.n_layers, 2);
  EXPECT_EQ(spec.layer_first, 2);
  EXPECT_EQ(spec.kv_head_first, 1);
  ranks.run([&](ParallelRanks::Rank& r) {
    r.kv = std::make_unique<KvCache>(*r.backend,
                                     ranks.rank_kv_spec(KvCacheSpec::plain(4, 2, 128, 4, 4, DType::F32), r.index));
    r.runner = std::make_unique<ModelRunner>(*r.model, *r.kv, *r.backend);
  });
  SequenceBlocks seq;
  seq.blocks = {0, 1};
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  ForwardBatch batch, no_logits;
  batch.add_sequence(seq, 4, tokens.data(), 5, ForwardBatch::Logits::Last);
  no_logits.add_sequence(seq, 4, tokens.data(), 5, ForwardBatch::Logits::None);
  std::vector<std::vector<float>> logits(4, std::vector<float>(kVocab));
  const auto step = [&](ParallelRanks::Rank& r) {
    r.runner->forward(ranks.layout().computes_logits(r.index) ? batch : no_logits, logits[r.index].data());
  };
  // Tensor rank 1 of stage 0 fails before its forward: its stage peer waits in the
  // embedding's all-reduce, the next stage in its receive; all are released.
  const std::string why = error_of([&] {
    ranks.run([&](ParallelRanks::Rank& r) {
      if (r.index == 1) fail("injected failure");
      step(r);
    });
  });
  EXPECT_NE(why.find("pipeline stage 0, tensor parallel rank 1: injected failure"), std::string::npos) << why;
  ranks.run(step);                  // the group recovers
  EXPECT_EQ(logits[2], logits[3]);  // the last stage's ranks see the same whole logits
  EXPECT_TRUE(std::isfinite(logits[2][0]));
}

TEST(TpPpSession, FeedReturnsOneRanksLogitsWithinRounding) {
  // What `tessera bench model -tp 2 -pp 2` runs on.
  const auto feed = [](int tp, int pp) {
    Session s(session_options(tp, pp, 4));
    return prompt_logits_then_greedy(s);
  };
  const std::vector<float> want = feed(1, 1), got = feed(2, 2);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got.back(), want.back());  // the greedy token
  double diff = 0, scale = 0;
  for (size_t i = 0; i + 1 < want.size(); ++i) {
    diff = std::max(diff, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  EXPECT_LT(diff, 1e-4 * scale);  // the all-reduces sum in another order
}

TEST(TpPpRefusals, WhatTheLayoutCannotSplitIsNamed) {
  // 4 layers, 4 heads: 3 stages of 2 ranks are fine, 2 ranks of 3 are not.
  EXPECT_NE(error_of([] {
              ModelEngine e(options(3, 96, 2));
            }).find("--tensor-parallel-size 3 --pipeline-parallel-size 2 with dummy:qwen3-tiny:f32"),
            std::string::npos);
  ModelEngineOptions draft = options(2, 96, 2);
  draft.speculative.method = SpecMethod::EarlyExit;
  draft.speculative.num_speculative_tokens = 2;
  draft.speculative.draft_layers = 1;
  EXPECT_NE(error_of([&] { ModelEngine e(draft); })
                .find("not supported with tensor and pipeline parallelism (--tensor-parallel-size 2 "
                      "--pipeline-parallel-size 2)"),
            std::string::npos);
}
