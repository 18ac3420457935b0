#pragma once
// Text <-> token ids, exactly as llama.cpp does it for GGUF vocabularies (byte-level BPE with
// the pre-tokenizers of tokenizer.ggml.pre, and SentencePiece-style "llama" vocabularies), and
// as Hugging Face `tokenizers` does it for byte-level BPE tokenizer.json files.
// The contract, with every deliberate difference, is in docs/design/tokenizer.md.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera {

class GGUFFile;

// Per-token attributes, llama.cpp's bit values (llama_token_attr).
enum TokenAttr : uint32_t {
  kAttrUndefined = 0,
  kAttrUnknown = 1u << 0,
  kAttrUnused = 1u << 1,
  kAttrNormal = 1u << 2,
  kAttrControl = 1u << 3,
  kAttrUserDefined = 1u << 4,
  kAttrByte = 1u << 5,
  kAttrNormalized = 1u << 6,
  kAttrLstrip = 1u << 7,
  kAttrRstrip = 1u << 8,
  kAttrSingleWord = 1u << 9,
};

// A vocabulary as a GGUF file describes it (the `tokenizer.*` keys), before llama.cpp's
// defaults and fix-ups are applied. from_gguf fills one; tests build small ones by hand.
struct VocabSpec {
  std::string model;                 // tokenizer.ggml.model: "gpt2" (BPE) or "llama" (SPM)
  std::string pre;                   // tokenizer.ggml.pre; empty means "default"
  std::vector<std::string> tokens;   // tokenizer.ggml.tokens
  std::vector<float> scores;         // tokenizer.ggml.scores (empty: all 0)
  std::vector<int32_t> token_types;  // tokenizer.ggml.token_type, GGUF values 1..6 (empty: normal)
  std::vector<std::string> merges;   // tokenizer.ggml.merges, "left right"
  // Special token ids by GGUF key suffix: "bos", "eos", "eot", "eom", "unknown", "seperator",
  // "padding", "mask", "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep",
  // "prefix", "suffix", "middle" (for tokenizer.ggml.<name>_token_id).
  std::map<std::string, int64_t> special_ids;
  std::optional<bool> add_bos, add_eos, add_space_prefix;
  std::string chat_template;  // tokenizer.chat_template
  std::string model_name;     // general.name (llama.cpp keys a few attributes on it)
  std::string architecture;   // general.architecture
};

class Tokenizer {
 public:
  // Reads the vocabulary of a GGUF model. Throws tessera::Error naming the key on a missing or
  // malformed entry, an unsupported tokenizer model, or an unknown pre-tokenizer.
  static std::unique_ptr<Tokenizer> from_gguf(const GGUFFile& file);
  static std::unique_ptr<Tokenizer> from_spec(const VocabSpec& spec);
  // Reads a Hugging Face tokenizer.json (byte-level BPE) and, when present beside it,
  // tokenizer_config.json (bos/eos tokens, add_bos_token, add_eos_token, chat_template).
  static std::unique_ptr<Tokenizer> from_hf_json(const std::string& tokenizer_json_path);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // add_special: add BOS/EOS as the vocabulary says (add_bos()/add_eos()).
  // parse_special: text that spells a control token becomes that token. With false (user
  // text), control tokens stay plain text; user-defined tokens are still matched, as in
  // llama.cpp. Input that is not valid UTF-8 is accepted (see the design doc).
  std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;
  // Chat prompts: a control or unknown token is read only where its spelling lies wholly inside
  // one of `special_spans` (byte ranges [begin, end) of `text`, sorted and disjoint: what the
  // chat template wrote itself); elsewhere it is plain text, as with parse_special = false.
  // Throws tessera::Error on spans out of order or past the text.
  std::vector<int32_t> encode_with_special_spans(std::string_view text, bool add_special,
                                                 std::span<const std::pair<size_t, size_t>> special_spans) const;
  // Concatenated pieces; with skip_special, control and unknown tokens contribute nothing
  // (llama.cpp's detokenize with unparse_special = !skip_special). Throws on an id outside
  // [0, vocab_size()).
  std::string decode(std::span<const int32_t> ids, bool skip_special) const;
  // The raw bytes of one token as llama.cpp's token_to_piece(special = true) gives them:
  // byte-level BPE decoded to bytes, SPM "▁" to space, <0xXX> to its byte. May be a partial
  // UTF-8 sequence. Throws on an id outside the vocabulary.
  std::string_view token_piece(int32_t id) const;

  int32_t vocab_size() const;
  int32_t bos_id() const;  // -1 when the vocabulary has none
  int32_t eos_id() const;  // -1 when the vocabulary has none
  bool add_bos() const;
  bool add_eos() const;
  // Whether decode drops the leading space SentencePiece put in front of the text.
  bool add_space_prefix() const;
  // End of generation: EOS, EOT, EOM and the tokens llama.cpp recognises by text
  // (<|im_end|>, <end_of_turn>, <|endoftext|>, ...). False for ids outside the vocabulary.
  bool is_eog(int32_t id) const;
  // Control, user-defined or unknown token: the tokens matched as whole units before
  // pre-tokenization (control ones only with parse_special). False outside the vocabulary.
  bool is_special(int32_t id) const;
  bool is_control(int32_t id) const;
  uint32_t token_attr(int32_t id) const;                          // TokenAttr bits; throws outside the vocabulary
  std::optional<int32_t> token_id(std::string_view piece) const;  // exact vocabulary text
  std::string_view token_text(int32_t id) const;                  // vocabulary text (e.g. "Ġthe", "▁the")
  std::string_view chat_template() const;
  bool is_spm() const;  // SentencePiece vocabulary (leading-space rule applies)
  // Whether decode applies llama.cpp's clean-up of spaces before punctuation (most "gpt2"
  // pre-tokenizers; not SmolLM2, Qwen2, SPM).
  bool clean_spaces() const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
