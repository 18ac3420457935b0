#include "kv/kv_host_ops.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"

using namespace tessera;

TEST(KvHostOps, CopiesOneBlockOnEveryLayerOfKAndV) {
  auto backend = make_backend({});
  KvCacheSpec spec;
  spec.n_layers = 3;
  spec.n_kv_heads = 2;
  spec.head_dim = 4;
  spec.block_size = 5;
  spec.n_blocks = 6;
  spec.set_plain(DType::F32);
  KvCache kv(*backend, spec);
  const size_t per_block = 2 * 5 * 4;  // floats: [heads, block, head_dim]
  for (int l = 0; l < 3; ++l) {
    auto view = kv.layer(l);
    for (size_t i = 0; i < per_block * 6; ++i) {
      static_cast<float*>(view.k)[i] = static_cast<float>(l * 10000 + i);
      static_cast<float*>(view.v)[i] = static_cast<float>(-(l * 10000 + static_cast<int>(i)));
    }
  }
  const BlockCopy copies[] = {{1, 4}, {4, 2}};  // in order: 2 gets block 1's data
  copy_kv_blocks_host(kv, copies);
  for (int l = 0; l < 3; ++l) {
    const auto view = kv.layer(l);
    const float* k = static_cast<const float*>(view.k);
    const float* v = static_cast<const float*>(view.v);
    for (size_t i = 0; i < per_block; ++i) {
      for (int dst : {4, 2}) {
        EXPECT_EQ(k[dst * per_block + i], static_cast<float>(l * 10000 + per_block + i));
        EXPECT_EQ(v[dst * per_block + i], -static_cast<float>(l * 10000 + per_block + i));
      }
      EXPECT_EQ(k[3 * per_block + i], static_cast<float>(l * 10000 + 3 * per_block + i));  // untouched
    }
  }
  const BlockCopy bad[] = {{0, 6}};
  EXPECT_THROW(copy_kv_blocks_host(kv, bad), Error);
}

TEST(KvHostOps, BlocksForABudget) {
  KvCacheSpec spec;
  spec.n_layers = 30;
  spec.n_kv_heads = 3;
  spec.head_dim = 64;
  spec.block_size = 16;
  spec.set_plain(DType::F16);
  // SmolLM2-135M: 2 (K, V) * 30 * 3 * 64 * 2 bytes = 23040 bytes a token, 368640 a block.
  EXPECT_EQ(kv_block_bytes(spec), 368640);
  EXPECT_EQ(kv_blocks_for_budget(spec, 368640 * 10 + 5), 10);
  EXPECT_THROW(kv_blocks_for_budget(spec, 1000), Error);
  EXPECT_GT(host_available_memory_bytes(), 0);
}
