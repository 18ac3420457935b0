#pragma once
// How the decode attention kernels split each sequence's keys over the GPU (host only, no CUDA
// runtime): the grid is base_blocks × splits blocks. Every kernel aims at a number of blocks
// per SM (split_to_target); the fragment-decoding kernel (quantized KV pages), of which an SM
// holds resident_per_sm at once (its occupancy), also looks at waves (choose_decode_split).
//
// Its two regimes, both measured (docs/benchmarks/kv-quant-gpu.md, "Splits by waves"):
// - Few blocks (one sequence at 32k: 8 per split): splits until the grid reaches
//   target_per_sm blocks per SM, as before. Filling every resident slot instead (47 splits
//   of 704 keys against 32 of 1,024) measured 10 % slower: past two blocks an SM gains
//   nothing and each split adds its fixed cost.
// - When that grid is more than one wave of resident blocks, the count of splits whose waves
//   × (keys per split + a block's fixed cost) is least: 32 or 64 sequences × 8 KV heads on
//   132 SMs × 3 blocks took 1.29 waves (the last one 29 % full) with one or two splits; three
//   splits make 1.94 or 3.88 waves (whole-model decode at 32 × 8k on an H100: 3-18 % faster).
namespace tessera::cuda {

struct DecodeSplitChoice {
  int split_len = 0;  // keys per split, a multiple of align_keys, at least min_split_keys
  int splits = 1;     // splits of a max_len context: ceil(max_len / split_len)
};

// Splits that give the grid about target_per_sm blocks per SM (one split at least). max_len:
// keys the block tables describe.
DecodeSplitChoice split_to_target(int base_blocks, int sms, int target_per_sm, int max_len, int min_split_keys,
                                  int align_keys);
// split_to_target's splits while that grid fits one wave of resident blocks, else the count
// whose waves × (keys per split + fixed_keys) is least; fixed_keys: a block's cost outside its
// keys (query load, pipeline fill, the warps' merge, the split's partials) in key units.
DecodeSplitChoice choose_decode_split(int base_blocks, int sms, int target_per_sm, int resident_per_sm, int max_len,
                                      int min_split_keys, int align_keys, int fixed_keys);

}  // namespace tessera::cuda
