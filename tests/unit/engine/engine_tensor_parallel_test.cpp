// The engine at --tensor-parallel-size N on the CPU (ranks as threads, docs/design/parallel.md):
// through the serving path (EngineCore over ModelEngine's executor) it must give the greedy
// tokens of the same engine at TP 1 with several requests at once and chunked prefill, a
// prefix-cache hit, an n = 2 fork (copy-on-write on every rank), preemption with swap (every
// rank its heads of the host slots), and quantized KV whose per-head constants (fp8 :head
// scales, TurboQuant key means and signs) are sliced to each rank's heads; every KV block is
// free at the end (run_engine checks). The model is qwen3-tiny in F32 (4 heads, 2 KV heads:
// TP 2 splits the KV heads, TP 4 shares them), where TP changes the logits only by float32
// rounding (tensor_parallel_test.cpp measures it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/cuda/cuda_factory.h"
#include "backend/kv_codec.h"
#include "core/error.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "engine/engine_summary.h"
#include "engine/session.h"
#include "engine_run_harness.h"
#include "parallel_harness.h"
#include "kv/kv_host_ops.h"
#include "model/dummy.h"

using namespace tessera;
using tessera::test::RunResult;
using namespace tessera::test::parallel;

namespace {

class EngineTensorParallel : public TwoEngines {
 protected:
  static void SetUpTestSuite() { make(options(1), options(2)); }
};

}  // namespace

TEST_F(EngineTensorParallel, ConcurrentChunkedRequestsGiveTheTokensOfTp1) {
  const RunResult want = test::run_engine(*one_, mixed_requests(), false, 0, false);
  const RunResult got = test::run_engine(*two_, mixed_requests(), false, 0, false);
  expect_same_tokens(got, want, "tp 2");
  EXPECT_EQ(got.stats.steps, want.stats.steps);  // the one scheduler made the same steps
  for (const auto& [id, o] : got.out) EXPECT_EQ(o.tokens[0].size(), 8u);
  // TP 4: four ranks, two per KV head.
  ModelEngine tp4(options(4));
  EXPECT_EQ(tp4.tensor_parallel_size(), 4);
  EXPECT_EQ(tp4.kv().spec().n_kv_heads, 1);
  expect_same_tokens(test::run_engine(tp4, mixed_requests(), false, 0, false), want, "tp 4");
}

TEST_F(EngineTensorParallel, TheThreadedEngineServesClientsOnManyThreads) {
  // The serving path: Engine's own thread steps the TP executor; four clients submit at once.
  expect_threaded_engine_gives_the_tokens_of(*one_, *two_);
}

TEST_F(EngineTensorParallel, PrefixCacheHitGivesTheTokensOfTp1) {
  const std::vector<Request> reqs = shared_prefix_requests();
  const RunResult want = test::run_engine(*one_, reqs, true, 0, false);
  const RunResult got = test::run_engine(*two_, reqs, true, 0, true);
  EXPECT_GE(got.stats.prefix.hit_tokens, 20);
  expect_same_tokens(got, want, "prefix hit");
}

TEST_F(EngineTensorParallel, ForkCopiesOnWriteOnEveryRank) {
  // 13 prompt tokens: the last block is partial, and the second choice writes into a copy of
  // it. Seeded sampling makes the choices differ, so each reads its own copy on every rank;
  // a fresh engine, so a rank that skipped the copy would read memory no other test wrote.
  const Request r = diverging_fork();
  ModelEngine tp2(options(2));
  const RunResult want = test::run_engine(*one_, {r}, true);
  const RunResult got = test::run_engine(tp2, {r}, true);
  EXPECT_EQ(got.stats.forks, 1);
  EXPECT_EQ(got.stats.block_copies, 1);
  EXPECT_NE(want.out.at(1).tokens[0], want.out.at(1).tokens[1]);  // the choices diverge
  expect_same_tokens(got, want, "fork");
}

TEST_F(EngineTensorParallel, SwapPreemptionMovesEveryRanksHeads) {
  // Four sequences of up to 38 tokens (29 blocks together) in 14 blocks of 4: some are swapped out.
  const RunResult want = test::run_engine(*one_, mixed_requests(), true, 0, false);
  const RunResult got = test::run_engine(*two_, mixed_requests(), false, 14, true, swap_preemption(*two_));
  EXPECT_GT(got.stats.swaps_out, 0);
  EXPECT_EQ(got.stats.swaps_in, got.stats.swaps_out);
  EXPECT_EQ(got.stats.swap_fallbacks, 0);
  // A block moved costs both ranks' heads: the swap bytes count whole blocks of both.
  EXPECT_GT(got.stats.swap_out_bytes, 0);
  EXPECT_EQ(got.stats.swap_out_bytes % two_->config().kv_block_bytes, 0);
  EXPECT_EQ(two_->config().kv_block_bytes, 2 * kv_block_bytes(two_->kv().spec()));
  expect_same_tokens(got, want, "swap");
}

TEST_F(EngineTensorParallel, EachRankStoresItsKvHeadsSoTheBudgetHoldsMoreBlocks) {
  // A budget under the cap: a rank's block is half the bytes (one of two KV heads).
  ModelEngineOptions o1 = options(1, 0), o2 = options(2, 0);
  o1.kv_cache_bytes = o2.kv_cache_bytes = 1 << 20;
  ModelEngine a(o1), b(o2);
  EXPECT_EQ(a.kv().spec().n_kv_heads, 2);
  EXPECT_EQ(b.kv().spec().n_kv_heads, 1);
  EXPECT_EQ(a.config().n_blocks, kv_blocks_for_budget(a.kv().spec(), 1 << 20));
  EXPECT_EQ(b.config().n_blocks, kv_blocks_for_budget(b.kv().spec(), 1 << 20));
  EXPECT_EQ(b.config().n_blocks, 2 * a.config().n_blocks);
  EXPECT_EQ(b.config().kv_block_bytes, a.config().kv_block_bytes);  // both ranks' halves of a block
  const EngineSummary s = describe_engine(b, kModel);
  EXPECT_EQ(s.tensor_parallel_size, 2);
  EXPECT_EQ(s.kv_bytes, 2 * kv_block_bytes(b.kv().spec()) * b.config().n_blocks);
  const std::string text = format_engine_summary(s);
  EXPECT_NE(text.find("2 tensor-parallel ranks"), std::string::npos) << text;
  EXPECT_NE(s.device.find("2 tensor-parallel ranks (in-process group), each cpu (1 threads"), std::string::npos)
      << s.device;
}

namespace {
// Per-head constants of a quantized KV: fp8 :head scales (one per KV head and layer, each
// head its own) or TurboQuant keys with calibrated means, at TP 1 and 2.
ModelEngineOptions quantized_options(int tp, const std::string& k_format) {
  ModelEngineOptions o = options(tp);
  o.session.k_format = parse_kv_format(k_format, true);
  const int n_layer = 4, n_kv = 2, hd = 128;
  if (k_format == "fp8:head")
    for (int il = 0; il < n_layer; ++il) o.session.k_scales.push_back({0.02f + 0.01f * il, 0.05f + 0.01f * il});
  else
    for (int il = 0; il < n_layer; ++il) {
      std::vector<float> mean(n_kv * hd);
      for (int i = 0; i < n_kv * hd; ++i) mean[i] = 0.01f * static_cast<float>((i * 7 + il) % 13) - 0.06f;
      o.session.k_mean.push_back(mean);
    }
  return o;
}
}  // namespace

TEST(EngineTensorParallelKv, PerHeadConstantsAreSlicedToEachRanksHeads) {
  for (const std::string format : {"fp8:head", "turbo4"}) {
    ModelEngine tp1(quantized_options(1, format)), tp2(quantized_options(2, format));
    const KvCacheSpec& whole = tp1.kv().spec();
    const KvCacheSpec& rank0 = tp2.kv().spec();  // heads [0, 1)
    ASSERT_EQ(rank0.n_kv_heads, 1) << format;
    EXPECT_EQ(rank0.n_kv_heads_whole, 2);
    if (format == "fp8:head") {
      EXPECT_EQ(rank0.k_scales[3], std::vector<float>{whole.k_scales[3][0]});
      EXPECT_EQ(whole.kv_heads(1, 1).k_scales[3], std::vector<float>{whole.k_scales[3][1]});
    } else {
      EXPECT_EQ(rank0.k_mean[2], std::vector<float>(whole.k_mean[2].begin(), whole.k_mean[2].begin() + 128));
      const KvCacheSpec rank1 = whole.kv_heads(1, 1);
      EXPECT_EQ(rank1.kv_head_first, 1);
      EXPECT_EQ(rank1.k_mean[2], std::vector<float>(whole.k_mean[2].begin() + 128, whole.k_mean[2].end()));
    }
    const RunResult want = test::run_engine(tp1, mixed_requests(), false, 0, false);
    expect_same_tokens(test::run_engine(tp2, mixed_requests(), false, 0, false), want, format);
  }
}

TEST(EngineTensorParallelKv, SlidingWindowPoolsNeedNothingPerRank) {
  // phi3-tiny: a 16-key window on every layer, so its KV lives in the local pool, whose
  // blocks behind the window are dropped; the pool's tables are the engine's on every rank.
  const auto make = [](int tp) {
    ModelEngineOptions o = options(tp);
    o.session.model = "dummy:phi3-tiny:f32";
    return o;
  };
  ModelEngine tp1(make(1)), tp2(make(2));
  ASSERT_GT(tp2.config().n_local_blocks, 0);
  EXPECT_EQ(tp2.kv().spec().n_kv_heads, 2);  // 4 KV heads over 2 ranks
  const RunResult want = test::run_engine(tp1, mixed_requests(), false, 0, false);
  expect_same_tokens(test::run_engine(tp2, mixed_requests(), false, 0, false), want, "windows");
}

TEST(EngineTensorParallelKv, TurboSignsOfAHeadSliceAreTheWholeCachesDraws) {
  for (const std::string format : {"turbo4", "turbo3:qjl"}) {
    const KvFormat f = parse_kv_format(format, true);
    const int hd = 128, whole_heads = 4;
    const std::vector<float> whole = make_kv_constants(f, whole_heads, hd, 2, true, 5, {});
    const KvConstantsLayout lw = kv_constants_layout(f, whole_heads, hd);
    for (int first : {0, 2}) {
      const std::vector<float> part = make_kv_constants(f, 2, hd, 2, true, 5, {}, {}, {}, {}, {first, whole_heads});
      const KvConstantsLayout lp = kv_constants_layout(f, 2, hd);
      for (int i = 0; i < 2 * hd; ++i) ASSERT_EQ(part[lp.signs + i], whole[lw.signs + first * hd + i]) << format;
      if (f.qjl) {
        for (int i = 0; i < 2 * hd * hd; ++i) ASSERT_EQ(part[lp.qjl + i], whole[lw.qjl + first * hd * hd + i]);
      }
    }
    EXPECT_THROW(make_kv_constants(f, 2, hd, 2, true, 5, {}, {}, {}, {}, {3, whole_heads}), Error);
  }
}

TEST(EngineTensorParallelKv, WhatTensorParallelismCannotDoIsRefusedByName) {
  const auto expect_error = [](ModelEngineOptions o, const std::string& needle) {
    try {
      ModelEngine e(o);
      ADD_FAILURE() << "accepted (want '" << needle << "')";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(options(3), "--tensor-parallel-size 3 with dummy:qwen3-tiny:f32");
  expect_error(options(3), "4 attention heads do not split over 3 ranks");
  expect_error(options(0), "--tensor-parallel-size 0 must be at least 1");
  ModelEngineOptions gemma = options(2);
  gemma.session.model = "dummy:gemma3-tiny:f32";
  expect_error(gemma, "gemma3 is not sharded");
  ModelEngineOptions draft = options(2);
  draft.speculative.method = SpecMethod::EarlyExit;
  draft.speculative.num_speculative_tokens = 2;
  draft.speculative.draft_layers = 1;
  expect_error(draft, "not supported with tensor parallelism (--tensor-parallel-size 2); the ngram method is");
  ModelEngineOptions cuda = options(2);
  cuda.session.backend.device = "cuda:1";
  expect_error(cuda, "rank r runs on cuda:r; pass --device cuda");
  cuda.session.backend.device = "cuda";
  expect_error(cuda, "on CUDA runs without graphs: add --no-cuda-graphs");
  if (cuda_device_count() < 2) {  // this machine: a rank without a device (or CUDA) is named
    cuda.session.backend.cuda_graphs = false;
    expect_error(cuda, cuda_device_count() == 0 ? "--tensor-parallel-size 2: rank " : "rank 1 on cuda:1");
  }

  // KV transfer between engines (disaggregation): refused per request and at the API.
  ModelEngine tp2(options(2));
  EngineCore core(tp2.config(), tp2.executor());
  Request r = greedy(prompt(9, 3), 2);
  r.kv_lease_seconds = 10;
  const auto rejection = core.validate(r);
  ASSERT_TRUE(rejection.has_value());
  EXPECT_NE(rejection->message.find("KV transfer between engines is not supported with tensor parallelism"),
            std::string::npos)
      << rejection->message;
  EXPECT_THROW(core.kv_identity(), Error);
  EXPECT_THROW(tp2.executor().make_staging(1), Error);
}

TEST(ParallelRanks, ARankThatFailsReleasesTheOthersAndTheGroupRecovers) {
  BackendOptions cpu;
  cpu.threads = 2;
  ParallelRanks ranks(make_dummy_weights("qwen3-tiny:f32", 3), cpu, {.tensor = 2}, 16, 1);
  const KvCacheSpec whole = KvCacheSpec::plain(4, 2, 128, 4, 4, DType::F32);
  ranks.run([&](ParallelRanks::Rank& r) {
    r.kv = std::make_unique<KvCache>(*r.backend, ranks.rank_kv_spec(whole, r.index));
    r.runner = std::make_unique<ModelRunner>(*r.model, *r.kv, *r.backend);
  });
  SequenceBlocks seq;
  seq.blocks = {0, 1};
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  ForwardBatch batch;
  batch.add_sequence(seq, 4, tokens.data(), 5, ForwardBatch::Logits::Last);
  std::vector<std::vector<float>> logits(2, std::vector<float>(kVocab));
  // Rank 1 fails before its forward; rank 0 waits in the embedding's all-reduce for it.
  try {
    ranks.run([&](ParallelRanks::Rank& r) {
      if (r.index == 1) fail("injected failure");
      r.runner->forward(batch, logits[0].data());
    });
    ADD_FAILURE() << "a failed rank went unnoticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor parallel rank 1: injected failure"), std::string::npos) << e.what();
  }
  // The next step runs on both ranks, and both see the same (whole) logits.
  ranks.run([&](ParallelRanks::Rank& r) { r.runner->forward(batch, logits[r.index].data()); });
  EXPECT_EQ(logits[0], logits[1]);
  EXPECT_EQ(ranks.rank(1).kv->spec().kv_head_first, 1);
}

TEST(TensorParallelSession, FeedRunsEveryRankAndReturnsTheWholeLogits) {
  // What `tessera bench model --tensor-parallel-size N` runs on: a Session whose feed() drives
  // the ranks. Its logits are TP 1's within float32 rounding, its KV cache rank 0's heads.
  const auto feed = [](int tp) {
    SessionOptions so;
    so.model = kModel;
    so.dummy_seed = 7;
    so.backend.threads = 2;
    so.ctx = 64;
    so.kv_tokens = 16;        // grown below (every rank's cache is remade)
    so.max_batch_tokens = 8;  // 13 tokens: two chunks
    so.block_size = 4;
    so.tensor_parallel_size = tp;
    Session s(so);
    EXPECT_EQ(s.kv().spec().n_kv_heads, tp == 1 ? 2 : 1);
    if (tp > 1) {
      EXPECT_THROW(s.runner(), Error);
    }
    SequenceBlocks seq;
    std::vector<float> logits;
    s.feed(seq, prompt(13, 4), ForwardBatch::Logits::Last, logits);
    EXPECT_THROW(s.provision_kv(48), Error);  // not while a sequence holds blocks
    seq.release_all(s.pool());
    s.provision_kv(48);
    EXPECT_EQ(s.kv_tokens(), 48);
    return logits;
  };
  const std::vector<float> want = feed(1), got = feed(2);
  ASSERT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(double(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(double(want[i])));
  }
  // float32 rounding: the row-parallel products add in another order (measured 2.7e-5 of the
  // largest logit in the -O1 sanitizer build, whose kernels round differently).
  EXPECT_LT(diff / scale, 1e-4);
  EXPECT_EQ(std::max_element(got.begin(), got.end()) - got.begin(),
            std::max_element(want.begin(), want.end()) - want.begin());
}
