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
