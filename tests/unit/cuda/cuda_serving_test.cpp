// Serving on any backend: KV block copies and swaps through the backend's copy ops, and the
// planned logits readback (argmax-only rows). Each test runs on the CPU backend (here and in
// CI) and again on CUDA where a device is visible; the engine test compares a whole serving
// run (forks, prefix hits, swap preemption, logprobs) on CUDA against the CPU.
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "core/error.h"
#include "cuda_test_util.h"
#include "engine/engine_core.h"
#include "engine/engine_model.h"
#include "kv/kv_host_ops.h"
#include "sample/sampler.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

std::unique_ptr<Backend> make(const std::string& device) { return device == "cpu" ? make_cpu() : make_cuda(); }

// The sampler's own greedy pick (or the error it raises, as -1).
int32_t sampler_argmax(std::vector<float> row) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, static_cast<int32_t>(row.size()));
  try {
    return s.sample(row);
  } catch (const Error&) {
    return -1;
  }
}

// Planned readback of n_rows rows of n_vocab logits on every device, twice on the same
// backend: ids against the sampler's own greedy pick, full rows copied exactly, argmax rows
// not copied.
void check_argmax_readback(int n_vocab, int n_rows) {
  SCOPED_TRACE("vocab " + std::to_string(n_vocab) + ", rows " + std::to_string(n_rows));
  std::mt19937 rng(7);
  std::vector<float> logits = randn(static_cast<size_t>(n_rows) * n_vocab, rng, 3.0f);
  auto row = [&](int r) { return logits.data() + static_cast<size_t>(r) * n_vocab; };
  const float inf = std::numeric_limits<float>::infinity();
  row(1)[900] = 50.0f;  // a tie: the lower id wins
  row(1)[77] = 50.0f;
  row(2)[n_vocab - 1] = 60.0f;  // the last id
  for (int i = 0; i < n_vocab; ++i) row(3)[i] = -std::fabs(row(3)[i]) - 1.0f;
  row(3)[5000] = -0.0f;  // -0 == +0: the first one wins
  row(3)[30] = 0.0f;
  row(4)[12] = std::nanf("");                 // the sampler refuses: -1, row copied
  std::fill(row(5), row(5) + n_vocab, -inf);  // all -inf: likewise
  row(6)[99] = inf;                           // +inf: likewise
  row(8)[n_vocab - 2] = 70.0f;                // a tie across the row's ends
  row(8)[3] = 70.0f;
  // the other rows ordinary; row 7 is read in full.
  std::vector<uint8_t> argmax_only(n_rows, 1);
  argmax_only[7] = 0;
  for (const std::string& device : test_devices()) {
    SCOPED_TRACE(device);
    auto be = make(device);
    DeviceVec<float> dev(*be, logits);
    const float sentinel = 12345.0f;
    std::vector<float> host(logits.size(), sentinel);
    std::vector<int32_t> ids(n_rows, -7);
    for (int round = 0; round < 2; ++round) {
      std::fill(ids.begin(), ids.end(), -7);
      be->read_logits(host.data(), dev.get(), n_rows, n_vocab, {argmax_only.data(), ids.data()});
      for (int r = 0; r < n_rows; ++r) {
        const std::vector<float> ref(row(r), row(r) + n_vocab);
        const float* got = host.data() + static_cast<size_t>(r) * n_vocab;
        if (!argmax_only[r]) {
          EXPECT_EQ(ids[r], -7) << "row " << r << " was not asked for its argmax";
          EXPECT_EQ(std::memcmp(got, ref.data(), sizeof(float) * n_vocab), 0) << "row " << r;
          continue;
        }
        EXPECT_EQ(ids[r], sampler_argmax(ref)) << "row " << r;
        if (ids[r] < 0) {
          EXPECT_EQ(std::memcmp(got, ref.data(), sizeof(float) * n_vocab), 0) << "unreducible row " << r;
        } else if (device != "cpu") {
          EXPECT_EQ(got[0], sentinel) << "row " << r << " crossed the bus";
        }
      }
      EXPECT_EQ(ids[1], 77);
      EXPECT_EQ(ids[2], n_vocab - 1);
      EXPECT_EQ(ids[3], 30);
      EXPECT_EQ(ids[4], -1);
      EXPECT_EQ(ids[8], 3);
    }
    // Without a plan every row is copied.
    std::fill(host.begin(), host.end(), sentinel);
    be->read_logits(host.data(), dev.get(), n_rows, n_vocab, {});
    EXPECT_EQ(std::memcmp(host.data(), logits.data(), sizeof(float) * logits.size()), 0);
  }
}

}  // namespace

// Vocabularies that are and are not a multiple of 4 (scalar and vector widths), 9 and 20 rows.
TEST(CudaServing, ArgmaxReadbackMatchesTheSamplerAndCopiesOnlyFullRows) {
  for (const int n_vocab : {49157, 49152})
    for (const int n_rows : {9, 20}) check_argmax_readback(n_vocab, n_rows);
}

TEST(CudaServing, KvBlockCopiesAndSwapsGoThroughTheBackend) {
  for (const std::string& device : test_devices()) {
    for (DType dt : {DType::F16, DType::F32}) {
      SCOPED_TRACE(device + " " + std::string(dtype_name(dt)));
      auto be = make(device);
      KvCacheSpec spec;
      spec.n_layers = 3;
      spec.n_kv_heads = 2;
      spec.head_dim = 8;
      spec.block_size = 5;
      spec.n_blocks = 7;
      spec.set_plain(dt);
      KvCache kv(*be, spec);
      const size_t block =
          static_cast<size_t>(spec.n_kv_heads) * spec.block_size * spec.head_dim * (dt == DType::F32 ? 4 : 2);
      const size_t layer = block * spec.n_blocks;
      // Reference contents: [layer][K, V] bytes, random.
      std::mt19937 rng(3);
      std::vector<std::vector<uint8_t>> ref(2 * spec.n_layers, std::vector<uint8_t>(layer));
      for (int l = 0; l < spec.n_layers; ++l)
        for (int kvi = 0; kvi < 2; ++kvi) {
          auto& r = ref[2 * l + kvi];
          for (auto& b : r) b = static_cast<uint8_t>(rng());
          be->copy_to_device(kvi ? kv.layer(l).v : kv.layer(l).k, r.data(), layer);
        }
      auto apply_copy = [&](int src, int dst) {
        for (auto& r : ref) std::memcpy(r.data() + dst * block, r.data() + src * block, block);
      };
      // Copy-on-write copies, in order (the second reads what the first wrote).
      const std::vector<BlockCopy> copies = {{1, 4}, {4, 6}, {0, 2}};
      copy_kv_blocks(kv, copies);
      for (const BlockCopy& c : copies) apply_copy(c.src, c.dst);
      // Swap blocks 6 and 3 out, scribble on the device, swap them back into 0 and 5.
      HostKvTier host(spec, 4, *be);
      const std::vector<BlockSwap> out = {{6, 2}, {3, 0}};
      swap_out_kv_blocks(kv, host, out);
      std::vector<uint8_t> zeros(layer, 0);
      for (int l = 0; l < spec.n_layers; ++l) {
        be->copy_to_device(kv.layer(l).k, zeros.data(), layer);
        be->copy_to_device(kv.layer(l).v, zeros.data(), layer);
      }
      for (auto& r : ref) {
        std::vector<uint8_t> b6(r.begin() + 6 * block, r.begin() + 7 * block),
            b3(r.begin() + 3 * block, r.begin() + 4 * block);
        std::fill(r.begin(), r.end(), 0);
        std::copy(b6.begin(), b6.end(), r.begin() + 0 * block);
        std::copy(b3.begin(), b3.end(), r.begin() + 5 * block);
      }
      const std::vector<BlockSwap> in = {{0, 2}, {5, 0}};
      swap_in_kv_blocks(kv, host, in);
      for (int l = 0; l < spec.n_layers; ++l)
        for (int kvi = 0; kvi < 2; ++kvi) {
          std::vector<uint8_t> got(layer);
          be->copy_to_host(got.data(), kvi ? kv.layer(l).v : kv.layer(l).k, layer);
          EXPECT_EQ(got, ref[2 * l + kvi]) << "layer " << l << (kvi ? " V" : " K");
        }
      const std::vector<BlockCopy> bad = {{0, 7}};
      EXPECT_THROW(copy_kv_blocks(kv, bad), Error);
      const std::vector<BlockSwap> bad_swap = {{0, 4}};
      EXPECT_THROW(swap_out_kv_blocks(kv, host, bad_swap), Error);
    }
  }
}

namespace {

struct EngineRun {
  std::map<RequestId, std::vector<std::vector<int32_t>>> tokens;  // [request][choice]
  std::map<RequestId, std::vector<int32_t>> logprob_tokens;       // chosen tokens of logprob entries
  EngineStats stats;
};

ModelEngineOptions engine_options(const std::string& device, SpecMethod speculative = SpecMethod::None) {
  ModelEngineOptions o;
  o.speculative.method = speculative;
  o.speculative.num_speculative_tokens = 4;
  o.speculative.adaptive = false;          // fixed k
  if (speculative == SpecMethod::Ngram) {  // n-gram trees (several candidates in one forward)
    o.speculative.prompt_lookup_min = 1;
    o.speculative.prompt_lookup_candidates = 3;
  }
  // The dummy's random layers each move the argmax: only a draft through all but the last
  // layer agrees with the target often (56 % of its drafts on the CPU), so drafts get accepted.
  if (speculative == SpecMethod::EarlyExit) o.speculative.draft_layers = 29;
  o.session.model = "dummy:smollm2-135m:f32";
  o.session.backend.device = device;
  o.session.backend.threads = 2;
  o.session.block_size = 4;
  // Exact token equality with the CPU: an f32 KV cache keeps the prefill attention on the f32
  // kernel (with f16 KV it runs on the tensor cores, ~1e-3 from the CPU).
  o.session.k_format = o.session.v_format = kv_format_of(DType::F32);
  o.scheduler.max_num_batched_tokens = 48;
  o.scheduler.max_num_seqs = 12;
  o.scheduler.max_model_len = 128;
  o.scheduler.preemption_mode = PreemptionMode::Swap;
  o.kv_cache_bytes = 32ll << 20;
  o.max_kv_blocks = 40;  // tight: 12 sequences of up to ~60 tokens preempt and swap
  o.swap_space_bytes = 16ll << 20;
  return o;
}

EngineRun run_engine(ModelEngine& engine) {
  EngineConfig c = engine.config();
  c.check_invariants = true;
  EngineCore core(c, engine.executor());
  EngineRun result;
  const int32_t n_vocab = engine.session().config().n_vocab;
  for (RequestId id = 1; id <= 9; ++id) {
    Request r;
    // Requests 1-3 share a 9-token prefix (prefix hits, copy-on-write of the partial block).
    for (int i = 0; i < 9 + static_cast<int>(id) * 3; ++i)
      r.prompt.push_back(
          static_cast<int32_t>(((id <= 3 ? 1 : id) * 7919 + i * 104729 + (id <= 3 && i < 9 ? 0 : id)) % n_vocab));
    r.sampling.temperature = 0;
    r.sampling.max_tokens = 20 + static_cast<int>(id) * 3;
    r.sampling.ignore_eos = true;
    if (id == 4) r.n = 3;  // forks: copy-on-write of the last prompt block
    if (id == 5) {         // logprobs: a full row for this one
      r.logprobs = true;
      r.sampling.n_logprobs = 2;
    }
    if (id == 6) r.sampling.repetition_penalty = 1.3f;  // a penalty: a full row too
    result.tokens[id].resize(r.n);
    core.add(id, r);
  }
  while (core.has_work()) {
    const StepResult s = core.step();
    EXPECT_EQ(s.error, "");
    for (const SeqEvent& e : s.events) {
      if (e.token >= 0) result.tokens[e.request][e.choice].push_back(e.token);
      if (e.logprobs) result.logprob_tokens[e.request].push_back(e.logprobs->chosen.token);
    }
  }
  result.stats = core.stats();
  return result;
}

// The run of a speculating engine on the GPU, after checking its tokens are the plain CPU
// engine's (every request, every choice).
EngineRun speculating_run_with_the_plain_cpu_tokens(SpecMethod method) {
  ModelEngine plain(engine_options("cpu"));
  ModelEngine gpu(engine_options("cuda", method));
  const EngineRun p = run_engine(plain);
  EngineRun g = run_engine(gpu);
  for (const auto& [id, choices] : p.tokens)
    for (size_t k = 0; k < choices.size(); ++k)
      EXPECT_EQ(g.tokens.at(id)[k], choices[k]) << "request " << id << " choice " << k;
  return g;
}

}  // namespace

TEST(CudaServing, EngineOnCudaGivesTheCpuTokensWithForksPrefixHitsAndSwaps) {
  TESSERA_REQUIRE_CUDA();
  ModelEngine cpu(engine_options("cpu"));
  ModelEngine gpu(engine_options("cuda"));
  ASSERT_EQ(cpu.config().n_blocks, gpu.config().n_blocks);
  const EngineRun c = run_engine(cpu);
  const EngineRun g = run_engine(gpu);
  EXPECT_GT(c.stats.preemptions, 0) << "the pool is meant to be tight enough to preempt";
  EXPECT_EQ(g.stats.preemptions, c.stats.preemptions);
  ASSERT_EQ(g.tokens.size(), c.tokens.size());
  for (const auto& [id, choices] : c.tokens) {
    for (size_t k = 0; k < choices.size(); ++k) {
      EXPECT_EQ(choices[k].size(), static_cast<size_t>(20 + id * 3)) << "request " << id;
      EXPECT_EQ(g.tokens.at(id)[k], choices[k]) << "request " << id << " choice " << k;
    }
  }
  EXPECT_EQ(g.logprob_tokens, c.logprob_tokens);
  EXPECT_EQ(g.logprob_tokens.at(5), g.tokens.at(5)[0]);
}

TEST(CudaServing, SpeculationOnCudaGivesThePlainCpuTokens) {
  // n-gram speculation (trees allowed) on the GPU: the tokens of the plain CPU engine, with
  // forks, prefix hits, swaps and penalties as above. The dummy model's greedy outputs
  // repeat one continuation, so its drafts are chains; trees through the model are
  // CudaModel.DraftTreeForward..., their kernels CudaAttention/CudaKvQuant.DraftTree...
  TESSERA_REQUIRE_CUDA();
  const EngineRun g = speculating_run_with_the_plain_cpu_tokens(SpecMethod::Ngram);
  EXPECT_GT(g.stats.spec.accepted_tokens, 0);
}

TEST(CudaServing, EarlyExitOverTheTargetsCacheOnCudaGivesThePlainCpuTokens) {
  // Early exit on the GPU: the drafter's layers are views of the target's resident weights
  // and it drafts over the target's own paged cache (scratch blocks lent from its pool, the
  // partial block's layers < L copied on the device). Tokens: the plain CPU engine's; every
  // block back in the pool.
  TESSERA_REQUIRE_CUDA();
  const EngineRun g = speculating_run_with_the_plain_cpu_tokens(SpecMethod::EarlyExit);
  EXPECT_GT(g.stats.spec.draft_tokens, 0);
  EXPECT_GT(g.stats.spec.accepted_tokens, 0);
  EXPECT_EQ(g.stats.kv_free_blocks, g.stats.kv_total_blocks);
}
