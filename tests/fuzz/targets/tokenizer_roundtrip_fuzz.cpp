// Tokenizer encode/decode round trips on a byte-level BPE (SmolLM2) and a SentencePiece
// (Gemma 3) vocabulary. The first byte picks the vocabulary and the flags; the rest is text.
//   - encode never throws, for any bytes (invalid UTF-8 is accepted, docs/design/tokenizer.md);
//   - every id it returns is inside the vocabulary;
//   - byte-level BPE, user text (no special parsing, no BOS/EOS), well-formed UTF-8 without the
//     bytes the vocabulary has no byte-level token for (dropped, as llama.cpp drops them;
//     SmolLM2 lacks 0x04, 0x13, 0xF1 and a few more, docs/design/tokenizer.md): decode(encode(s)) == s;
//   - decode of arbitrary in-range ids never throws; out-of-range ids throw tessera::Error.
#include <cstddef>
#include <cstdint>
#include <array>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "fuzz_models.h"
#include "tokenizer/unicode.h"

namespace {
const tessera::fuzz::LoadedTokenizer& bpe() {
  static const tessera::fuzz::LoadedTokenizer t = tessera::fuzz::load_tokenizer(tessera::fuzz::kBpeModel);
  return t;
}
const tessera::fuzz::LoadedTokenizer& spm() {
  static const tessera::fuzz::LoadedTokenizer t = tessera::fuzz::load_tokenizer(tessera::fuzz::kSpmModel);
  return t;
}
// Bytes the byte-level vocabulary has no token for: encode drops them (as llama.cpp does).
// SmolLM2 lacks some ASCII control bytes (0x04, 0x06, ...) and some lead bytes (0xF1, ...).
const std::array<bool, 256>& vanishing_bytes() {
  static const std::array<bool, 256> v = [] {
    std::array<bool, 256> out{};
    for (int b = 0; b < 256; ++b) {
      std::string ch;
      tessera::append_utf8(ch, tessera::byte_to_unicode(static_cast<uint8_t>(b)));
      out[b] = !bpe().tokenizer->token_id(ch).has_value();
    }
    return out;
  }();
  return v;
}

bool round_trip_expected(std::string_view text) {
  if (!tessera::is_valid_utf8(text)) return false;
  for (unsigned char c : text)
    if (vanishing_bytes()[c]) return false;
  return true;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  bpe();
  spm();
  vanishing_bytes();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0 || size > 4096) return 0;  // long texts only slow the run down
  const uint8_t mode = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const bool use_spm = mode & 1;
  const bool add_special = mode & 2;
  const bool parse_special = mode & 4;
  const tessera::Tokenizer& tok = *(use_spm ? spm() : bpe()).tokenizer;
  const int32_t vocab = static_cast<int32_t>(tok.vocab_size());

  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) __builtin_trap();
  const std::string decoded = tok.decode(ids, /*skip_special=*/false);
  if (!use_spm && !add_special && !parse_special && round_trip_expected(text) && decoded != text) __builtin_trap();

  if (mode & 8) {  // the input as raw ids
    std::vector<int32_t> raw;
    for (size_t i = 1; i + 4 <= size; i += 4) {
      uint32_t v;
      std::memcpy(&v, data + i, 4);
      raw.push_back(static_cast<int32_t>(v % static_cast<uint32_t>(vocab)));
    }
    (void)tok.decode(raw, mode & 16);
    raw.push_back(vocab);  // one past the end: must be refused, not read
    try {
      (void)tok.decode(raw, false);
      __builtin_trap();
    } catch (const tessera::Error&) {
    }
  }
  return 0;
}
