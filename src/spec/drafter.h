#pragma once
// Drafters propose the tokens a speculative step verifies. One interface for every kind:
// prompt lookup (ngram_drafter.h, no model), a draft model with its own paged KV and
// early-exit self-speculation over the target's first layers (engine/model_drafter.h), and
// later learned heads (Medusa/EAGLE). Contract: docs/design/spec-decode.md.
//
// The engine calls propose() once per step for every running sequence in decode state that
// speculates, all of them in one call (a model drafter runs them as one batch). The tokens
// it passes are the truth (prompt + verified output): a drafter with per-sequence state
// (a draft model's KV) rolls back to the longest prefix it shares with them, so rejected
// draft positions are undone by the next call, not by a separate message.
#include <cstdint>
#include <span>
#include <vector>

#include "sample/sampling_params.h"
#include "spec/verify.h"  // SparseDistribution

namespace tessera {

using DraftSeqId = uint64_t;  // the engine's sequence id

struct DraftQuery {
  DraftSeqId seq = 0;
  std::span<const int32_t> tokens;  // prompt + output so far; the last one is not yet in the target's KV
  int max_tokens = 0;               // propose at most this many (k for this sequence, this step)
  // The sequence's sampling (its seed already per choice) and prompt length: a sampling
  // drafter draws from its distribution after the same processing (bias, penalties over the
  // output tokens[n_prompt..], temperature, top-k/p, min-p), so drafts are kept more often.
  // nullptr: draft greedily.
  const SamplingParams* sampling = nullptr;
  int n_prompt = 0;
  // Whether a tree of several candidates may come back (else a chain): the engine allows it
  // where the backend, KV format and request can verify one (no grammar, no logprobs).
  bool allow_tree = false;
  // The target's KV of this sequence, for a drafter that runs over the target's own cache
  // (early exit, drafts_over_target_kv()): the tokens[0..target_kv_tokens) it holds and the
  // blocks that hold them (its block table, and the local layers' table when the cache has a
  // local group; kDropped entries are behind the window). Read-only. What the drafter may
  // write instead: scratch blocks the engine took from its free pool for this call
  // (draft_scratch_blocks() of each pool, or none when the pool was short) and frees after it.
  int target_kv_tokens = 0;
  std::span<const int32_t> target_blocks = {};
  std::span<const int32_t> target_local_blocks = {};
  std::span<const int32_t> scratch_blocks = {};
  std::span<const int32_t> local_scratch_blocks = {};
};

// The scratch blocks a drafter over the target's cache writes for a sequence whose KV holds
// kv_tokens of its n_tokens tokens, drafting max_tokens: from the target's last full block
// up to the last draft token it feeds (every one but the last), n_tokens + max_tokens - 1.
inline int draft_scratch_blocks(int kv_tokens, int n_tokens, int max_tokens, int block_size) {
  return (n_tokens + max_tokens - 1 + block_size - 1) / block_size - kv_tokens / block_size;
}

struct Draft {
  // The proposed tokens: a chain (parents empty: tokens[j] follows tokens[j - 1]) or a tree.
  std::vector<int32_t> tokens;
  // A tree of candidates (several continuations, verified in one forward under a tree
  // attention mask): parents[j] is the index of the node tokens[j] follows, -1 for the
  // sequence's last verified token; parents[j] < j, so every prefix of the nodes is a tree
  // too (the engine may cut a draft to a prefix). Siblings hold distinct tokens. Nodes
  // 0..c-1 with parents[j] == j - 1 are the main chain (the most likely continuation): when
  // it is what verification keeps, its KV is already where it belongs. Empty: a chain.
  // Only point-mass drafts (probs empty) may be trees; at most kMaxDraftTreeNodes nodes.
  std::vector<int16_t> parents;
  // q_j for each token, or empty when every token is a point mass (a deterministic drafter).
  // A sampling drafter must return the distribution each token was drawn from: verification
  // is exact only against the q that produced the token.
  std::vector<SparseDistribution> probs;
  bool is_tree() const { return !parents.empty(); }
  void clear() {
    tokens.clear();
    parents.clear();
    probs.clear();
  }
};

// The most nodes a draft tree may have: a row's tree mask is one 32-bit word over the
// sequence's query rows (its last verified token and the nodes).
inline constexpr int kMaxDraftTreeNodes = 31;

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual const char* name() const = 0;
  // out[i] receives the proposal for queries[i] (possibly empty: nothing worth verifying).
  virtual void propose(std::span<const DraftQuery> queries, std::span<Draft> out) = 0;
  // The sequence ended: drop its state. Stateless drafters ignore it.
  virtual void remove(DraftSeqId seq) {}
  // True when a proposal costs next to nothing beside a forward step and leaves no state
  // (prompt lookup): the adaptive plan then asks for k_max first and plans on the drafts
  // that came back, cutting each to a prefix.
  virtual bool proposes_for_free() const { return false; }
  // True when it runs over the target's cache (early exit): the engine then fills each
  // query's target KV and scratch blocks.
  virtual bool drafts_over_target_kv() const { return false; }
};

}  // namespace tessera
