// Sliding-window layer group of the KV block manager: local blocks outside the window go back
// to the local pool as a sequence grows; prefix hits, forks, swaps, truncation and KvPlan stay
// exact with them. Checked against independent counts of who holds which block.
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <set>

#include "core/error.h"
#include "kv/block_manager.h"
#include "unit/kv/kv_test_util.h"

using namespace tessera;
using namespace tessera::test;

namespace {

// The local table's live part starts at the block of the oldest key token n_before sees (the
// first query of the last step allocated): nothing it could read is dropped, nothing wholly
// before it is kept.
void expect_window_only(const KvBlockManager& m, const SeqKv& kv, int n_before) {
  m.check_local_table(kv);
  const int first_key = std::max(0, n_before - m.window() + 1);
  EXPECT_EQ(kv.local_dropped, first_key / m.block_size()) << "after " << n_before << " tokens";
  for (int i = 0; i < kv.local_dropped; ++i) EXPECT_EQ(kv.local.blocks[i], kDropped);
  for (int i = kv.local_dropped; i < static_cast<int>(kv.local.blocks.size()); ++i) EXPECT_GE(kv.local.blocks[i], 0);
}

}  // namespace

TEST(KvWindow, LocalLayersHoldOneWindowWhateverTheContext) {
  // window 8, blocks of 4: a decoding sequence holds at most 3 local blocks (the window's
  // 2-3 blocks plus the one being written), and every full block.
  KvBlockManager m({.n_blocks = 64, .block_size = 4, .window = 8, .n_local_blocks = 4});
  SeqKv kv;
  kv.root = root_for("t");
  std::vector<int32_t> tokens = iota_tokens(10);
  compute(m, kv, tokens);  // a 10-token prompt: keys 0.. still needed by token 10
  for (int t = 10; t < 200; ++t) {
    tokens.push_back(t);
    compute(m, kv, tokens);
    expect_window_only(m, kv, t);
    EXPECT_LE(kv.n_local_live(), 3);
    EXPECT_EQ(m.n_local_free(), m.n_local_blocks() - kv.n_local_live());
    m.check_invariants();
  }
  EXPECT_EQ(kv.n_blocks(), 50);  // the full group keeps everything
  m.free(kv);
  EXPECT_TRUE(m.is_whole());
}

// Gemma 3's numbers: window 512, blocks of 16. A 16k-token sequence (8k prompt in chunks of
// 2048, then 8k decoded one token at a time) ends holding all 1024 blocks in its global
// layers and 33 in its local ones; the local pool sized for one step of 2048 tokens (161
// blocks) never runs short.
TEST(KvWindow, A16kTokenGemmaSequenceHoldsOnlyItsWindow) {
  KvBlockManager m({.n_blocks = 1024, .block_size = 16, .window = 512, .n_local_blocks = (511 + 2048) / 16 + 2});
  SeqKv kv;
  kv.root = root_for("gemma");
  std::vector<int32_t> tokens;
  int most_live = 0;
  while (kv.n_computed() < 16384) {
    const int n_before = kv.n_computed();
    const int n_new = n_before < 8192 ? 2048 : 1;
    for (int i = 0; i < n_new; ++i) tokens.push_back(static_cast<int32_t>(tokens.size() % 1000));
    compute(m, kv, tokens);
    ASSERT_FALSE(HasFatalFailure());
    if (n_before >= 8192) most_live = std::max(most_live, kv.n_local_live());
    ASSERT_EQ(kv.local_dropped, m.local_first_live(n_before));
  }
  EXPECT_EQ(kv.n_blocks(), 1024);
  // The last step (token 16383) sees keys 15872..: blocks 992..1023. At a block edge (token
  // 16k) the window spans 33 blocks: 511 / 16 + 2.
  EXPECT_EQ(kv.n_local_live(), 32);
  EXPECT_EQ(most_live, 33);
  m.check_invariants();
  m.free(kv);
  EXPECT_TRUE(m.is_whole());
}

TEST(KvWindow, AllocationIsAllOrNothingOverBothPools) {
  KvBlockManager m({.n_blocks = 64, .block_size = 4, .window = 8, .n_local_blocks = 3});
  SeqKv a, b;
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.allocate_slots(a, 12, copies));  // 3 local blocks: the local pool is full
  EXPECT_EQ(m.n_local_free(), 0);
  KvPlan plan(m);
  EXPECT_FALSE(plan.reserve(b, {}, 1));
  EXPECT_FALSE(m.allocate_slots(b, 1, copies));
  EXPECT_EQ(m.n_free(), 61);  // nothing taken from the full pool either
  a.add_computed(12);
  // a's next token sees keys 5..12: block 0 (keys 0..3) is dropped first, which pays for
  // block 3 (keys 12..15) — the plan credits the drop.
  KvPlan plan2(m);
  EXPECT_TRUE(plan2.reserve(a, {}, 4));
  ASSERT_TRUE(m.allocate_slots(a, 4, copies));
  EXPECT_EQ(a.local_dropped, 1);
  EXPECT_EQ(m.n_local_free(), 0);
  m.free(a);
  EXPECT_TRUE(m.is_whole());
}

TEST(KvWindow, PrefixHitIsShortenedToWhatTheLocalPoolStillHolds) {
  // A 40-token prompt prefilled in chunks of 8 needs 10 local blocks over its life; a pool
  // of 6 keeps only the newest 6 (logical blocks 4..9) cached after it ends.
  KvBlockManager m({.n_blocks = 64, .block_size = 4, .window = 8, .n_local_blocks = 6});
  SeqKv a;
  a.root = root_for("t");
  const auto prompt = iota_tokens(40);
  for (int n = 8; n <= 40; n += 8) compute(m, a, {prompt.begin(), prompt.begin() + n});
  m.free(a);
  EXPECT_TRUE(m.is_whole());
  // Hit point 16: token 16's window (keys 9..16) needs logical local blocks 2 and 3, long
  // evicted; every shorter hit needs an evicted block too: no hit, though the full pool
  // still holds the first 4 blocks.
  auto early = iota_tokens(16);
  early.push_back(7);
  EXPECT_TRUE(m.find_prefix(a.root, early, 4).empty());
  // Hit point 40: its window needs blocks 8 and 9, still cached: the whole prompt hits.
  auto full = prompt;
  full.push_back(7);
  const auto hits = m.find_prefix(a.root, full, 10);
  ASSERT_EQ(hits.size(), 10u);
  SeqKv b;
  b.root = a.root;
  KvPlan plan(m);
  EXPECT_TRUE(plan.reserve(b, hits, 1));
  EXPECT_EQ(plan.n_local_free(), 6 - 2 - 1);  // 2 revived, 1 fresh
  m.adopt_prefix(b, hits);
  EXPECT_EQ(b.n_computed(), 40);
  expect_window_only(m, b, 40);
  EXPECT_EQ(b.n_local_live(), 2);
  compute(m, b, full);
  EXPECT_EQ(m.n_local_free(), 6 - 3);
  m.check_invariants();
  m.free(b);
  EXPECT_TRUE(m.is_whole());
}

TEST(KvWindow, ForkCopiesTheSharedPartialBlockInBothPools) {
  KvBlockManager m({.n_blocks = 16, .block_size = 4, .window = 8, .n_local_blocks = 8});
  SeqKv a, b;
  compute(m, a, iota_tokens(10));  // blocks 0..2, the last one partial
  m.fork(a, b);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.allocate_slots(b, 1, copies));
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_FALSE(copies[0].local);
  EXPECT_TRUE(copies[1].local);
  EXPECT_EQ(copies[1].src, a.local.blocks[2]);
  EXPECT_EQ(copies[1].dst, b.local.blocks[2]);
  EXPECT_NE(a.local.blocks[2], b.local.blocks[2]);
  EXPECT_EQ(a.local.blocks[1], b.local.blocks[1]);  // full blocks stay shared
  EXPECT_EQ(m.local_ref_count(a.local.blocks[1]), 2);
  m.free(a);
  m.free(b);
  EXPECT_TRUE(m.is_whole());
}

TEST(KvWindow, SwapMovesOnlyTheLiveWindow) {
  KvBlockManager m({.n_blocks = 32, .block_size = 4, .n_host_blocks = 16, .window = 8, .n_local_blocks = 8});
  SeqKv a;
  std::vector<int32_t> tokens = iota_tokens(30);
  compute(m, a, tokens);  // one prefill: every local block live until the next allocation
  EXPECT_EQ(a.n_local_live(), 8);
  // The swap-out drops blocks before token 30's window (keys 23..30: blocks 5..7 live).
  EXPECT_EQ(m.host_slots_needed(a), 8 + 3);
  KvPlan plan(m);
  EXPECT_TRUE(plan.swap_out(a));
  EXPECT_EQ(plan.n_host_free(), 16 - 11);
  EXPECT_EQ(plan.n_local_free(), 8);
  std::vector<BlockSwap> out, in;
  ASSERT_TRUE(m.swap_out(a, out));
  ASSERT_EQ(out.size(), 11u);
  EXPECT_EQ(std::count_if(out.begin(), out.end(), [](const BlockSwap& s) { return s.local; }), 3);
  EXPECT_EQ(m.n_local_free(), 8);
  EXPECT_EQ(a.local_dropped, 5);
  m.check_local_table(a);
  KvPlan plan2(m);
  EXPECT_TRUE(plan2.reserve(a, {}, 1));
  EXPECT_EQ(plan2.n_local_free(), 8 - 3);
  ASSERT_TRUE(m.swap_in(a, in));
  ASSERT_EQ(in.size(), 11u);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(in[i].host, out[i].host);  // same order back
  expect_window_only(m, a, 30);
  tokens.push_back(1);
  compute(m, a, tokens);
  m.check_invariants();
  m.free(a);
  EXPECT_TRUE(m.is_whole());
}

TEST(KvWindow, SpeculativeRollbackKeepsTheWindow) {
  KvBlockManager m({.n_blocks = 32, .block_size = 4, .prefix_caching = false, .window = 8, .n_local_blocks = 8});
  SeqKv a;
  compute(m, a, iota_tokens(20));
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.allocate_slots(a, 1 + 6, copies));  // the last token and 6 draft tokens
  EXPECT_EQ(a.local_dropped, 3);                    // token 20 sees keys 13..20
  a.add_computed(7);
  m.truncate(a, 21);  // no draft token accepted: the last token only
  expect_window_only(m, a, 20);
  EXPECT_EQ(a.local.blocks.size(), 6u);
  m.check_invariants();
  EXPECT_THROW(m.truncate(a, 8), Error);  // token 8's window would need dropped blocks
  m.free(a);
  EXPECT_TRUE(m.is_whole());
}

// Random interleavings of admission (with prefix hits), decode, chunked prefill, speculative
// rollback, fork, swap and free; every allocation is predicted by KvPlan and every reference
// count matches an independent count of the tables holding the block, in both pools.
TEST(KvWindow, RandomOperationsKeepBothPoolsExact) {
  std::mt19937 rng(99);
  const int bs = 4;
  KvBlockManager m({.n_blocks = 60, .block_size = bs, .n_host_blocks = 40, .window = 9, .n_local_blocks = 24});
  struct Live {
    SeqKv kv;
    std::vector<int32_t> tokens;
  };
  std::vector<Live> live;
  const auto grow = [&](Live& s, int n_new, int keep) {
    KvPlan plan(m);
    const bool plan_ok = plan.reserve(s.kv, {}, n_new);
    std::vector<BlockCopy> copies;
    bool ok = true;
    if (s.kv.swapped()) {
      std::vector<BlockSwap> swaps;
      ok = m.swap_in(s.kv, swaps);
    }
    ok = ok && m.allocate_slots(s.kv, n_new, copies);
    EXPECT_EQ(ok, plan_ok);
    if (!ok) return;
    for (const auto& c : copies) EXPECT_GT(c.local ? m.local_ref_count(c.src) : m.ref_count(c.src), 0);
    for (int i = 0; i < n_new; ++i) s.tokens.push_back(rng() % 3);
    s.kv.add_computed(n_new);
    m.truncate(s.kv, s.kv.n_computed() - n_new + keep);
    s.tokens.resize(s.kv.n_computed());
    m.cache_full_blocks(s.kv, s.tokens);
  };
  int n_hits = 0, n_swaps = 0;
  for (int step = 0; step < 6000; ++step) {
    const int op = rng() % 8;
    if (op == 0 || live.empty()) {  // admission, maybe with a prefix hit
      Live s;
      s.kv.root = root_for(rng() % 2 ? "a" : "b");
      const int n = 1 + rng() % 30;
      for (int i = 0; i < n; ++i) s.tokens.push_back(rng() % 2);  // small alphabet: many hits
      const auto hits = m.find_prefix(s.kv.root, s.tokens, (n - 1) / bs);
      n_hits += !hits.empty();
      const int n_new = n - static_cast<int>(hits.size()) * bs;
      KvPlan plan(m);
      const bool plan_ok = plan.reserve(s.kv, hits, n_new);
      m.adopt_prefix(s.kv, hits);
      std::vector<BlockCopy> copies;
      const bool ok = m.allocate_slots(s.kv, n_new, copies);
      EXPECT_EQ(ok, plan_ok);
      if (!ok) {
        m.free(s.kv);
      } else {
        s.kv.add_computed(n_new);
        m.cache_full_blocks(s.kv, s.tokens);
        live.push_back(std::move(s));
      }
    } else if (op <= 2) {  // decode one token
      Live& s = live[rng() % live.size()];
      grow(s, 1, 1);
    } else if (op == 3) {  // a chunk of prefill, or a speculative step keeping some
      Live& s = live[rng() % live.size()];
      const int n_new = 1 + rng() % 8;
      grow(s, n_new, rng() % 2 ? n_new : 1 + rng() % n_new);
    } else if (op == 4) {  // fork (of a sequence on the device)
      const Live& s = live[rng() % live.size()];
      if (s.kv.swapped()) continue;
      Live k;
      k.tokens = s.tokens;
      k.kv.root = s.kv.root;
      m.fork(s.kv, k.kv);
      live.push_back(std::move(k));
    } else if (op == 5) {  // swap out
      Live& s = live[rng() % live.size()];
      if (s.kv.swapped() || s.kv.n_blocks() == 0) continue;
      KvPlan plan(m);
      const bool plan_ok = plan.swap_out(s.kv);
      std::vector<BlockSwap> swaps;
      EXPECT_EQ(m.swap_out(s.kv, swaps), plan_ok);
      n_swaps += plan_ok;
    } else {  // free
      const size_t i = rng() % live.size();
      m.free(live[i].kv);
      live.erase(live.begin() + i);
    }
    std::vector<int> refs(m.n_blocks(), 0), local_refs(m.n_local_blocks(), 0);
    for (const auto& s : live) {
      m.check_local_table(s.kv);
      std::set<int32_t> mine(s.kv.table.blocks.begin(), s.kv.table.blocks.end());
      ASSERT_EQ(mine.size(), s.kv.table.blocks.size()) << "a block twice in one table";
      for (int32_t b : mine) ++refs[b];
      for (int32_t b : s.kv.local.blocks)
        if (b != kDropped) ++local_refs[b];
    }
    for (int b = 0; b < m.n_blocks(); ++b) ASSERT_EQ(refs[b], m.ref_count(b)) << "block " << b << " step " << step;
    for (int b = 0; b < m.n_local_blocks(); ++b)
      ASSERT_EQ(local_refs[b], m.local_ref_count(b)) << "local block " << b << " step " << step;
    if (step % 50 == 0) m.check_invariants();
  }
  for (auto& s : live) m.free(s.kv);
  EXPECT_TRUE(m.is_whole());
  m.check_invariants();
  EXPECT_GT(n_hits, 50);
  EXPECT_GT(n_swaps, 20);
}
