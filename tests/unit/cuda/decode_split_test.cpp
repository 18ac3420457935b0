// The fragment-decoding attention's split choice (decode_split.h): host arithmetic, no GPU.
#include "backend/cuda/decode_split.h"

#include <gtest/gtest.h>

namespace tessera::cuda {
namespace {

int waves(int blocks, int slots) { return (blocks + slots - 1) / slots; }

// The H100/H200 shape: 132 SMs, a target of 2 blocks per SM, 3 resident.
DecodeSplitChoice hopper(int base_blocks, int max_len) {
  return choose_decode_split(base_blocks, 132, 2, 3, max_len, 256, 64, 128);
}

TEST(DecodeSplit, ManySequencesSplitSoTheLastWaveIsNotMostlyEmpty) {
  // 64 sequences × 8 KV heads: one split is 1.3 waves of 396 resident blocks (the second 29 %
  // full); three splits of 2,752 keys are 3.9 waves of a third of the keys.
  const DecodeSplitChoice c = hopper(512, 8192);
  EXPECT_EQ(c.splits, 3);
  EXPECT_EQ(c.split_len, 2752);
  EXPECT_GE(c.split_len * c.splits, 8192);
  EXPECT_EQ(waves(512 * c.splits, 396), 4);
  // 32 sequences: the 2-per-SM target's two splits (512 blocks) are 1.29 waves too; three
  // splits are 1.94.
  const DecodeSplitChoice half = hopper(256, 8192);
  EXPECT_EQ(half.splits, 3);
  EXPECT_EQ(waves(256 * half.splits, 396), 2);
}

TEST(DecodeSplit, AlmostTwoFullWavesStayOneSplit) {
  // 512 blocks on 264 resident slots is 1.94 waves: splitting only adds waves.
  const DecodeSplitChoice c = choose_decode_split(512, 132, 2, 2, 8192, 256, 64, 128);
  EXPECT_EQ(c.splits, 1);
  EXPECT_EQ(c.split_len, 8192);
}

TEST(DecodeSplit, FewBlocksSplitToTheTargetPerSmNotToEverySlot) {
  // One sequence (8 blocks) at 32k: 32 splits of 1,024 keys (2 blocks per SM), not the 47 of
  // 704 that would fill all three resident slots (measured 10 % slower).
  const DecodeSplitChoice c = hopper(8, 32768);
  EXPECT_EQ(c.splits, 32);
  EXPECT_EQ(c.split_len, 1024);
  EXPECT_LE(8 * c.splits, 2 * 132);
}

TEST(DecodeSplit, ShortContextsKeepTheMinimumSplit) {
  const DecodeSplitChoice c = hopper(8, 300);
  EXPECT_EQ(c.split_len, 256);
  EXPECT_EQ(c.splits, 2);
  const DecodeSplitChoice one = hopper(8, 100);
  EXPECT_EQ(one.split_len, 256);
  EXPECT_EQ(one.splits, 1);
}

TEST(DecodeSplit, EverySplitHoldsKeysAndCoversTheContext) {
  for (const int base : {1, 8, 24, 96, 256, 512, 1024, 4096})
    for (const int len : {64, 256, 1000, 4096, 8192, 32768, 131072}) {
      const DecodeSplitChoice c = hopper(base, len);
      EXPECT_EQ(c.split_len % 64, 0) << base << " " << len;
      EXPECT_GE(c.split_len, 256) << base << " " << len;
      EXPECT_GE(int64_t(c.split_len) * c.splits, len) << base << " " << len;
      EXPECT_LT(int64_t(c.split_len) * (c.splits - 1), len) << base << " " << len;  // no empty split
    }
}

TEST(DecodeSplit, TheOtherKernelsSplitToTheirTargetPerSm) {
  // The SIMT kernel (4 blocks per SM, 64-key splits) and the f16 tensor-core kernel (2, 256):
  // one sequence at 32k; 512 blocks already past the target keep one split.
  const DecodeSplitChoice simt = split_to_target(8, 132, 4, 32768, 64, 64);
  EXPECT_EQ(simt.split_len, 512);  // ceil(32768 / 66) = 497, rounded up to 64
  EXPECT_EQ(simt.splits, 64);
  const DecodeSplitChoice mma = split_to_target(8, 132, 2, 32768, 256, 64);
  EXPECT_EQ(mma.split_len, 1024);
  EXPECT_EQ(mma.splits, 32);
  const DecodeSplitChoice many = split_to_target(512, 132, 2, 8192, 256, 64);
  EXPECT_EQ(many.splits, 1);
  EXPECT_EQ(many.split_len, 8192);
}

TEST(DecodeSplit, DegenerateInputsGiveOneValidSplit) {
  const DecodeSplitChoice c = choose_decode_split(0, 0, 0, 0, 0, 0, 0, 0);
  EXPECT_EQ(c.splits, 1);
  EXPECT_GE(c.split_len, 1);
}

}  // namespace
}  // namespace tessera::cuda
