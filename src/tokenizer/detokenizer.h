#pragma once
// Streaming decode: token ids in, UTF-8 text out, chunk by chunk. The concatenation of every
// chunk equals sanitize_utf8(tokenizer.decode(ids, skip_special)), and no chunk ever holds
// broken UTF-8: a character split across tokens is held back until it is complete (at most 3
// bytes), and bytes that can never form a character come out as U+FFFD.
// SentencePiece's leading space (add_space_prefix) is dropped from the first token. For
// vocabularies with clean_spaces, the last 4 bytes are also held back because a later token
// can still remove a space among them ("Hello ," -> "Hello,").
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace tessera {

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = true);

  // The text that became complete with `id` (possibly empty). Throws on an id outside the
  // vocabulary.
  std::string push(int32_t id);
  // Everything still held back; trailing bytes that do not form a character become U+FFFD.
  std::string flush();

 private:
  std::string take(bool final);

  const Tokenizer& tok_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;       // without clean_spaces: bytes not yet emitted
  std::string raw_;           // with clean_spaces: every byte so far (clean-up needs context)
  size_t emitted_clean_ = 0;  // with clean_spaces: bytes of the cleaned text already emitted
};

}  // namespace tessera
