// Backend::rope_kv_store_attention on CUDA (at decode: RoPE, the K/V store, the tensor-core
// attention and the merge of its splits in one launch of clustered blocks) against the same
// device's separate rope_kv_store + attention, which tests/unit/cuda/cuda_attention_test.cpp
// and cuda_fused_test.cpp check against float64 and the CPU. Each sequence's cache holds
// random earlier keys; the slot of the key this step adds starts as NaN, so a block that
// attended to the stale copy (its tiles are copied before the step's own key is stored)
// would poison the output. Cases: one and several sequences, contexts from 1 key to a full
// 8 splits, block sizes 16 and 7, head_dim 128 and 64, neox and interleaved pairs, a partial
// rotation, groups of 4 and 3 query heads; and layouts the fused kernel declines (more than
// 8 splits, one split, a prefill row block), which must take the separate ops.
#include <algorithm>
#include <cstring>
#include <numeric>

#include "core/fp16.h"
#include "cuda_test_util.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

struct Case {
  int head_dim, n_kv, group, block_size, max_blocks, rot_dim;
  bool neox;
  std::vector<int> lens;  // keys per sequence, this step's included
  int rows_of_first = 1;  // > 1: a prefill block (the fused kernel declines)
};

void run_case(Backend& gpu, const Case& c, std::mt19937& rng) {
  const int hd = c.head_dim, n_q = c.n_kv * c.group, n_seqs = static_cast<int>(c.lens.size());
  const int n_blocks = n_seqs * c.max_blocks;
  SCOPED_TRACE("hd " + std::to_string(hd) + " group " + std::to_string(c.group) + " bs " +
               std::to_string(c.block_size) + " seqs " + std::to_string(n_seqs) + " first len " +
               std::to_string(c.lens[0]));
  RopeConfig cfg;
  cfg.head_dim = hd;
  cfg.rot_dim = c.rot_dim;
  cfg.neox = c.neox;
  cfg.freq_base = 500000.0f;
  // Each sequence's table: distinct physical blocks in a random order.
  std::vector<int32_t> phys(n_blocks);
  std::iota(phys.begin(), phys.end(), 0);
  std::shuffle(phys.begin(), phys.end(), rng);
  HostBatch hb;
  hb.max_blocks = c.max_blocks;
  hb.tables.assign(phys.begin(), phys.end());
  hb.q_start = {0};
  std::vector<int64_t> new_slots;
  for (int s = 0; s < n_seqs; ++s) {
    const int rows = s == 0 ? c.rows_of_first : 1;
    for (int r = 0; r < rows; ++r) {
      const int pos = c.lens[s] - rows + r;
      const int64_t slot =
          static_cast<int64_t>(hb.tables[s * c.max_blocks + pos / c.block_size]) * c.block_size + pos % c.block_size;
      hb.positions.push_back(pos);
      hb.slots.push_back(static_cast<int32_t>(slot));
      new_slots.push_back(slot);
    }
    hb.q_start.push_back(hb.q_start.back() + rows);
    hb.kv_len.push_back(c.lens[s]);
  }
  const AttentionBatch b = hb.device_view(gpu);
  const int n = b.n_tokens;
  // Q|K|V rows as the model lays them out (stride ldq), and a cache of earlier keys in f16.
  const int64_t qd = static_cast<int64_t>(n_q) * hd, kd = static_cast<int64_t>(c.n_kv) * hd, ldq = qd + 2 * kd;
  const auto qkv = randn(n * ldq, rng);
  const size_t cache_elems = static_cast<size_t>(n_blocks) * c.n_kv * c.block_size * hd;
  std::vector<uint16_t> kc0(cache_elems), vc0(cache_elems);
  for (size_t i = 0; i < cache_elems; ++i) {
    kc0[i] = tessera::f32_to_fp16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
    vc0[i] = tessera::f32_to_fp16(std::normal_distribution<float>(0.0f, 1.0f)(rng));
  }
  for (int64_t slot : new_slots)  // this step's slots: NaN until stored
    for (int h = 0; h < c.n_kv; ++h)
      for (int d = 0; d < hd; ++d) {
        const size_t at =
            ((static_cast<size_t>(slot / c.block_size) * c.n_kv + h) * c.block_size + slot % c.block_size) * hd + d;
        kc0[at] = vc0[at] = 0x7e00;
      }
  struct Path {
    std::unique_ptr<DeviceVec<float>> qkv, out;
    std::unique_ptr<DeviceVec<uint16_t>> kc, vc;
  } path[2];
  for (Path& p : path) {
    p.qkv = std::make_unique<DeviceVec<float>>(gpu, qkv);
    p.out = std::make_unique<DeviceVec<float>>(gpu, std::vector<float>(n * qd, NAN));
    p.kc = std::make_unique<DeviceVec<uint16_t>>(gpu, kc0);
    p.vc = std::make_unique<DeviceVec<uint16_t>>(gpu, vc0);
  }
  auto view = [&](Path& p) {
    return plain_kv_view(p.kc->get(), p.vc->get(), DType::F16, n_blocks, c.block_size, c.n_kv, hd);
  };
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  {
    float* q = path[0].qkv->get();
    gpu.rope_kv_store_attention(q, ldq, n_q, q + qd, ldq, q + qd + kd, ldq, view(path[0]), b, cfg, scale,
                                path[0].out->get(), qd);
  }
  {
    float* q = path[1].qkv->get();
    gpu.rope_kv_store(q, ldq, n_q, q + qd, ldq, q + qd + kd, ldq, view(path[1]), b, cfg);
    gpu.attention(q, ldq, view(path[1]), b, n_q, scale, path[1].out->get(), qd);
  }
  const auto got = path[0].out->read(), want = path[1].out->read();
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_TRUE(std::isfinite(got[i])) << "output " << i << " (a stale or missing key?)";
  // The fused kernel may split the keys differently (shorter splits), and each split rounds
  // its probabilities to f16 against its own maximum: the tensor-core tolerance of
  // cuda_attention_test.cpp (each path is within ~3e-4 of float64 there).
  EXPECT_LT(rel_err(got, want), 1e-3);
  // The caches: the same keys and values stored (within one f16 rounding of the rotation).
  for (int which = 0; which < 2; ++which) {
    const auto c0 = (which ? path[0].vc : path[0].kc)->read(), c1 = (which ? path[1].vc : path[1].kc)->read();
    for (size_t e = 0; e < cache_elems; ++e) {
      if (c0[e] == c1[e]) continue;
      const float a = tessera::fp16_to_f32(c0[e]), w = tessera::fp16_to_f32(c1[e]);
      ASSERT_NEAR(a, w, 1e-3f * (1.0f + std::fabs(w))) << (which ? "V" : "K") << " cache element " << e;
    }
  }
}

}  // namespace

TEST(CudaFusedAttention, RopeKvStoreAttentionMatchesTheSeparateOps) {
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  std::mt19937 rng(61);
  std::vector<Case> cases;
  // Llama-3.1-8B's layout at batch 1: 128 blocks of 16 = 2,048 keys, a cluster of 8 blocks
  // (the fused kernel shares each step's keys evenly among them, in whole tiles).
  for (int len : {1, 17, 255, 256, 257, 640, 1500, 2048}) cases.push_back({128, 8, 4, 16, 128, 128, true, {len}});
  // The same with 64 blocks of table (the bench's).
  for (int len : {2, 128, 129, 600, 1024}) cases.push_back({128, 8, 4, 16, 64, 128, true, {len}});
  // Several sequences of mixed lengths (fewer splits each), block size 7, interleaved pairs.
  cases.push_back({128, 2, 4, 7, 64, 128, false, {5, 300, 1, 448, 77}});
  // head_dim 64, a partial rotation, 3 query heads per KV head; then 1, in one split (declined).
  cases.push_back({64, 2, 3, 16, 32, 32, true, {100, 512, 9}});
  cases.push_back({64, 4, 1, 16, 16, 64, false, {256, 3}});
  // Declined by the fused kernel: 16 splits (4,096 keys of table), and a prefill block.
  cases.push_back({128, 8, 4, 16, 256, 128, true, {3000}});
  cases.push_back({128, 2, 4, 16, 16, 128, true, {40, 12}, 5});
  for (const Case& c : cases) run_case(*gpu, c, rng);
}
