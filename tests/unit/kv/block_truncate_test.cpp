// Speculative rollback in the block manager: truncate gives back the blocks past the kept
// tokens and never cuts into blocks the prefix index knows.
#include <gtest/gtest.h>

#include "core/error.h"
#include "kv/block_manager.h"

using namespace tessera;

TEST(KvTruncate, FreesTheBlocksPastTheKeptTokens) {
  KvBlockManager m({.n_blocks = 8, .block_size = 4, .prefix_caching = true});
  SeqKv kv;
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(m.allocate_slots(kv, 5, copies));  // 5 tokens: 2 blocks
  kv.table.n_tokens = 5;
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  m.cache_full_blocks(kv, tokens);               // block 0 registered
  ASSERT_TRUE(m.allocate_slots(kv, 5, copies));  // verify 1 + 4 drafts: 10 tokens, 3 blocks
  kv.table.n_tokens = 10;
  EXPECT_EQ(kv.n_blocks(), 3);
  EXPECT_EQ(m.n_free(), 5);
  m.truncate(kv, 7);  // last token + 1 draft kept
  EXPECT_EQ(kv.n_computed(), 7);
  EXPECT_EQ(kv.n_blocks(), 2);
  EXPECT_EQ(m.n_free(), 6);
  m.cache_full_blocks(kv, tokens);  // block 1 not yet full: nothing new
  EXPECT_EQ(m.stats().registered, 1);
  EXPECT_THROW(m.truncate(kv, 3), Error);  // would cut into the registered block 0
  EXPECT_THROW(m.truncate(kv, 8), Error);  // cannot grow
  m.free(kv);
  EXPECT_TRUE(m.is_whole());
}
