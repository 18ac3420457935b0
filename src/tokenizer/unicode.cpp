#include "tokenizer/unicode.h"

#include <array>

namespace tessera {

namespace {

// One byte per code point (1.1 MB), built once from the generated ranges: O(1) lookups keep
// pre-tokenization linear.
const std::vector<uint8_t>& class_table() {
  static const std::vector<uint8_t> table = [] {
    using unicode_detail::kUnicodeRangeCount;
    using unicode_detail::kUnicodeRanges;
    std::vector<uint8_t> t(kMaxCodepoint + 1, 0);
    for (size_t i = 0; i < kUnicodeRangeCount; ++i) {
      const uint32_t end = i + 1 < kUnicodeRangeCount ? kUnicodeRanges[i + 1].start : kMaxCodepoint + 1;
      for (uint32_t cp = kUnicodeRanges[i].start; cp < end; ++cp) t[cp] = kUnicodeRanges[i].cls;
    }
    return t;
  }();
  return table;
}

struct ByteMaps {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 0x144> to_byte{};
};

const ByteMaps& byte_maps() {
  static const ByteMaps maps = [] {
    ByteMaps m;
    m.to_byte.fill(-1);
    std::array<bool, 256> printable{};
    for (int b = 0x21; b <= 0x7E; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t next = 256;  // bytes without a printable glyph get U+0100, U+0101, ... in order
    for (int b = 0; b < 256; ++b) {
      m.to_cp[b] = printable[b] ? static_cast<uint32_t>(b) : next++;
      m.to_byte[m.to_cp[b]] = static_cast<int16_t>(b);
    }
    return m;
  }();
  return maps;
}

}  // namespace

UnicodeClass unicode_class(uint32_t cp) {
  if (cp > kMaxCodepoint) return UnicodeClass::Undefined;
  return static_cast<UnicodeClass>(class_table()[cp]);
}

bool unicode_is_whitespace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

uint32_t decode_utf8_lenient(std::string_view text, size_t& pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const auto cont = [&](size_t i) { return i < text.size() && (byte(i) & 0xC0) == 0x80; };
  const uint8_t b0 = byte(pos);
  uint32_t cp = kReplacementChar;
  size_t len = 1;
  if (b0 < 0x80) {
    cp = b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    if (cont(pos + 1)) cp = ((b0 & 0x1Fu) << 6) | (byte(pos + 1) & 0x3Fu), len = 2;
  } else if ((b0 & 0xF0) == 0xE0) {
    if (cont(pos + 1) && cont(pos + 2))
      cp = ((b0 & 0x0Fu) << 12) | ((byte(pos + 1) & 0x3Fu) << 6) | (byte(pos + 2) & 0x3Fu), len = 3;
  } else if ((b0 & 0xF8) == 0xF0) {
    if (cont(pos + 1) && cont(pos + 2) && cont(pos + 3)) {
      const uint32_t v = ((b0 & 0x07u) << 18) | ((byte(pos + 1) & 0x3Fu) << 12) | ((byte(pos + 2) & 0x3Fu) << 6) |
                         (byte(pos + 3) & 0x3Fu);
      // llama.cpp aborts on values past U+10FFFF (it cannot re-encode them); we treat the lead
      // byte as invalid instead.
      if (v <= kMaxCodepoint) cp = v, len = 4;
    }
  }
  pos += len;
  return cp;
}

std::vector<uint32_t> decode_utf8_lenient(std::string_view text) {
  std::vector<uint32_t> cps;
  cps.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) cps.push_back(decode_utf8_lenient(text, pos));
  return cps;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Length of the well-formed sequence starting at text[pos] (1..4), or 0 when the bytes there
// are ill-formed; `*partial` receives how many leading bytes form a valid but truncated prefix.
size_t valid_sequence_length(std::string_view text, size_t pos, size_t* partial) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t b0 = byte(pos);
  *partial = 0;
  if (b0 < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF)
    need = 2;
  else if (b0 == 0xE0)
    need = 3, lo = 0xA0;
  else if (b0 == 0xED)
    need = 3, hi = 0x9F;
  else if (b0 >= 0xE1 && b0 <= 0xEF)
    need = 3;
  else if (b0 == 0xF0)
    need = 4, lo = 0x90;
  else if (b0 == 0xF4)
    need = 4, hi = 0x8F;
  else if (b0 >= 0xF1 && b0 <= 0xF3)
    need = 4;
  else
    return 0;
  size_t got = 1;
  for (; got < need; ++got) {
    if (pos + got >= text.size()) {
      *partial = got;
      return 0;
    }
    const uint8_t b = byte(pos + got);
    const bool ok = got == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!ok) {
      *partial = got;  // maximal subpart: these bytes are replaced by one U+FFFD
      return 0;
    }
  }
  return need;
}

}  // namespace

bool is_valid_utf8(std::string_view text) {
  size_t partial;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = valid_sequence_length(text, pos, &partial);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

size_t incomplete_utf8_suffix(std::string_view text) {
  // A partial character is at most 3 bytes long: look for its lead byte among the last 3.
  for (size_t back = 1; back <= 3 && back <= text.size(); ++back) {
    const size_t pos = text.size() - back;
    const uint8_t b = static_cast<uint8_t>(text[pos]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    size_t partial;
    const size_t n = valid_sequence_length(text, pos, &partial);
    return (n == 0 && partial == back) ? back : 0;
  }
  return 0;
}

std::string sanitize_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t partial;
  for (size_t pos = 0; pos < text.size();) {
    const size_t n = valid_sequence_length(text, pos, &partial);
    if (n > 0) {
      out.append(text.substr(pos, n));
      pos += n;
    } else {
      append_utf8(out, kReplacementChar);
      pos += partial > 0 ? partial : 1;
    }
  }
  return out;
}

uint32_t byte_to_unicode(uint8_t byte) { return byte_maps().to_cp[byte]; }

int unicode_to_byte(uint32_t cp) { return cp < byte_maps().to_byte.size() ? byte_maps().to_byte[cp] : -1; }

}  // namespace tessera
