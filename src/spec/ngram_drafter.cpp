#include "spec/ngram_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace tessera {

NgramDrafter::NgramDrafter(NgramDrafterConfig config) : config_(config) {
  TESSERA_CHECK(config.prompt_lookup_min >= 1 && config.prompt_lookup_max >= config.prompt_lookup_min,
                "ngram drafter: prompt_lookup_min ", config.prompt_lookup_min, " and prompt_lookup_max ",
                config.prompt_lookup_max, " must satisfy 1 <= min <= max");
}

void NgramDrafter::propose_one(std::span<const int32_t> tokens, int max_tokens, std::vector<int32_t>& out) const {
  out.clear();
  const int64_t len = static_cast<int64_t>(tokens.size());
  if (max_tokens <= 0) return;
  for (int n = std::min<int64_t>(config_.prompt_lookup_max, len - 1); n >= config_.prompt_lookup_min; --n) {
    const auto suffix = tokens.subspan(static_cast<size_t>(len - n));
    // Most recent earlier occurrence first: start positions len - n - 1 down to 0. A match
    // must be followed by at least one token, which it is, since it starts before len - n.
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      const int64_t from = start + n;
      const int64_t count = std::min<int64_t>(max_tokens, len - from);
      out.assign(tokens.begin() + from, tokens.begin() + from + count);
      return;
    }
  }
}

void NgramDrafter::propose(std::span<const DraftQuery> queries, std::span<Draft> out) {
  TESSERA_CHECK(queries.size() == out.size(), "ngram drafter: ", queries.size(), " queries but ", out.size(),
                " outputs");
  for (size_t i = 0; i < queries.size(); ++i) {
    out[i].clear();
    propose_one(queries[i].tokens, queries[i].max_tokens, out[i].tokens);
  }
}

}  // namespace tessera
