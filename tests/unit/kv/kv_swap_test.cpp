// Swap preemption's KV side: the block manager's host tier (all-or-nothing moves, prefix
// keys kept consistent, KvPlan agreeing with the real moves) and the host copies of K/V.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "core/error.h"
#include "kv/block_manager.h"
#include "kv/kv_host_ops.h"

using namespace tessera;

namespace {

std::vector<int32_t> iota_tokens(int n, int start = 1) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

// A sequence holding n computed tokens of `tokens`, indexed in the prefix cache.
SeqKv computed(KvBlockManager& m, const std::vector<int32_t>& tokens, int n) {
  SeqKv kv;
  std::vector<BlockCopy> copies;
  EXPECT_TRUE(m.allocate_slots(kv, n, copies));
  kv.table.n_tokens = n;
  m.cache_full_blocks(kv, tokens);
  return kv;
}

}  // namespace

TEST(KvSwap, SwapOutIsAllOrNothingAndFreesTheDeviceBlocks) {
  KvBlockManager m({.n_blocks = 8, .block_size = 4, .prefix_caching = true, .n_host_blocks = 3});
  const auto tokens = iota_tokens(14);
  SeqKv big = computed(m, tokens, 14);  // 4 blocks: more than the host tier
  std::vector<BlockSwap> swaps;
  EXPECT_FALSE(m.swap_out(big, swaps));
  EXPECT_TRUE(swaps.empty());
  EXPECT_EQ(big.n_blocks(), 4);
  EXPECT_EQ(m.n_host_free(), 3);
  m.free(big);

  SeqKv kv = computed(m, tokens, 10);  // 3 blocks (its full ones are already indexed in big's)
  const std::vector<int32_t> blocks = kv.table.blocks;
  ASSERT_TRUE(m.swap_out(kv, swaps));
  ASSERT_EQ(swaps.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(swaps[i].device, blocks[i]);
    EXPECT_EQ(swaps[i].host, kv.host_blocks[i]);
    EXPECT_TRUE(m.host_used(kv.host_blocks[i]));
  }
  EXPECT_TRUE(kv.swapped());
  EXPECT_TRUE(kv.table.blocks.empty());
  EXPECT_EQ(kv.n_computed(), 10);   // the KV exists, on the host
  EXPECT_EQ(m.n_free(), 8);         // device blocks all free
  EXPECT_EQ(m.n_cached_free(), 3);  // big's full blocks
  EXPECT_EQ(m.n_host_free(), 0);
  EXPECT_EQ(m.swap_stats().swap_outs, 1);
  EXPECT_EQ(m.swap_stats().blocks_out, 3);
  EXPECT_THROW(m.swap_out(kv, swaps), Error);  // already out
  m.check_invariants();
  m.free(kv);  // an abort while swapped out gives the host slots back
  EXPECT_EQ(m.n_host_free(), 3);
  EXPECT_TRUE(m.is_whole());
}

TEST(KvSwap, SwapInTakesFreshBlocksAndRepublishesOnlyWhatWasLost) {
  KvBlockManager m({.n_blocks = 6, .block_size = 4, .prefix_caching = true, .n_host_blocks = 4});
  const auto tokens = iota_tokens(10);
  SeqKv kv = computed(m, tokens, 10);  // blocks 0, 1 full and indexed, 2 partial
  std::vector<BlockSwap> out, in;
  ASSERT_TRUE(m.swap_out(kv, out));
  const std::vector<int32_t> host = kv.host_blocks;

  // Fill the pool with other data: 4 uncached blocks, then the LRU head, block 1 (freed
  // last block first, so block 0 stays cached longer).
  SeqKv other;
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.allocate_slots(other, 20, copies));
  EXPECT_EQ(m.stats().evictions, 1);
  EXPECT_EQ(m.n_free(), 1);

  // Swap-in needs 3 blocks: short, no change.
  EXPECT_FALSE(m.swap_in(kv, in));
  EXPECT_TRUE(in.empty());
  EXPECT_TRUE(kv.swapped());
  m.free(other);

  ASSERT_TRUE(m.swap_in(kv, in));
  ASSERT_EQ(in.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(in[i].host, host[i]);  // block i comes back from where it went
    EXPECT_EQ(in[i].device, kv.table.blocks[i]);
    EXPECT_EQ(m.ref_count(kv.table.blocks[i]), 1);
  }
  EXPECT_FALSE(kv.swapped());
  EXPECT_EQ(kv.n_computed(), 10);
  EXPECT_EQ(m.n_host_free(), 4);
  const int64_t registered = m.stats().registered;
  m.cache_full_blocks(kv, tokens);
  // Block 1's key was evicted: its fresh copy is indexed again. Block 0's key is still
  // indexed in the original block: not entered twice.
  EXPECT_EQ(m.stats().registered, registered + 1);
  EXPECT_EQ(m.find_prefix(kv.root, tokens, 2).size(), 2u);
  m.check_invariants();
  m.free(kv);
  EXPECT_TRUE(m.is_whole());
}

TEST(KvSwap, ASharedBlockStaysWithItsOtherHolders) {
  KvBlockManager m({.n_blocks = 8, .block_size = 4, .prefix_caching = false, .n_host_blocks = 8});
  SeqKv parent = computed(m, iota_tokens(6), 6);
  SeqKv child;
  m.fork(parent, child);
  std::vector<BlockSwap> swaps;
  ASSERT_TRUE(m.swap_out(child, swaps));
  for (int32_t b : parent.table.blocks) EXPECT_EQ(m.ref_count(b), 1);
  ASSERT_TRUE(m.swap_in(child, swaps));
  for (int i = 0; i < 2; ++i) EXPECT_NE(child.table.blocks[i], parent.table.blocks[i]);  // private copies now
  m.free(parent);
  m.free(child);
  EXPECT_TRUE(m.is_whole());
}

TEST(KvSwap, PlanAgreesWithTheMoves) {
  KvBlockManager m({.n_blocks = 8, .block_size = 4, .prefix_caching = true, .n_host_blocks = 3});
  SeqKv a = computed(m, iota_tokens(9), 9);      // 3 blocks
  SeqKv b = computed(m, iota_tokens(9, 50), 9);  // 3 blocks
  KvPlan plan(m);
  EXPECT_TRUE(plan.swap_out(a));
  EXPECT_EQ(plan.n_host_free(), 0);
  EXPECT_EQ(plan.n_free(), m.n_free() + 3);
  EXPECT_FALSE(plan.swap_out(b));  // host tier full: no change
  EXPECT_EQ(plan.n_free(), m.n_free() + 3);
  std::vector<BlockSwap> swaps;
  ASSERT_TRUE(m.swap_out(a, swaps));
  EXPECT_EQ(m.n_free(), plan.n_free());
  // A swapped sequence needs its 3 blocks back plus what its new tokens take.
  KvPlan again(m);
  EXPECT_TRUE(again.reserve(a, {}, 4));  // 9 + 4 tokens: 4 blocks
  EXPECT_EQ(again.n_free(), m.n_free() - 4);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.swap_in(a, swaps));
  ASSERT_TRUE(m.allocate_slots(a, 4, copies));
  EXPECT_EQ(m.n_free(), again.n_free());
  m.free(a);
  m.free(b);
  EXPECT_TRUE(m.is_whole());
}

TEST(KvSwap, HostCopiesRoundTripEveryLayerOfKAndV) {
  auto backend = make_backend({});
  for (const DType dtype : {DType::F32, DType::F16}) {
    KvCacheSpec spec;
    spec.n_layers = 3;
    spec.n_kv_heads = 2;
    spec.head_dim = 4;
    spec.block_size = 5;
    spec.n_blocks = 6;
    spec.set_plain(dtype);
    KvCache kv(*backend, spec);
    const size_t elem = dtype == DType::F32 ? 4 : 2;
    const size_t part = 2 * 5 * 4 * elem;  // bytes of one block of K or V on one layer
    const auto byte = [](int layer, int kv_index, size_t i) {
      return static_cast<uint8_t>(layer * 31 + kv_index * 7 + i);
    };
    for (int l = 0; l < 3; ++l)
      for (size_t i = 0; i < part * 6; ++i) {
        static_cast<uint8_t*>(kv.layer(l).k)[i] = byte(l, 0, i);
        static_cast<uint8_t*>(kv.layer(l).v)[i] = byte(l, 1, i);
      }
    HostKvTier host(spec, 2);
    EXPECT_EQ(host.slot_bytes(), static_cast<int64_t>(2 * 3 * part));
    const BlockSwap out[] = {{1, 0}, {3, 1}};
    swap_out_kv_blocks_host(kv, host, out);
    for (int l = 0; l < 3; ++l) {  // the device copies are overwritten
      std::memset(kv.layer(l).k, 0xEE, part * 6);
      std::memset(kv.layer(l).v, 0xEE, part * 6);
    }
    const BlockSwap in[] = {{5, 0}, {0, 1}};  // block 1's data to 5, block 3's to 0
    swap_in_kv_blocks_host(kv, host, in);
    for (int l = 0; l < 3; ++l) {
      const auto* k = static_cast<const uint8_t*>(kv.layer(l).k);
      const auto* v = static_cast<const uint8_t*>(kv.layer(l).v);
      for (size_t i = 0; i < part; ++i) {
        ASSERT_EQ(k[5 * part + i], byte(l, 0, 1 * part + i)) << l;
        ASSERT_EQ(v[5 * part + i], byte(l, 1, 1 * part + i)) << l;
        ASSERT_EQ(k[0 * part + i], byte(l, 0, 3 * part + i)) << l;
        ASSERT_EQ(v[0 * part + i], byte(l, 1, 3 * part + i)) << l;
        ASSERT_EQ(k[2 * part + i], 0xEE) << "untouched";
      }
    }
    const BlockSwap bad_host[] = {{0, 2}};
    EXPECT_THROW(swap_out_kv_blocks_host(kv, host, bad_host), Error);
    const BlockSwap bad_block[] = {{6, 0}};
    EXPECT_THROW(swap_in_kv_blocks_host(kv, host, bad_block), Error);
  }
}
