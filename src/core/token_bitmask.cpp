#include "core/token_bitmask.h"

#include <algorithm>
#include <limits>

#include "core/error.h"

namespace tessera {

void apply_token_bitmask(std::span<float> logits, std::span<const int32_t> mask) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const size_t n = logits.size();
  TESSERA_CHECK(mask.size() * 32 >= n, "token mask: ", mask.size(), " words for ", n, " logits");
  const size_t n_words = (n + 31) / 32;
  size_t w = 0;
  while (w < n_words) {
    const auto bits = static_cast<uint32_t>(mask[w]);
    if (bits == 0xffffffffu) {  // typical of free text: nothing to clear
      ++w;
      continue;
    }
    if (bits == 0) {
      // Typical of a constrained position: long runs of words allow nothing. One fill per run
      // (a 128k-token row is mostly one run) instead of one per word: a word-sized fill costs
      // its call, not its 128 bytes.
      size_t end = w + 1;
      while (end < n_words && mask[end] == 0) ++end;
      std::fill(logits.begin() + static_cast<ptrdiff_t>(w * 32),
                logits.begin() + static_cast<ptrdiff_t>(std::min(n, end * 32)), kNegInf);
      w = end;
      continue;
    }
    const size_t last = std::min(n, w * 32 + 32);
    for (size_t t = w * 32; t < last; ++t)
      if (!((bits >> (t - w * 32)) & 1u)) logits[t] = kNegInf;
    ++w;
  }
}

}  // namespace tessera
