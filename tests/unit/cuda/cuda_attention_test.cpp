// Paged KV store and attention on CUDA against the CPU backend on the same inputs:
// prefill batches (variable length, causal, several sequences, partial blocks), decode
// batches (one row per sequence, contexts long enough to be split, or many sequences in one
// split each) and verification batches (a few rows per sequence, split like decode), GQA groups 1..16, block sizes 16 and 7, f16 and f32 KV, head_dim 64, 128 and
// 256 (prefill). The KV contents written by
// both backends are compared slot by slot. Also run under compute-sanitizer by gpu-check.sh.
#include <algorithm>
#include <array>
#include <numeric>

#include "cuda_test_util.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

struct SeqSpec {
  int ctx;    // tokens already in the KV
  int n_new;  // query rows this step
};

struct Case {
  int head_dim, n_kv_heads, group, block_size;
  DType kv_dtype;
  std::vector<SeqSpec> seqs;
  int window = 0;  // sliding window (AttentionBatch::window); 0 = plain causal
  // A draft tree over the last sequence's rows (its n_new = nodes + 1; HostBatch::set_tree).
  std::vector<int16_t> tree = {};
};

bool is_prefill(const Case& c) {
  bool prefill = false;
  for (const auto& s : c.seqs) prefill = prefill || s.n_new > 1;
  return prefill;
}

// Whether a batch of several rows per sequence takes the split decode kernel as a speculative
// verification (CudaBackend::attention: at most 17 rows per sequence, f16 KV, no window, the
// tensor-core decode's head layouts) rather than the prefill kernel.
bool is_verification(const Case& c) {
  int max_rows = 0;
  for (const auto& s : c.seqs) max_rows = std::max(max_rows, s.n_new);
  return is_prefill(c) && max_rows <= 17 && c.kv_dtype == DType::F16 && c.window == 0 &&
         (c.head_dim == 64 || c.head_dim == 128) && c.group <= 16;
}

// Whether the case runs on a tensor-core kernel (f16 KV): prefill (attention_prefill_mma.cu),
// or decode at head_dim 64/128 with at most 16 query heads per KV head (attention_decode_mma.cu).
bool tensor_core(const Case& c) {
  if (c.kv_dtype != DType::F16) return false;
  // A windowed decode takes the SIMT kernel (the tensor-core one has no window mask).
  return is_prefill(c) || ((c.head_dim == 64 || c.head_dim == 128) && c.group <= 16 && c.window == 0);
}

// Tolerance of the comparison: f32 paths 2e-5; the tensor-core kernels round Q and the
// probabilities to f16 (11-bit significands, 2^-12 relative each): measured 2.0e-4 to 2.3e-4
// for prefill on these cases, 1.2e-4 to 2.6e-4 for decode in a standalone check (H200); bound
// 1e-3 for both.
double tolerance(const Case& c) { return tensor_core(c) ? 1e-3 : 2e-5; }

void run_case(const Case& c, std::mt19937& rng) {
  auto gpu = make_cuda();
  auto cpu = make_cpu();
  const int hd = c.head_dim, n_heads = c.n_kv_heads * c.group, bs = c.block_size;
  // Block tables: every sequence's blocks drawn from a shuffled pool.
  std::vector<std::vector<int32_t>> tables;
  int n_blocks = 0, max_blocks = 0;
  for (const auto& s : c.seqs) {
    const int nb = (s.ctx + s.n_new + bs - 1) / bs;
    tables.emplace_back(nb);
    n_blocks += nb;
    max_blocks = std::max(max_blocks, nb);
  }
  n_blocks += 3;  // unused blocks too
  std::vector<int32_t> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  for (auto& t : tables)
    for (auto& b : t) b = perm[next++];

  const size_t elem = c.kv_dtype == DType::F32 ? 4 : 2;
  const size_t kv_bytes = static_cast<size_t>(n_blocks) * c.n_kv_heads * bs * hd * elem;
  void* ck = cpu->alloc(kv_bytes);
  void* cv = cpu->alloc(kv_bytes);
  DeviceVec<uint8_t> gk(*gpu, kv_bytes), gv(*gpu, kv_bytes);
  const KvLayerView ckv = plain_kv_view(ck, cv, c.kv_dtype, n_blocks, bs, c.n_kv_heads, hd);
  const KvLayerView gkv = plain_kv_view(gk.get(), gv.get(), c.kv_dtype, n_blocks, bs, c.n_kv_heads, hd);
  const int64_t kv_w = static_cast<int64_t>(c.n_kv_heads) * hd, q_w = static_cast<int64_t>(n_heads) * hd;

  auto build = [&](bool history) {
    HostBatch hb;
    hb.max_blocks = max_blocks;
    hb.q_start.push_back(0);
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      const int from = history ? 0 : c.seqs[s].ctx;
      const int to = history ? c.seqs[s].ctx : c.seqs[s].ctx + c.seqs[s].n_new;
      for (int p = from; p < to; ++p) {
        hb.positions.push_back(p);
        hb.slots.push_back(tables[s][p / bs] * bs + p % bs);
      }
      hb.q_start.push_back(static_cast<int32_t>(hb.positions.size()));
      hb.kv_len.push_back(to);
      std::vector<int32_t> row(max_blocks, 0);
      std::copy(tables[s].begin(), tables[s].end(), row.begin());
      hb.tables.insert(hb.tables.end(), row.begin(), row.end());
    }
    return hb;
  };
  auto store = [&](const HostBatch& hb) {
    const int n = static_cast<int>(hb.positions.size());
    if (n == 0) return;
    const int64_t ld = kv_w + 2;  // strided rows, as in a fused QKV output
    auto k = randn(n * ld, rng), v = randn(n * ld, rng);
    DeviceVec<float> dk(*gpu, k), dv(*gpu, v);
    cpu->kv_store(ckv, k.data(), ld, v.data(), ld, hb.view());
    gpu->kv_store(gkv, dk.get(), ld, dv.get(), ld, hb.device_view(*gpu));
  };
  const HostBatch hist = build(true);
  HostBatch step = build(false);
  if (!c.tree.empty()) step.set_tree(c.tree);
  store(hist);
  store(step);

  // Every written slot holds the same bytes on both.
  const auto gk_host = gk.read(), gv_host = gv.read();
  for (const HostBatch* hb : {&hist, static_cast<const HostBatch*>(&step)})
    for (int32_t slot : hb->slots)
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const size_t off = ((static_cast<size_t>(slot / bs) * c.n_kv_heads + h) * bs + slot % bs) * hd * elem;
        ASSERT_EQ(std::memcmp(static_cast<uint8_t*>(ck) + off, gk_host.data() + off, hd * elem), 0)
            << "K slot " << slot;
        ASSERT_EQ(std::memcmp(static_cast<uint8_t*>(cv) + off, gv_host.data() + off, hd * elem), 0)
            << "V slot " << slot;
      }

  const int n = static_cast<int>(step.positions.size());
  const int64_t ldq = q_w + 8;
  auto q = randn(n * ldq, rng);
  DeviceVec<float> dq(*gpu, q), dout(*gpu, std::vector<float>(n * ldq, NAN));
  std::vector<float> cout(n * ldq, NAN);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  AttentionBatch cview = step.view(), gview = step.device_view(*gpu);
  cview.window = gview.window = c.window;
  cpu->attention(q.data(), ldq, ckv, cview, n_heads, scale, cout.data(), ldq);
  gpu->attention(dq.get(), ldq, gkv, gview, n_heads, scale, dout.get(), ldq);
  const auto got = dout.read();
  std::vector<float> g, r;
  for (int t = 0; t < n; ++t)
    for (int64_t i = 0; i < ldq; ++i) {
      if (i < q_w) {
        g.push_back(got[t * ldq + i]);
        r.push_back(cout[t * ldq + i]);
      } else {
        EXPECT_TRUE(std::isnan(got[t * ldq + i])) << "wrote past the heads at row " << t;
      }
    }
  const double err = rel_err(g, r);
  if (tensor_core(c))
    std::printf("[attention] tensor-core %s hd %d group %d bs %d seqs %zu: rel err %.3g\n",
                is_verification(c) ? "verify"
                : is_prefill(c)    ? "prefill"
                                   : "decode",
                hd, c.group, bs, c.seqs.size(), err);
  EXPECT_LT(err, tolerance(c)) << "hd " << hd << " kv heads " << c.n_kv_heads << " group " << c.group << " bs " << bs
                               << " " << dtype_name(c.kv_dtype);
  cpu->free(ck);
  cpu->free(cv);
}

}  // namespace

TEST(CudaAttention, PrefillVariableLengthCausalGqaMatchesCpu) {
  TESSERA_REQUIRE_CUDA();
  std::mt19937 rng(21);
  const std::vector<SeqSpec> seqs = {{0, 37}, {5, 1}, {40, 70}, {16, 16}, {0, 1}};
  for (DType kvt : {DType::F16, DType::F32})
    for (auto [hd, nkv, group, bs] :
         std::vector<std::array<int, 4>>{{64, 2, 3, 16}, {128, 1, 4, 16}, {64, 1, 7, 7}, {128, 2, 1, 7}})
      run_case(Case{hd, nkv, group, bs, kvt, seqs}, rng);
}

TEST(CudaAttention, LongPrefillAcrossManyKeyTilesMatchesCpu) {
  TESSERA_REQUIRE_CUDA();
  // Several 64-key tiles, the causal diagonal inside and across tiles, a chunk after cached
  // tokens, head_dim 256 (32-key tiles) and a group of 8 (one query-vector tile = 8 rows).
  std::mt19937 rng(24);
  const std::vector<SeqSpec> seqs = {{0, 300}, {130, 77}, {3, 2}};
  for (auto [hd, nkv, group, bs] : std::vector<std::array<int, 4>>{{128, 2, 4, 16}, {256, 1, 2, 16}, {64, 1, 8, 16}})
    run_case(Case{hd, nkv, group, bs, DType::F16, seqs}, rng);
}

TEST(CudaAttention, DecodeSplitOverLongContextsMatchesCpu) {
  TESSERA_REQUIRE_CUDA();
  std::mt19937 rng(22);
  const std::vector<SeqSpec> seqs = {{0, 1}, {15, 1}, {700, 1}, {1500, 1}, {33, 1}};
  for (DType kvt : {DType::F16, DType::F32})
    for (auto [hd, nkv, group, bs] : std::vector<std::array<int, 4>>{
             {64, 2, 3, 16}, {128, 2, 4, 16}, {64, 1, 7, 7}, {128, 1, 1, 16}, {128, 1, 16, 7}})
      run_case(Case{hd, nkv, group, bs, kvt, seqs}, rng);
}

TEST(CudaAttention, SingleSequenceDecodeAtBatchOne) {
  TESSERA_REQUIRE_CUDA();
  std::mt19937 rng(23);
  run_case(Case{128, 8, 4, 16, DType::F16, {{639, 1}}}, rng);
  run_case(Case{64, 3, 3, 16, DType::F16, {{4000, 1}}}, rng);
}

TEST(CudaAttention, ManySequenceDecodeMatchesCpu) {
  TESSERA_REQUIRE_CUDA();
  // Contexts 1..701 keys. 48 sequences × (KV heads × ceil(group / 4)) >= 576 blocks, at least
  // 4 per SM on the H200 (132 SMs): one split of the whole context, so the tensor-core decode
  // kernel writes the output itself (no merge), each warp walking up to 16 key tiles through
  // its ring of buffers. Groups 8 and 12 (query-head rows 8..15 of the mma). 11 sequences:
  // 132 blocks, 4 splits of 256 keys, merged.
  std::mt19937 rng(25);
  auto seqs = [](int n) {
    std::vector<SeqSpec> v;
    for (int i = 0; i < n; ++i) v.push_back({i * 700 / (n - 1), 1});
    return v;
  };
  for (auto [hd, nkv, group, bs] : std::vector<std::array<int, 4>>{{128, 6, 8, 16}, {128, 4, 12, 16}, {64, 4, 12, 7}})
    run_case(Case{hd, nkv, group, bs, DType::F16, seqs(48)}, rng);
  run_case(Case{128, 4, 12, 7, DType::F16, seqs(11)}, rng);
}

TEST(CudaAttention, VerificationRowsSplitOverLongContextsMatchCpu) {
  TESSERA_REQUIRE_CUDA();
  // Speculative verification batches (a few query rows per sequence, each seeing the keys up
  // to its own position) take the tensor-core decode kernel with split keys while no sequence
  // has more than 17 rows: chunks of 16 / group rows per block (group 4: 4 rows, group 16: 1),
  // rows that see none of a split's keys, splits past a row's end and chunks past a
  // sequence's rows. One sequence of 17 rows; then 4 sequences of 2, 5, 1 and 6 rows at
  // contexts inside one split and across several.
  std::mt19937 rng(26);
  for (auto [hd, nkv, group, bs] : std::vector<std::array<int, 4>>{
           {128, 8, 4, 16}, {64, 3, 3, 16}, {128, 1, 16, 7}, {64, 2, 1, 16}, {128, 2, 7, 16}}) {
    run_case(Case{hd, nkv, group, bs, DType::F16, {{1500, 17}}}, rng);
    run_case(Case{hd, nkv, group, bs, DType::F16, {{639, 2}, {3000, 5}, {40, 1}, {255, 6}}}, rng);
  }
  // Batch 1 at the split boundary: rows ending exactly at and across a split's first key.
  run_case(Case{128, 8, 4, 16, DType::F16, {{254, 5}}}, rng);
}

TEST(CudaAttention, DraftTreeRowsSeeOnlyTheirAncestorsLikeTheCpu) {
  TESSERA_REQUIRE_CUDA();
  // Tree verification masks on every kernel that takes several rows per sequence: the split
  // tensor-core decode (<= 17 rows), the tensor-core prefill (more rows, a window), the SIMT
  // prefill (head_dim 96, f32 KV). The tree: a main chain, side branches, a branch two deep.
  std::mt19937 rng(91);
  const std::vector<int16_t> small = {-1, 0, 1, -1, 3, 0, 5, -1};  // 9 rows
  std::vector<int16_t> big = {-1, 0, 1, 2, 3};                     // 24 rows: a chain, then branches
  for (int16_t p : {-1, 0, 1, 5, 6, 8, 9, 2, 11, 12, 13, 4, 15, 16, 17, 18, 3, 20}) big.push_back(p);
  for (auto [hd, nkv, group, bs] :
       std::vector<std::array<int, 4>>{{128, 8, 4, 16}, {64, 3, 3, 16}, {128, 1, 16, 7}, {64, 2, 1, 16}}) {
    run_case(Case{hd, nkv, group, bs, DType::F16, {{1500, 1}, {700, 9}}, 0, small}, rng);
    run_case(Case{hd, nkv, group, bs, DType::F16, {{40, 3}, {1200, 24}}, 0, big}, rng);
  }
  run_case(Case{128, 2, 4, 16, DType::F16, {{300, 24}}, 64, big}, rng);  // a window: the prefill kernel
  run_case(Case{96, 2, 2, 16, DType::F16, {{100, 9}}, 0, small}, rng);   // head_dim 96
  run_case(Case{64, 2, 2, 16, DType::F32, {{33, 9}, {5, 2}}, 0, small}, rng);
}

TEST(CudaAttention, SlidingWindowPrefillAndDecodeMatchCpu) {
  TESSERA_REQUIRE_CUDA();
  std::mt19937 rng(77);
  // Gemma 3 270M's heads (head_dim 256, 4 query heads on 1 KV head, window 512): a prompt past
  // the window, a chunk crossing it, decodes far past it (splits wholly before the window).
  for (DType dt : {DType::F16, DType::F32}) {
    run_case({256, 1, 4, 16, dt, {{0, 700}}, 512}, rng);
    run_case({256, 1, 4, 16, dt, {{600, 40}, {0, 50}}, 64}, rng);
    run_case({256, 1, 4, 16, dt, {{900, 1}, {30, 1}, {600, 1}}, 512}, rng);
  }
  // Other head sizes and block 7, windows of 1 (the key itself) and 16.
  run_case({64, 2, 4, 7, DType::F16, {{40, 19}, {0, 33}, {63, 1}}, 16}, rng);
  run_case({128, 2, 2, 16, DType::F16, {{100, 1}, {5, 1}}, 1}, rng);
  run_case({128, 2, 2, 16, DType::F32, {{10, 30}}, 1}, rng);
}
