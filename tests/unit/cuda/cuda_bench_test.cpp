// The GPU benchmark at Llama-3.1-8B shape with bf16 dummy weights, run by
// scripts/gpu-check.sh (TESSERA_CUDA_BENCH=1); skipped otherwise, and without a GPU.
// Prints each figure beside its floor: bytes over the measured copy bandwidth (decode) and
// FLOPs over the measured bf16 matrix rate (prefill), plus the achieved GB/s and TFLOP/s.
//   decode, batch 1, 128 tokens after a 512-token prompt
//   prefill, one 512-token prompt
//   decode, 128 sequences at once, 512-token prompts then 128 steps (context 512..640)
// TESSERA_CUDA_BENCH_WEIGHTS picks another dummy weight type (fp8, w4g128, ...; the bytes read
// are the matrices' own) and TESSERA_CUDA_BENCH_SEQS another number of sequences.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>

#include "cuda_test_util.h"
#include "engine/model_runner.h"
#include "model/dummy.h"
#include "model/model.h"
#include "model/weights.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

TEST(CudaBench, Llama31_8B_Bf16) {
  TESSERA_REQUIRE_CUDA();
  const char* flag = std::getenv("TESSERA_CUDA_BENCH");
  if (!flag || (std::string(flag) != "1" && std::string(flag) != "b1"))
    GTEST_SKIP() << "set TESSERA_CUDA_BENCH=1 (scripts/gpu-check.sh does), or =b1 for batch-1 decode alone";
  const bool only_b1 = std::string(flag) == "b1";  // A/B runs of the batch-1 path
  auto gpu = make_cuda();
  const DeviceCeilings ceil = measure_cuda_ceilings(*gpu);
  std::printf("[bench] device %s: copy %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", gpu->describe().c_str(),
              ceil.copy_bytes_per_s / 1e9, ceil.bf16_flops_per_s / 1e12);

  double t0 = now_s();
  const char* wtype = std::getenv("TESSERA_CUDA_BENCH_WEIGHTS");
  const char* seqs_env = std::getenv("TESSERA_CUDA_BENCH_SEQS");
  const std::string weight_type = wtype && *wtype ? wtype : "bf16";
  auto weights = make_dummy_weights("llama-3.1-8b:" + weight_type, 0);
  const ModelConfig& c = weights->config;
  const int n_seqs = seqs_env ? std::max(1, std::atoi(seqs_env)) : 128, n_prompt = 512, n_gen = 128, bs = 16;
  std::printf("[bench] weights %s, %d sequences\n", weight_type.c_str(), n_seqs);
  auto model = create_model(weights, *gpu, n_prompt, n_seqs);
  std::printf("[bench] weights made and uploaded in %.1f s\n", now_s() - t0);
  KvCacheSpec spec;
  spec.n_layers = c.n_layer;
  spec.n_kv_heads = c.n_head_kv;
  spec.head_dim = c.head_dim;
  spec.block_size = bs;
  const int blocks_per_seq = (n_prompt + n_gen + bs - 1) / bs;
  spec.n_blocks = n_seqs * blocks_per_seq;
  KvCache kv(*gpu, spec);
  ModelRunner runner(*model, kv, *gpu);  // the model's forward, with its decode graphs
  BlockPool pool(spec.n_blocks);

  const int64_t e = c.n_embd, q_dim = int64_t{c.n_head} * c.head_dim, kv_dim = int64_t{c.n_head_kv} * c.head_dim;
  const double matmul_params =
      c.n_layer * (2.0 * e * q_dim + 2.0 * e * kv_dim + 3.0 * e * c.n_ff) + double(c.n_vocab) * e;
  // Every matrix as stored (codes and scales); the embedding table is only gathered.
  double weight_read_bytes = static_cast<double>(weights->output.bytes());
  for (const LayerWeights& l : weights->layers)
    for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      weight_read_bytes += static_cast<double>(m->bytes());
  const double kv_bytes_per_token = double(spec.bytes_per_token());
  auto logits_buf = cuda_pinned_host(sizeof(float) * static_cast<size_t>(n_seqs) * c.n_vocab);
  float* logits = static_cast<float*>(logits_buf.get());

  std::vector<int32_t> prompt(n_prompt);
  for (int i = 0; i < n_prompt; ++i) prompt[i] = (i * 7919 + 1) % c.n_vocab;
  std::vector<SequenceBlocks> seqs(n_seqs);
  for (auto& s : seqs) ASSERT_TRUE(s.reserve(pool, bs, n_prompt + n_gen));
  ForwardBatch fb;

  // Prefill: sequence 0 timed several times (its KV simply rewritten), then every sequence.
  auto prefill = [&](int s) {
    fb.clear();
    seqs[s].n_tokens = 0;
    fb.add_sequence(seqs[s], bs, prompt.data(), n_prompt, ForwardBatch::Logits::Last);
    runner.forward(fb, logits);
    seqs[s].n_tokens = n_prompt;
  };
  // With TESSERA_CUDA_DIAG=profile each phase prints its per-op device-time table (warm-ups
  // excluded); the backend then runs without graphs, so the timings are not the headline ones.
  auto profile = [&](const char* phase) {
    const std::string table = cuda_profile_take(*gpu);
    if (phase && !table.empty()) std::printf("\n[profile] %s\n%s", phase, table.c_str());
  };
  prefill(0);  // warm-up (cuBLASLt plans, staging buffers)
  profile(nullptr);
  double best_prefill = 1e30;
  for (int rep = 0; rep < (only_b1 ? 0 : 5); ++rep) {
    t0 = now_s();
    prefill(0);
    best_prefill = std::min(best_prefill, now_s() - t0);
  }
  profile("prefill, one 512-token prompt (5 forwards)");
  // Decode at batch 1 from the 512-token prompt. Greedy, as the executor runs it: only the
  // argmax of each row comes back (the forwards of 1 and 128 sequences replay CUDA graphs).
  std::vector<uint8_t> argmax_only(n_seqs, 1);
  std::vector<int32_t> picks(n_seqs);
  auto decode_step = [&](int n) {
    fb.clear();
    for (int s = 0; s < n; ++s) {
      const int32_t tok = (seqs[s].n_tokens * 31 + s) % c.n_vocab;
      fb.add_sequence(seqs[s], bs, &tok, 1, ForwardBatch::Logits::Last);
    }
    runner.forward(fb, logits, {argmax_only.data(), picks.data()});
    ASSERT_GE(picks[0], 0);
    for (int s = 0; s < n; ++s) ++seqs[s].n_tokens;
  };
  decode_step(1);
  seqs[0].n_tokens = n_prompt;
  profile(nullptr);
  t0 = now_s();
  for (int i = 0; i < n_gen; ++i) decode_step(1);
  const double t_dec1 = now_s() - t0;
  profile("decode, batch 1, context 512-640 (128 steps)");
  const double bw = ceil.copy_bytes_per_s, rate = ceil.bf16_flops_per_s;
  const double avg_ctx = n_prompt + n_gen / 2.0;
  const double dec1_bytes = weight_read_bytes + avg_ctx * kv_bytes_per_token;
  const double dec1_floor = dec1_bytes / bw;
  const double step1 = t_dec1 / n_gen;
  if (only_b1) {
    std::printf("\n| test | tok/s | floor tok/s | of floor | achieved |\n|---|---|---|---|---|\n");
    std::printf("| decode batch 1 (ctx 512-640) | %.0f | %.0f | %.0f%% | %.0f GB/s |\n", 1 / step1, 1 / dec1_floor,
                100 * dec1_floor / step1, dec1_bytes / step1 / 1e9);
    return;
  }
  // 128 sequences: prompts, then decode together.
  t0 = now_s();
  for (int s = 0; s < n_seqs; ++s) prefill(s);
  const double t_prefill_all = now_s() - t0;
  profile(nullptr);
  t0 = now_s();
  for (int i = 0; i < n_gen; ++i) decode_step(n_seqs);
  const double t_dec128 = now_s() - t0;
  profile("decode, 128 sequences, context 512-640 (128 steps)");
  std::printf("[bench] decode forwards replayed from CUDA graphs: %lld\n",
              static_cast<long long>(runner.graph_replays()));

  // Floors. Decode reads every matrix once per step plus the KV of every sequence.
  const double attn_flops_pp = 4.0 * c.n_layer * q_dim * (n_prompt * (n_prompt + 1) / 2.0);
  const double pp_flops = 2.0 * matmul_params * n_prompt + attn_flops_pp;
  const double pp_floor = std::max(pp_flops / rate, weight_read_bytes / bw);
  const double dec128_bytes = weight_read_bytes + n_seqs * avg_ctx * kv_bytes_per_token;
  const double dec128_flops = 2.0 * matmul_params * n_seqs + 4.0 * c.n_layer * q_dim * avg_ctx * n_seqs;
  const double dec128_floor = std::max(dec128_bytes / bw, dec128_flops / rate);
  const double step128 = t_dec128 / n_gen;

  std::printf("\n| test | tok/s | floor tok/s | of floor | achieved |\n|---|---|---|---|---|\n");
  std::printf("| decode batch 1 (ctx 512-640) | %.0f | %.0f | %.0f%% | %.0f GB/s |\n", 1 / step1, 1 / dec1_floor,
              100 * dec1_floor / step1, dec1_bytes / step1 / 1e9);
  std::printf("| prefill 512 | %.0f | %.0f | %.0f%% | %.0f TFLOP/s |\n", n_prompt / best_prefill, n_prompt / pp_floor,
              100 * pp_floor / best_prefill, pp_flops / best_prefill / 1e12);
  std::printf("| prefill %d x 512 (one sequence per forward) | %.0f | | | %.0f TFLOP/s |\n", n_seqs,
              n_seqs * n_prompt / t_prefill_all, n_seqs * pp_flops / t_prefill_all / 1e12);
  std::printf("| decode %d seqs (ctx 512-640) | %.0f | %.0f | %.0f%% | %.0f GB/s, %.0f TFLOP/s |\n", n_seqs,
              n_seqs / step128, n_seqs / dec128_floor, 100 * dec128_floor / step128, dec128_bytes / step128 / 1e9,
              dec128_flops / step128 / 1e12);
  std::printf("\nceilings: copy %.0f GB/s, bf16 %.0f TFLOP/s; weights read per step %.2f GB; KV %.0f KiB/token\n",
              bw / 1e9, rate / 1e12, weight_read_bytes / 1e9, kv_bytes_per_token / 1024);
  EXPECT_GT(1 / step1, 0.0);
}
