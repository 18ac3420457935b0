#pragma once
// Unicode helpers for the tokenizers: UTF-8 decoding with llama.cpp's tolerance rules, the
// general-category class of a code point (Unicode 15.1, the version llama.cpp's tables use),
// and GPT-2's byte <-> printable-character mapping.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera {

// The major general category of a code point. Undefined is "Cn" (unassigned).
enum class UnicodeClass : uint8_t {
  Undefined = 0,
  Number = 1,
  Letter = 2,
  Separator = 3,
  Mark = 4,
  Punctuation = 5,
  Symbol = 6,
  Control = 7,
};

namespace unicode_detail {
struct UnicodeRange {
  uint32_t start;
  uint8_t cls;  // UnicodeClass
};
extern const UnicodeRange kUnicodeRanges[];
extern const size_t kUnicodeRangeCount;
}  // namespace unicode_detail

inline constexpr uint32_t kReplacementChar = 0xFFFD;
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// Class of `cp`; code points above U+10FFFF are Undefined.
UnicodeClass unicode_class(uint32_t cp);
// The White_Space property as llama.cpp defines it: \t..\r, space, U+0085, U+00A0, U+1680,
// U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool unicode_is_whitespace(uint32_t cp);

// Byte length announced by a UTF-8 lead byte (continuation and invalid bytes count 1, F8..FF 4),
// the rule llama.cpp uses to cut text into symbols.
inline size_t utf8_len_from_lead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Decodes one code point at `text[pos]` like llama.cpp: overlong forms and surrogates are
// accepted as written; a bad lead byte, a missing or wrong continuation byte, or a value above
// U+10FFFF yields U+FFFD for the single byte at `pos`. Advances `pos`.
uint32_t decode_utf8_lenient(std::string_view text, size_t& pos);
std::vector<uint32_t> decode_utf8_lenient(std::string_view text);
// Appends the UTF-8 form of `cp` (surrogates are written as three bytes, like llama.cpp).
void append_utf8(std::string& out, uint32_t cp);

// Strict validation: true when `text` is well-formed UTF-8 (no overlongs, no surrogates).
bool is_valid_utf8(std::string_view text);
// Number of bytes at the end of `text` that start a well-formed UTF-8 sequence not yet
// complete (0..3). Used to hold back a partial character while streaming.
size_t incomplete_utf8_suffix(std::string_view text);
// Replaces every ill-formed subsequence by U+FFFD (maximal-subpart rule, like Python's
// errors="replace").
std::string sanitize_utf8(std::string_view text);

// GPT-2 byte-level alphabet: every byte maps to one printable code point.
uint32_t byte_to_unicode(uint8_t byte);
// Inverse of byte_to_unicode; -1 when `cp` is not in the alphabet.
int unicode_to_byte(uint32_t cp);

}  // namespace tessera
