#pragma once
// Token masks over logits (structured output): one bit per token, 32 tokens a word (bit
// t % 32 of word t / 32), 1 = allowed; XGrammar's layout, so a matcher fills it directly.
// Shared by the grammar (which fills masks) and the backends (which apply them). The host
// form of Backend::apply_token_bitmask; the engine also uses it on rows that stay on
// the host (docs/design/structured-output.md, "Where the mask is applied").
#include <cstdint>
#include <span>

namespace tessera {

// Words of a mask over n_vocab tokens.
constexpr int32_t token_bitmask_words(int32_t n_vocab) { return (n_vocab + 31) / 32; }

inline bool token_bitmask_allows(std::span<const int32_t> mask, int32_t token) {
  return (static_cast<uint32_t>(mask[static_cast<size_t>(token) / 32]) >> (token % 32)) & 1u;
}

// Sets every logit whose token the mask forbids to -inf.     logits: [n]; mask: [>= (n + 31) / 32]
void apply_token_bitmask(std::span<float> logits, std::span<const int32_t> mask);

}  // namespace tessera
