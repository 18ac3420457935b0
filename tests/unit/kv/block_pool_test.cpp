#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/kv_cache.h"
#include "model/model.h"

using namespace tessera;

TEST(BlockPool, AllocationIsAllOrNothing) {
  BlockPool pool(4);
  std::vector<int32_t> got;
  EXPECT_TRUE(pool.allocate(3, got));
  EXPECT_EQ(pool.n_free(), 1);
  std::vector<int32_t> more;
  EXPECT_FALSE(pool.allocate(2, more));
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(pool.n_free(), 1);
  for (int32_t b : got) pool.release(b);
  EXPECT_EQ(pool.n_free(), 4);
}

TEST(BlockPool, ReferenceCountsShareBlocks) {
  BlockPool pool(2);
  std::vector<int32_t> got;
  ASSERT_TRUE(pool.allocate(1, got));
  pool.retain(got[0]);
  EXPECT_EQ(pool.ref_count(got[0]), 2);
  pool.release(got[0]);
  EXPECT_EQ(pool.n_free(), 1);
  pool.release(got[0]);
  EXPECT_EQ(pool.n_free(), 2);
  EXPECT_THROW(pool.release(got[0]), Error);  // double free is caught, not silent
}

TEST(SequenceBlocks, ReserveGrowsByWholeBlocksAndReleases) {
  BlockPool pool(3);
  SequenceBlocks seq;
  EXPECT_TRUE(seq.reserve(pool, 4, 5));  // 5 tokens -> 2 blocks
  EXPECT_EQ(seq.blocks.size(), 2u);
  seq.n_tokens = 5;
  EXPECT_TRUE(seq.reserve(pool, 4, 3));  // 8 tokens still fit in 2 blocks
  EXPECT_EQ(seq.blocks.size(), 2u);
  EXPECT_FALSE(seq.reserve(pool, 4, 8));  // 13 tokens need 4 blocks: only 3 exist
  EXPECT_EQ(seq.blocks.size(), 2u);
  EXPECT_EQ(seq.slot(5, 4), seq.blocks[1] * 4 + 1);
  seq.release_all(pool);
  EXPECT_EQ(pool.n_free(), 3);
}

TEST(ForwardBatch, BlockTablesWidenAcrossSequences) {
  SequenceBlocks a, b;
  a.blocks = {7};
  a.n_tokens = 2;
  b.blocks = {3, 1, 4};
  b.n_tokens = 9;
  ForwardBatch fb;
  int32_t t[3] = {1, 2, 3};
  fb.add_sequence(a, 4, t, 2, ForwardBatch::Logits::Last);
  fb.add_sequence(b, 4, t, 3, ForwardBatch::Logits::All);
  EXPECT_EQ(fb.max_blocks, 3);
  EXPECT_EQ(fb.block_tables, (std::vector<int32_t>{7, 0, 0, 3, 1, 4}));
  EXPECT_EQ(fb.positions, (std::vector<int32_t>{2, 3, 9, 10, 11}));
  EXPECT_EQ(fb.slot_mapping, (std::vector<int32_t>{30, 31, 17, 18, 19}));  // 7*4+2, 7*4+3, then block 4
  EXPECT_EQ(fb.q_start, (std::vector<int32_t>{0, 2, 5}));
  EXPECT_EQ(fb.kv_len, (std::vector<int32_t>{4, 12}));
  EXPECT_EQ(fb.logits_rows, (std::vector<int32_t>{1, 2, 3, 4}));
}

TEST(ForwardBatch, DraftTreeMasksAndRopePositions) {
  // A chain of 2 new rows, then a tree after 5 tokens: root, nodes {-1, 0, -1, 2}.
  SequenceBlocks chain, tree;
  chain.blocks = {0, 1};
  chain.n_tokens = 3;
  tree.blocks = {2, 3, 4};  // 5 + 5 tokens need three blocks of 4
  tree.n_tokens = 5;
  const int32_t toks[] = {7, 8, 9, 10, 11};
  ForwardBatch b;
  b.add_sequence(chain, 4, toks, 2, ForwardBatch::Logits::All);
  EXPECT_FALSE(b.has_tree());
  b.add_sequence(tree, 4, toks, 5, ForwardBatch::Logits::All);
  const std::vector<int16_t> parents = {-1, 0, -1, 2};
  b.set_tree(parents);
  ASSERT_TRUE(b.has_tree());
  // Chain rows: causal bits; tree rows: the root and their ancestors only.
  EXPECT_EQ(b.tree_mask, (std::vector<uint32_t>{0b1, 0b11, 0b1, 0b11, 0b111, 0b1001, 0b11001}));
  // RoPE by depth; masks keep the slot positions.
  EXPECT_EQ(b.rope_positions, (std::vector<int32_t>{3, 4, 5, 6, 7, 6, 7}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{3, 4, 5, 6, 7, 8, 9}));
  const AttentionBatch a = b.attention_view();
  EXPECT_EQ(a.tree_mask, b.tree_mask.data());
  EXPECT_EQ(a.rotation_positions(), b.rope_positions.data());
  // A sequence added after the tree gets causal masks too.
  b.add_sequence(chain, 4, toks, 1, ForwardBatch::Logits::None);
  EXPECT_EQ(b.tree_mask.back(), 0b1u);
  EXPECT_EQ(b.rope_positions.back(), 3);
  // Bad trees are refused, naming the node or the row count.
  ForwardBatch bad;
  bad.add_sequence(tree, 4, toks, 3, ForwardBatch::Logits::All);
  const std::vector<int16_t> forward_parent = {1, -1};
  EXPECT_THROW(bad.set_tree(forward_parent), Error);
  EXPECT_THROW(bad.set_tree(parents), Error);  // 4 nodes over 3 rows
}
