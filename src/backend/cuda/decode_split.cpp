#include "backend/cuda/decode_split.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace tessera::cuda {

namespace {

// Splits of about max_len / want keys (a multiple of align_keys, at least min_split_keys).
DecodeSplitChoice split_for(int max_len, int want, int min_split_keys, int align_keys) {
  align_keys = std::max(1, align_keys);
  max_len = std::max(1, max_len);
  const int min_len = std::max(align_keys, (std::max(1, min_split_keys) + align_keys - 1) / align_keys * align_keys);
  const int len = std::max(min_len, ((max_len + want - 1) / want + align_keys - 1) / align_keys * align_keys);
  return {len, (max_len + len - 1) / len};
}

}  // namespace

DecodeSplitChoice split_to_target(int base_blocks, int sms, int target_per_sm, int max_len, int min_split_keys,
                                  int align_keys) {
  const int64_t want =
      (static_cast<int64_t>(std::max(1, target_per_sm)) * std::max(1, sms) + std::max(1, base_blocks) - 1) /
      std::max(1, base_blocks);
  return split_for(max_len, static_cast<int>(std::max<int64_t>(1, want)), min_split_keys, align_keys);
}

DecodeSplitChoice choose_decode_split(int base_blocks, int sms, int target_per_sm, int resident_per_sm, int max_len,
                                      int min_split_keys, int align_keys, int fixed_keys) {
  base_blocks = std::max(1, base_blocks);
  const int64_t slots = static_cast<int64_t>(std::max(1, resident_per_sm)) * std::max(1, sms);
  const DecodeSplitChoice target =
      split_to_target(base_blocks, sms, target_per_sm, max_len, min_split_keys, align_keys);
  if (static_cast<int64_t>(base_blocks) * target.splits <= slots) return target;  // one wave
  DecodeSplitChoice best = split_for(max_len, 1, min_split_keys, align_keys);
  int64_t best_cost = std::numeric_limits<int64_t>::max();
  // More splits than fill every slot four times over only add waves; nor more than splits of
  // the shortest length.
  const int most = std::max(1, std::min<int>(split_for(max_len, max_len, min_split_keys, align_keys).splits,
                                             static_cast<int>((slots + base_blocks - 1) / base_blocks * 4)));
  for (int want = 1; want <= most; ++want) {
    const DecodeSplitChoice c = split_for(max_len, want, min_split_keys, align_keys);
    const int64_t waves = (static_cast<int64_t>(base_blocks) * c.splits + slots - 1) / slots;
    const int64_t cost = waves * (c.split_len + fixed_keys);
    if (cost < best_cost) {  // ties keep fewer splits (less to merge)
      best_cost = cost;
      best = c;
    }
  }
  return best;
}

}  // namespace tessera::cuda
