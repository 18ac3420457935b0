#pragma once
// Prompt text with an exact token count for the target model, cut from a corpus of real text.
// Token counts come from a TokenCounter: the model's own tokenizer (a GGUF or tokenizer.json,
// in process), the server's POST /tokenize, or — when neither is available — an estimate of
// 4 bytes per token that is marked as inexact in the report.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "benchharness/http_client.h"
#include "benchharness/random.h"

namespace tessera {
class Tokenizer;
}

namespace tessera::bench {

class TokenCounter {
 public:
  virtual ~TokenCounter() = default;
  // Tokens of `text` as a prompt's content: special tokens (BOS) not counted.
  virtual int64_t count(std::string_view text) = 0;
  virtual bool exact() const { return true; }
  virtual std::string describe() const = 0;
  // Optional fast path: encode/decode (in-process tokenizers only).
  virtual bool can_decode() const { return false; }
  virtual std::vector<int32_t> encode(std::string_view) { return {}; }
  virtual std::string decode(const std::vector<int32_t>&) { return {}; }
};

// tessera's tokenizer from a model path (GGUF file or a directory with tokenizer.json).
std::unique_ptr<TokenCounter> make_local_token_counter(const std::string& model_path);
// Wraps an existing tokenizer (not owned; must outlive the counter).
std::unique_ptr<TokenCounter> make_tokenizer_counter(const Tokenizer& tokenizer, std::string name);
// POST {prefix}/tokenize {"model", "prompt", "add_special_tokens": false} → {"count"} or
// {"tokens"} (vLLM's shape). The count of "" is measured once and subtracted, so a server
// that adds BOS regardless still gives content counts.
std::unique_ptr<TokenCounter> make_server_token_counter(const Endpoint& endpoint, std::string model,
                                                        std::string api_key);
// ceil(bytes / 4); exact() is false.
std::unique_ptr<TokenCounter> make_estimating_token_counter();

// The text prompts are cut from: a corpus file's text (whitespace runs collapsed to one
// space so any cut reads as prose), or, without a file, a fixed English word list drawn at
// random from the seed.
class TextSource {
 public:
  static TextSource from_file(const std::string& path);
  static TextSource builtin(uint64_t seed);
  explicit TextSource(std::string text);
  const std::string& text() const { return text_; }
  std::string describe() const { return describe_; }
  // A random start at a word boundary.
  size_t random_offset(Rng& rng) const;
  // `length` bytes from `offset`, wrapping around the end (the corpus repeats).
  std::string slice(size_t offset, size_t length) const;

 private:
  std::string text_;
  std::string describe_;
};

// Text whose count() is exactly `tokens`, starting at a random word boundary of `source`.
// Throws when no exact cut is found after several starts (possible only with counters whose
// count jumps by more than one token per byte everywhere).
std::string make_text_with_tokens(const TextSource& source, TokenCounter& counter, int64_t tokens, Rng& rng);

}  // namespace tessera::bench
