#pragma once
// Prompt lookup decoding (Saxena 2023; vLLM's "ngram" method): find the last n tokens of the
// sequence earlier in its prompt + output, and propose the tokens that followed them there.
// n runs from prompt_lookup_max down to prompt_lookup_min; the first n with a match wins, and
// among its matches the most recent one (the continuation most like the current text).
// With candidates > 1 and a query that allows a tree, further matches in the same order add
// their continuations as branches of a trie (Draft::parents), the first one as its main chain:
// text with several continuations of its suffix then keeps more of a draft per step.
// Stateless and deterministic: its drafts are point masses (Draft::probs empty).
#include "spec/drafter.h"

namespace tessera {

struct NgramDrafterConfig {
  int prompt_lookup_min = 2;
  int prompt_lookup_max = 4;
  int candidates = 1;  // distinct continuations in a tree draft; 1 = always a chain
};

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(NgramDrafterConfig config);
  const char* name() const override { return "ngram"; }
  bool proposes_for_free() const override { return true; }
  void propose(std::span<const DraftQuery> queries, std::span<Draft> out) override;

  // One sequence: the continuation of the most recent earlier occurrence of its last n
  // tokens, up to max_tokens; empty when no n in [min, max] matches.
  void propose_one(std::span<const int32_t> tokens, int max_tokens, std::vector<int32_t>& out) const;

  // One sequence, as a tree of up to config.candidates distinct continuations (each cut to
  // max_tokens, at most min(kMaxDraftTreeNodes, candidates * max_tokens) nodes), nodes
  // 0..c-1 being propose_one's chain. When only one continuation is distinct, out is that
  // chain with parents empty; when later ones only extend it, the longer chain, parents empty.
  void propose_tree(std::span<const int32_t> tokens, int max_tokens, Draft& out) const;

 private:
  NgramDrafterConfig config_;
};

}  // namespace tessera
