// IncrementalDetokenizer: chunks are always valid UTF-8, hold back at most 3 bytes (plus the
// clean-up look-ahead where it applies), and concatenate to sanitize_utf8(decode(ids)).
#include "tokenizer/detokenizer.h"

#include <random>

#include "core/error.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace tessera {
namespace {

// Pushes `ids` one by one and checks every chunk and the held-back amount.
void check_stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special, const std::string& label) {
  IncrementalDetokenizer detok(tok, skip_special);
  std::string streamed;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string chunk = detok.push(ids[i]);
    ASSERT_TRUE(is_valid_utf8(chunk)) << label << " chunk after token " << i;
    streamed += chunk;
    if (!tok.clean_spaces()) {
      // Exactly the complete part of what decode gives so far is out.
      const std::string so_far = tok.decode(std::span(ids).first(i + 1), skip_special);
      const size_t held = incomplete_utf8_suffix(so_far);
      ASSERT_LE(held, 3u);
      ASSERT_EQ(streamed, sanitize_utf8(std::string_view(so_far).substr(0, so_far.size() - held)))
          << label << " after token " << i;
    }
  }
  const std::string tail = detok.flush();
  ASSERT_TRUE(is_valid_utf8(tail)) << label;
  streamed += tail;
  EXPECT_EQ(streamed, sanitize_utf8(tok.decode(ids, skip_special))) << label;
}

TEST(IncrementalDetokenizer, FixtureTextsStreamLikeDecode) {
  for (const auto& [fixture, alias] :
       {std::pair{"smollm2_llama.json", "smollm2-135m"}, {"gemma3_llama.json", "gemma3-270m"}}) {
    const auto fx = test::load_fixture(fixture);
    const auto model = test::open_cached(fx["model_file"].get<std::string>(), alias);
    if (!model.tok) continue;
    for (const auto& c : fx["cases"]) {
      if (c["ap"].size() > 400) continue;  // the long texts add time, not coverage
      check_stream(*model.tok, c["ap"].get<std::vector<int32_t>>(), true, std::string(fixture) + " skip");
      check_stream(*model.tok, c["ap"].get<std::vector<int32_t>>(), false, std::string(fixture) + " keep");
    }
  }
}

// Random ids, biased towards tokens that are partial UTF-8 (byte tokens, byte-level pieces of
// multi-byte characters), never produce a broken chunk.
TEST(IncrementalDetokenizer, FuzzRandomTokenSequences) {
  for (const auto& [file, alias] :
       {std::pair{"SmolLM2-135M-Instruct.Q4_1.gguf", "smollm2-135m"}, {"gemma-3-270m-q4_k_m.gguf", "gemma3-270m"}}) {
    const auto model = test::open_cached(file, alias);
    if (!model.tok) continue;
    const Tokenizer& tok = *model.tok;
    std::vector<int32_t> partial;  // tokens whose piece is not valid UTF-8 on its own
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
      if (!is_valid_utf8(tok.token_piece(id))) partial.push_back(id);
    ASSERT_GT(partial.size(), 100u) << file;
    std::mt19937 rng(42);
    for (int seq = 0; seq < 300; ++seq) {
      std::vector<int32_t> ids(1 + rng() % 40);
      for (auto& id : ids)
        id = (rng() % 3 != 0) ? partial[rng() % partial.size()] : static_cast<int32_t>(rng() % tok.vocab_size());
      check_stream(tok, ids, seq % 2 == 0, std::string(file) + " seq " + std::to_string(seq));
    }
  }
}

// A small byte-level vocabulary with llama.cpp's space clean-up ("gpt-2" pre-tokenizer).
std::unique_ptr<Tokenizer> clean_spaces_vocab() {
  VocabSpec spec = test::byte_vocab_spec();
  for (const char* t : {"\xC4\xA0'", "\xC4\xA0,", "\xC4\xA0?", "'s", "re"}) spec.tokens.push_back(t);
  spec.merges = {"\xC4\xA0 '", "\xC4\xA0 ,", "\xC4\xA0 ?", "' s", "r e"};
  return Tokenizer::from_spec(spec);
}

TEST(IncrementalDetokenizer, CleanSpacesLookAheadIsEnough) {
  const auto tok = clean_spaces_vocab();
  ASSERT_TRUE(tok->clean_spaces());
  EXPECT_EQ(tok->decode(tok->encode("Hello , world ? it 's ok ' yes", false, false), true),
            "Hello, world? it's ok'yes");
  std::vector<int32_t> alphabet;
  for (const char* t : {"\xC4\xA0", ",", "?", ".", "!", "'", "s", "m", "r", "e", "v", "t", "d", "l", "a", "\xC4\xA0'",
                        "\xC4\xA0,", "'s", "re"})
    alphabet.push_back(*tok->token_id(t));
  for (uint8_t b : {0xC3, 0xA9, 0xE2, 0x82, 0xAC}) {  // pieces of é and €
    std::string s;
    append_utf8(s, byte_to_unicode(b));
    alphabet.push_back(*tok->token_id(s));
  }
  std::mt19937 rng(7);
  for (int seq = 0; seq < 2000; ++seq) {
    std::vector<int32_t> ids(1 + rng() % 12);
    for (auto& id : ids) id = alphabet[rng() % alphabet.size()];
    check_stream(*tok, ids, true, "clean seq " + std::to_string(seq));
  }
}

// SentencePiece vocabulary with add_space_prefix: the leading "▁" of the first token is not
// text the user wrote.
std::unique_ptr<Tokenizer> tiny_spm(bool add_space_prefix) {
  VocabSpec spec;
  spec.model = "llama";
  spec.tokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81hello", "\xE2\x96\x81world", "\xE2\x96\x81", "h", "e", "l", "o",
                 "w",     "r",   "d"};
  spec.token_types = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
  spec.scores = {0, 0, 0, -1, -2, -3, -4, -5, -6, -7, -8, -9, -10};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    spec.tokens.push_back(buf);
    spec.token_types.push_back(6);
    spec.scores.push_back(0);
  }
  // Intermediate pieces so the bigram merges can reach the words.
  for (const char* t : {"\xE2\x96\x81h", "\xE2\x96\x81he", "\xE2\x96\x81hel", "\xE2\x96\x81hell", "\xE2\x96\x81w",
                        "\xE2\x96\x81wo", "\xE2\x96\x81wor", "\xE2\x96\x81worl"}) {
    spec.tokens.push_back(t);
    spec.token_types.push_back(1);
    spec.scores.push_back(-20);
  }
  spec.add_space_prefix = add_space_prefix;
  return Tokenizer::from_spec(spec);
}

TEST(IncrementalDetokenizer, SentencePieceLeadingSpace) {
  const auto tok = tiny_spm(true);
  const auto ids = tok->encode("hello world", true, false);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4}));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{3, 4}, true), "hello world");
  // llama.cpp strips the space from the first token only, even when that token is BOS.
  EXPECT_EQ(tok->decode(ids, true), " hello world");
  IncrementalDetokenizer detok(*tok);
  EXPECT_EQ(detok.push(3), "hello");
  EXPECT_EQ(detok.push(4), " world");
  EXPECT_EQ(detok.flush(), "");
  // Bytes without a token fall back to <0xXX>; a split character is held until complete.
  const auto euro = tok->encode("\xE2\x82\xAC", false, false);  // ▁ then three byte tokens
  ASSERT_EQ(euro.size(), 4u);
  IncrementalDetokenizer d2(*tok);
  EXPECT_EQ(d2.push(euro[0]), "");
  EXPECT_EQ(d2.push(euro[1]), "");
  EXPECT_EQ(d2.push(euro[2]), "");
  EXPECT_EQ(d2.push(euro[3]), "\xE2\x82\xAC");
  IncrementalDetokenizer d3(*tok);
  EXPECT_EQ(d3.push(euro[1]), "");
  EXPECT_EQ(d3.flush(), "\xEF\xBF\xBD");  // a lone lead byte at the end becomes U+FFFD
  EXPECT_THROW(d3.push(tok->vocab_size()), Error);
}

}  // namespace
}  // namespace tessera
