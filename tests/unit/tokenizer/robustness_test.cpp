// RELIABILITY.md "Tokenizer": megabyte inputs that defeat naive tokenizers (one huge word,
// a million spaces or digits, long runs of combining marks, random bytes) must come out
// right. Only correctness is asserted; the inputs are sized so a quadratic algorithm would
// not finish within the suite's time.
#include <random>

#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace tessera {
namespace {

struct Models {
  test::CachedModel smol = test::open_cached("SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m");
  test::CachedModel gemma = test::open_cached("gemma-3-270m-q4_k_m.gguf", "gemma3-270m");
};

const Models& models() {
  static const Models m;
  return m;
}

void expect_round_trip(const Tokenizer& tok, const std::string& text, const char* what) {
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  ASSERT_FALSE(ids.empty()) << what;
  const std::string back = tok.decode(ids, true);
  ASSERT_EQ(back.size(), text.size()) << what;
  EXPECT_TRUE(back == text) << what << ": decode(encode(x)) differs from x";
}

std::string repeat(std::string_view unit, size_t n) {
  std::string s;
  s.reserve(unit.size() * n);
  for (size_t i = 0; i < n; ++i) s.append(unit);
  return s;
}

TEST(TokenizerRobustness, MegabyteInputsRoundTrip) {
  for (const Tokenizer* tok : {models().smol.tok.get(), models().gemma.tok.get()}) {
    if (!tok) continue;
    expect_round_trip(*tok, std::string(1 << 20, 'a'), "one 1 MiB word");
    expect_round_trip(*tok, std::string(1 << 20, ' '), "a million spaces");
    expect_round_trip(*tok, std::string(1 << 20, '7'), "a million digits");
    expect_round_trip(*tok, std::string(1 << 19, '\n'), "half a million newlines");
    // append, not "a" + s: GCC 12 reports a false -Wrestrict (PR 105329) in that insert.
    expect_round_trip(*tok, std::string("a").append(repeat("\xCC\x81", 1 << 18)),
                      "a letter with 262144 combining acute accents");
    expect_round_trip(*tok, repeat("\xF0\x9F\x91\xA8\xE2\x80\x8D", 1 << 15), "a long ZWJ chain");
  }
}

TEST(TokenizerRobustness, ManySpecialTokens) {
  const Tokenizer* smol = models().smol.tok.get();
  if (!smol) return;
  const std::string text = repeat("<|im_start|>", 1 << 16);
  EXPECT_EQ(smol->encode(text, false, true), std::vector<int32_t>(1 << 16, 1));
  expect_round_trip(*smol, text, "control tokens spelled as user text");
}

// Ill-formed UTF-8 (the fixtures pin the exact ids on short cases against llama.cpp):
// byte-level BPE sees each bad byte as U+FFFD, so decode gives the leniently decoded text
// minus the characters the vocabulary has no token for (SmolLM2 lacks a few control bytes,
// which llama.cpp drops too); SentencePiece falls back to <0xXX> tokens and restores bytes
// exactly as long as no lead byte swallows a following space (llama.cpp cuts symbols by the
// lead byte's announced length).
TEST(TokenizerRobustness, RandomBytes) {
  std::mt19937 rng(1234);
  std::string bytes(1 << 18, '\0');
  for (char& c : bytes) c = static_cast<char>(rng() & 0xFF);
  if (const Tokenizer* smol = models().smol.tok.get()) {
    std::string expected;
    for (uint32_t cp : decode_utf8_lenient(bytes)) {
      std::string utf8;
      append_utf8(utf8, cp);
      for (unsigned char b : utf8) {
        std::string ch;
        append_utf8(ch, byte_to_unicode(b));
        if (smol->token_id(ch)) expected.push_back(static_cast<char>(b));
      }
    }
    EXPECT_TRUE(smol->decode(smol->encode(bytes, false, false), true) == expected);
    EXPECT_FALSE(smol->encode(bytes, true, true).empty());
  }
  if (const Tokenizer* gemma = models().gemma.tok.get()) {
    std::string no_leads = bytes;  // ASCII and continuation bytes only: one byte per symbol
    for (char& c : no_leads)
      if (static_cast<uint8_t>(c) >= 0xC0) c = static_cast<char>(0x80 | (c & 0x3F));
    EXPECT_TRUE(gemma->decode(gemma->encode(no_leads, false, false), true) == no_leads);
    EXPECT_FALSE(gemma->encode(bytes, true, true).empty());
  }
}

}  // namespace
}  // namespace tessera
