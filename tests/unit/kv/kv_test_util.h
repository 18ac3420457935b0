#pragma once
// Helpers the KV block manager tests share: token runs, chain roots, and a sequence's
// allocation and "compute" of its tokens.
#include <gtest/gtest.h>

#include <numeric>
#include <string_view>
#include <vector>

#include "kv/block_manager.h"

namespace tessera::test {

inline std::vector<int32_t> iota_tokens(int n, int start = 100) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), start);
  return t;
}

inline BlockHash root_for(std::string_view salt) { return prefix_root_hash({"model-a", "", salt}); }

// Allocates and "computes" tokens [n_computed, tokens.size()), then registers full blocks.
inline void compute(KvBlockManager& m, SeqKv& kv, const std::vector<int32_t>& tokens) {
  std::vector<BlockCopy> copies;
  const int n_new = static_cast<int>(tokens.size()) - kv.n_computed();
  ASSERT_TRUE(m.allocate_slots(kv, n_new, copies));
  kv.add_computed(n_new);
  m.cache_full_blocks(kv, tokens);
}

}  // namespace tessera::test
