#pragma once
// Pre-tokenization: cutting text into words before BPE merges.
//
// LlamaSplitter reproduces llama.cpp's unicode_regex_split for a list of regexes: each regex in
// turn re-splits the pieces left by the previous one, and the unmatched stretches stay pieces of
// their own. The GPT-2, Llama-3, Qwen2 and Qwen3.5 expressions run through hand-written
// matchers with llama.cpp's exact behaviour; any other expression runs through PCRE2 the way
// llama.cpp runs it through std::regex (categories collapsed to one byte per code point, or
// code points with non-ASCII whitespace folded to \v).
//
// PcreRegex is a small PCRE2 wrapper (UTF + UCP, JIT when available) used for Hugging Face
// tokenizer.json patterns.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera {

class PcreRegex {
 public:
  enum class Mode {
    Unicode,       // UTF-8 subject; \p{..}, \s, \w follow Unicode (PCRE2_UTF | PCRE2_UCP)
    UnicodeAscii,  // UTF-8 subject; \s, \d, \w are ASCII-only (std::wregex-like)
    Bytes,         // one byte per character, no UTF
  };
  PcreRegex(std::string_view pattern, Mode mode);
  ~PcreRegex();
  PcreRegex(const PcreRegex&) = delete;
  PcreRegex& operator=(const PcreRegex&) = delete;

  // Every non-overlapping match in subject[begin, end), left to right, as byte ranges.
  // Empty matches are skipped.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view subject, size_t begin, size_t end) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string pattern_;
};

class LlamaSplitter {
 public:
  explicit LlamaSplitter(std::vector<std::string> regexes);
  ~LlamaSplitter();

  // Splits `text` (any bytes; ill-formed UTF-8 becomes U+FFFD per bad byte) into words. With
  // `byte_encode`, each word's UTF-8 bytes are mapped through the GPT-2 byte alphabet.
  std::vector<std::string> split(std::string_view text, bool byte_encode) const;
  // Word lengths in code points, for tests: the same cuts without building strings.
  std::vector<size_t> split_lengths(const std::vector<uint32_t>& cps) const;

 private:
  struct Step;
  std::vector<std::unique_ptr<Step>> steps_;
  bool need_collapse_ = false;
};

// The regex list llama.cpp uses for `tokenizer.ggml.pre` == `pre` (BPE vocabularies), with
// llama.cpp's per-pre-tokenizer flags. Throws tessera::Error for a name tessera does not know.
struct LlamaPreTokenizerInfo {
  std::vector<std::string> regexes;
  bool ignore_merges = false;  // a word that is a whole token skips the merges
  bool clean_spaces = true;    // decode removes the space before ?!., and some contractions
  bool add_bos = false;        // default for add_bos_token when the file does not say
};
LlamaPreTokenizerInfo llama_pre_tokenizer(std::string_view pre);
// The names llama_pre_tokenizer accepts.
std::vector<std::string> llama_pre_tokenizer_names();

}  // namespace tessera
