#pragma once
// Internal state shared by the GGUF (llama.cpp rules) and tokenizer.json (Hugging Face rules)
// front ends. Not part of the public API.
#include <algorithm>
#include <iterator>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

// llama.cpp's clean_up_tokenization_spaces: drops the space before ?!., and before some
// apostrophe contractions (vocabularies with clean_spaces only).
void clean_up_spaces(std::string& s);

// Finds which of a set of strings occur in a text, in one pass (Aho-Corasick, sparse trie).
class MultiStringFinder {
 public:
  void build(const std::vector<std::string_view>& needles);
  // present[i] is set when needles[i] occurs somewhere in `text`.
  std::vector<bool> present(std::string_view text) const;
  // Longest needle that starts at text[pos] (index into needles), or -1.
  int longest_at(std::string_view text, size_t pos) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
    int32_t fail = 0;
    int32_t dict = -1;    // nearest node on the fail chain that ends a needle
    int32_t needle = -1;  // needle ending here
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_;
};

// A piece of text to tokenize, or a token already decided (special-token partition).
struct Fragment {
  int32_t token = -1;  // >= 0: a token
  size_t offset = 0, length = 0;
};

// Where control (and unknown) tokens may be read from text: nowhere, everywhere, or only in
// byte spans [begin, end) (sorted, disjoint: the text a chat template wrote itself).
struct SpecialPolicy {
  bool parse_special = false;
  std::span<const std::pair<size_t, size_t>> spans;  // used when `gated`
  bool gated = false;
  // Whether a control token spelled at [begin, end) counts as that token.
  bool allows(size_t begin, size_t end) const {
    if (!parse_special) return false;
    if (!gated) return true;
    // The last span starting at or before `begin` must reach `end`.
    auto it = std::upper_bound(spans.begin(), spans.end(), begin,
                               [](size_t b, const std::pair<size_t, size_t>& s) { return b < s.first; });
    return it != spans.begin() && std::prev(it)->second >= end;
  }
};

// Hugging Face pre-tokenizer steps (see hf_json.cpp).
struct HfPreStep {
  enum class Kind { Split, ByteLevel, Digits } kind = Kind::Split;
  enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext, Contiguous };
  std::unique_ptr<PcreRegex> regex;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel
  bool use_regex = true;          // ByteLevel
};

struct Tokenizer::Impl {
  enum class Kind { LlamaBpe, LlamaSpm, HfBpe } kind = Kind::LlamaBpe;

  std::vector<std::string> text;  // id -> vocabulary text
  std::vector<float> score;
  std::vector<uint32_t> attr;
  std::unordered_map<std::string, int32_t> to_id;
  std::unordered_map<std::string, int32_t> merge_rank;  // merge_key(left, right) -> rank
  // The same merges keyed by token ids, for the (usual) case where both sides are tokens:
  // (left_id << 32 | right_id) -> {rank, id of the merged text or -1}.
  struct PairMerge {
    int32_t rank, merged;
  };
  std::unordered_map<uint64_t, PairMerge> pair_merge;
  size_t max_token_len = 0;

  int32_t bos = -1, eos = -1, eot = -1, eom = -1, unk = -1, sep = -1, pad = -1, mask = -1;
  int32_t fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1, fim_rep = -1, fim_sep = -1;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
  bool ignore_merges = false, clean_spaces = false;
  std::set<int32_t> eog;
  std::string chat_template;

  // Tokens matched before pre-tokenization, longest first (llama.cpp's order).
  std::vector<int32_t> special_order;
  MultiStringFinder special_finder;  // over special_order's texts
  std::vector<std::string> piece;    // token_to_piece(special = true)

  std::unique_ptr<LlamaSplitter> splitter;  // LlamaBpe

  // HfBpe
  std::vector<HfPreStep> hf_steps;
  std::vector<int32_t> hf_prefix, hf_suffix;  // added around the ids when add_special
  bool hf_byte_fallback = false;
  std::vector<int32_t> hf_added_plain;       // normalized=false added tokens, matched first
  std::vector<int32_t> hf_added_normalized;  // normalized=true ones, matched in what is left
  MultiStringFinder hf_plain_finder, hf_normalized_finder;

  static std::string merge_key(std::string_view left, std::string_view right);
  void index_merges_by_id();  // fills pair_merge from merge_rank
  int32_t find(std::string_view s) const {
    auto it = to_id.find(std::string(s));
    return it == to_id.end() ? -1 : it->second;
  }
  bool valid(int32_t id) const { return id >= 0 && static_cast<size_t>(id) < text.size(); }

  // Shared pieces of the pipeline (tokenizer.cpp).
  void finish_special_tokens();  // special_order, special_finder, piece cache
  std::vector<Fragment> partition_llama(std::string_view input, const SpecialPolicy& policy) const;
  std::vector<int32_t> encode_impl(std::string_view input, bool add_special, const SpecialPolicy& policy) const;
  void bpe_word(std::string_view word, std::vector<int32_t>& out) const;
  void spm_fragment(std::string_view text, std::vector<int32_t>& out) const;
  std::string piece_of(int32_t id, bool special) const;

  // Hugging Face front end (hf_json.cpp).
  std::vector<int32_t> encode_hf(std::string_view text, bool add_special, SpecialPolicy policy) const;
  std::vector<std::string> hf_pre_tokenize(std::string_view text) const;
};

}  // namespace tessera
