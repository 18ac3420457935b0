#include "kv/kv_host_ops.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "backend/kv_format.h"
#include "core/error.h"
#include "model/model.h"

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

// Tree verification moves single tokens: a token's codes and its own scales land in the
// destination slot (another page, or the same), byte for byte, in every layer of K and V, in
// each format whose scales are per token; nothing else changes; KIVI keys refuse.
TEST(KvHostOps, MovesSingleTokensWithTheirScales) {
  auto backend = make_backend({});
  for (const char* name : {"f16", "fp8_e4m3:token", "int8:g32", "int4:g32", "turbo3.5"}) {
    KvCacheSpec spec;
    spec.n_layers = 2;
    spec.n_kv_heads = 2;
    spec.head_dim = 64;
    spec.block_size = 4;
    spec.n_blocks = 4;
    spec.k_format = parse_kv_format(name, true);
    spec.v_format = parse_kv_format(name, false);
    KvCache kv(*backend, spec);
    // Fill slots 0..13 (blocks 0..3) with distinct rows through the store.
    std::mt19937 rng(7);
    std::normal_distribution<float> nd;
    const int n = 14, kvd = spec.n_kv_heads * spec.head_dim;
    std::vector<float> k(size_t(n) * kvd), v(size_t(n) * kvd);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    SequenceBlocks seq;
    seq.blocks = {0, 1, 2, 3};
    ForwardBatch fb;
    std::vector<int32_t> toks(n, 0);
    fb.add_sequence(seq, spec.block_size, toks.data(), n, ForwardBatch::Logits::None);
    for (int l = 0; l < spec.n_layers; ++l)
      backend->kv_store(kv.layer(l), k.data(), kvd, v.data(), kvd, fb.attention_view());
    // A token's bytes (codes, then its scales) in one layer's K or V, all heads.
    const auto token_bytes = [&](int l, int part, int slot) {
      const KvLayerView view = kv.layer(l);
      const KvFormat& f = part == 0 ? spec.k_format : spec.v_format;
      const KvPageLayout pl = kv_page_layout(f, spec.block_size, spec.head_dim);
      const int64_t meta = pl.meta_bytes / spec.block_size;
      const auto* base = static_cast<const uint8_t*>(part == 0 ? view.k : view.v);
      std::vector<uint8_t> out;
      for (int h = 0; h < spec.n_kv_heads; ++h) {
        const uint8_t* page = base + (int64_t(slot / spec.block_size) * spec.n_kv_heads + h) * pl.page_bytes;
        const uint8_t* row = page + (slot % spec.block_size) * pl.row_bytes;
        out.insert(out.end(), row, row + pl.row_bytes);
        const uint8_t* m = page + pl.meta_offset + (slot % spec.block_size) * meta;
        out.insert(out.end(), m, m + meta);
      }
      return out;
    };
    const auto snapshot = [&] {
      std::vector<std::vector<uint8_t>> all;
      for (int l = 0; l < spec.n_layers; ++l)
        for (int part = 0; part < 2; ++part)
          for (int s = 0; s < n; ++s) all.push_back(token_bytes(l, part, s));
      return all;
    };
    const auto before = snapshot();
    // A kept path's moves, in order: a chain where a move reads what the one before wrote
    // (6 -> 5, then 7 -> 6, then 9 -> 7, across a page), then 13 -> 12 within a page.
    const KvTokenMove moves[] = {{6, 5, false}, {7, 6, false}, {9, 7, false}, {13, 12, false}};
    move_kv_tokens(kv, moves);
    const auto after = snapshot();
    std::vector<int> from(n);  // the slot whose bytes each slot holds after the moves in order
    std::iota(from.begin(), from.end(), 0);
    for (const KvTokenMove& m : moves) from[m.dst] = from[m.src];
    for (int l = 0; l < spec.n_layers; ++l)
      for (int part = 0; part < 2; ++part)
        for (int s = 0; s < n; ++s) {
          const size_t at = (size_t(l) * 2 + part) * n;
          EXPECT_EQ(after[at + s], before[at + from[s]]) << name << " layer " << l << " part " << part << " slot " << s;
        }
  }
  KvCacheSpec kivi;
  kivi.n_layers = 1;
  kivi.n_kv_heads = 1;
  kivi.head_dim = 64;
  kivi.block_size = 4;
  kivi.n_blocks = 2;
  kivi.k_format = parse_kv_format("int4", true);
  kivi.v_format = parse_kv_format("int4", false);
  EXPECT_FALSE(kv_token_moves_supported(kivi));
  KvCache kv(*backend, kivi);
  const KvTokenMove move[] = {{5, 1, false}};
  EXPECT_THROW(move_kv_tokens(kv, move), Error);
  const KvTokenMove none[] = {{5, 8, false}};
  kivi.k_format = kivi.v_format = kv_format_of(DType::F16);
  KvCache plain(*backend, kivi);
  EXPECT_THROW(move_kv_tokens(plain, none), Error);  // slot 8 outside 2 blocks of 4
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
