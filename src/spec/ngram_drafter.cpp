#include "spec/ngram_drafter.h"

#include <algorithm>

#include "core/draft_tree.h"
#include "core/error.h"

namespace tessera {

namespace {

// Calls on_match(from) for each earlier occurrence of the last n tokens, n from hi down to lo
// and, for each n, the most recent occurrence first; `from` is where the tokens after it start.
// A match starts before len - n, so from < len: at least one token follows. Stops once
// on_match returns true.
template <class OnMatch>
void scan_matches(std::span<const int32_t> tokens, int lo, int hi, OnMatch&& on_match) {
  const int64_t len = static_cast<int64_t>(tokens.size());
  for (int64_t n = std::min<int64_t>(hi, len - 1); n >= lo; --n) {
    const auto suffix = tokens.subspan(static_cast<size_t>(len - n));
    for (int64_t start = len - n - 1; start >= 0; --start) {
      if (!std::equal(suffix.begin(), suffix.end(), tokens.begin() + start)) continue;
      if (on_match(start + n)) return;
    }
  }
}

}  // namespace

NgramDrafter::NgramDrafter(NgramDrafterConfig config) : config_(config) {
  TESSERA_CHECK(config.prompt_lookup_min >= 1 && config.prompt_lookup_max >= config.prompt_lookup_min,
                "ngram drafter: prompt_lookup_min ", config.prompt_lookup_min, " and prompt_lookup_max ",
                config.prompt_lookup_max, " must satisfy 1 <= min <= max");
  TESSERA_CHECK(config.candidates >= 1, "ngram drafter: candidates = ", config.candidates, " must be >= 1");
}

void NgramDrafter::propose_one(std::span<const int32_t> tokens, int max_tokens, std::vector<int32_t>& out) const {
  out.clear();
  if (max_tokens <= 0) return;
  const int64_t len = static_cast<int64_t>(tokens.size());
  scan_matches(tokens, config_.prompt_lookup_min, config_.prompt_lookup_max, [&](int64_t from) {
    out.assign(tokens.begin() + from, tokens.begin() + from + std::min<int64_t>(max_tokens, len - from));
    return true;
  });
}

void NgramDrafter::propose_tree(std::span<const int32_t> tokens, int max_tokens, Draft& out) const {
  out.clear();
  if (max_tokens <= 0) return;
  const int64_t len = static_cast<int64_t>(tokens.size());
  const size_t cap =
      static_cast<size_t>(std::min<int64_t>(kMaxDraftTreeNodes, int64_t{config_.candidates} * max_tokens));
  int64_t first_from = -1;  // propose_one's match: the chain when nothing else is distinct
  int inserted = 0;         // continuations that added a node
  scan_matches(tokens, config_.prompt_lookup_min, config_.prompt_lookup_max, [&](int64_t from) {
    if (first_from < 0) first_from = from;
    const int64_t count = std::min<int64_t>(max_tokens, len - from);
    int node = -1;
    bool added = false;
    for (int64_t j = 0; j < count; ++j) {
      const int32_t t = tokens[static_cast<size_t>(from + j)];
      // Below a node just added there are no children yet: only the shared prefix is looked up.
      const int child = added ? -1 : draft_tree_child(out.tokens, out.parents, node, t);
      if (child >= 0) {
        node = child;
        continue;
      }
      if (out.tokens.size() == cap) break;  // cut to what fits
      out.tokens.push_back(t);
      out.parents.push_back(static_cast<int16_t>(node));
      node = static_cast<int>(out.tokens.size()) - 1;
      added = true;
    }
    inserted += added ? 1 : 0;
    return inserted == config_.candidates || out.tokens.size() == cap;
  });
  if (inserted <= 1) {
    // One distinct continuation: today's chain, not cut to the tree's node cap.
    out.clear();
    if (first_from >= 0)
      out.tokens.assign(tokens.begin() + first_from,
                        tokens.begin() + first_from + std::min<int64_t>(max_tokens, len - first_from));
    return;
  }
  // Later continuations that only extended the first (it stopped at the text's end) leave a
  // chain: drafted as one, it is not verified as a tree.
  if (is_draft_chain(out.parents)) out.parents.clear();
}

void NgramDrafter::propose(std::span<const DraftQuery> queries, std::span<Draft> out) {
  TESSERA_CHECK(queries.size() == out.size(), "ngram drafter: ", queries.size(), " queries but ", out.size(),
                " outputs");
  for (size_t i = 0; i < queries.size(); ++i) {
    const DraftQuery& q = queries[i];
    if (q.allow_tree && config_.candidates > 1) {
      propose_tree(q.tokens, q.max_tokens, out[i]);
    } else {
      out[i].clear();
      propose_one(q.tokens, q.max_tokens, out[i].tokens);
    }
  }
}

}  // namespace tessera
