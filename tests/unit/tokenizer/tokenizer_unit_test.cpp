// The algorithms on vocabularies built by hand, where the right answer follows from the rules
// (llama.cpp's merge order, special-token priority, attribute rules, UTF-8 handling).
#include "core/error.h"
#include "tokenizer/regex_split.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/unicode.h"
#include <gtest/gtest.h>

namespace tessera {
namespace {

std::string bl(std::string_view bytes) {  // GPT-2 byte-level spelling of raw bytes
  std::string s;
  for (unsigned char b : bytes) append_utf8(s, byte_to_unicode(b));
  return s;
}

VocabSpec byte_level_spec(const std::vector<std::string>& extra, const std::vector<std::string>& merges,
                          std::string pre = "gpt-2") {
  VocabSpec spec;
  spec.model = "gpt2";
  spec.pre = std::move(pre);
  for (int b = 0; b < 256; ++b) spec.tokens.push_back(bl(std::string(1, static_cast<char>(b))));
  for (const auto& t : extra) spec.tokens.push_back(t);
  spec.merges = merges;
  return spec;
}

TEST(TokenizerUnit, BpeAppliesLowestRankFirst) {
  // ids: 256 "ab", 257 "bc", 258 "abc"
  auto tok = Tokenizer::from_spec(byte_level_spec({"ab", "bc", "abc"}, {"b c", "a b", "a bc"}));
  EXPECT_EQ(tok->encode("abc", false, false), (std::vector<int32_t>{258}));  // b+c, then a+bc
  tok = Tokenizer::from_spec(byte_level_spec({"ab", "bc", "abc"}, {"a b", "b c", "a bc"}));
  EXPECT_EQ(tok->encode("abc", false, false), (std::vector<int32_t>{256, 'c'}));  // a+b wins, "ab c" unknown
  // Equal ranks cannot happen for different pairs, but the same pair repeats: leftmost first.
  tok = Tokenizer::from_spec(byte_level_spec({"aa"}, {"a a"}));
  EXPECT_EQ(tok->encode("aaa", false, false), (std::vector<int32_t>{256, 'a'}));
  EXPECT_EQ(tok->decode(tok->encode("aaa", false, false), true), "aaa");
}

TEST(TokenizerUnit, IgnoreMergesTakesWholeWords) {
  // "llama3" pre-tokenizers set ignore_merges: a word that is a token skips the merges.
  auto spec = byte_level_spec({"xyz"}, {}, "llama-bpe");
  auto tok = Tokenizer::from_spec(spec);
  EXPECT_EQ(tok->encode("xyz", false, false), (std::vector<int32_t>{256}));
  EXPECT_TRUE(tok->add_bos()) << "llama3 pre-tokenizers add BOS by default";
  spec.pre = "gpt-2";
  tok = Tokenizer::from_spec(spec);
  EXPECT_EQ(tok->encode("xyz", false, false), (std::vector<int32_t>{'x', 'y', 'z'}));
}

TEST(TokenizerUnit, LongerSpecialTokensClaimTextFirst) {
  // 256 "ab" and 257 "bcd" are user-defined; 258 "<c>" is control.
  auto spec = byte_level_spec({"ab", "bcd", "<c>"}, {});
  spec.token_types.assign(spec.tokens.size(), 1);
  spec.token_types[256] = 4, spec.token_types[257] = 4, spec.token_types[258] = 3;
  const auto tok = Tokenizer::from_spec(spec);
  // llama.cpp looks for the longest special token first, so "bcd" wins over the leftmost "ab".
  EXPECT_EQ(tok->encode("abcd", false, false), (std::vector<int32_t>{'a', 257}));
  EXPECT_EQ(tok->encode("ab<c>", false, true), (std::vector<int32_t>{256, 258}));
  EXPECT_EQ(tok->encode("ab<c>", false, false), (std::vector<int32_t>{256, '<', 'c', '>'}))
      << "control tokens are text when parse_special is off; user-defined ones still match";
  EXPECT_TRUE(tok->is_special(256));
  EXPECT_TRUE(tok->is_control(258));
  EXPECT_FALSE(tok->is_special('a'));
  EXPECT_FALSE(tok->is_special(-1));
  EXPECT_EQ(tok->decode(std::vector<int32_t>{256, 258}, true), "ab");
  EXPECT_EQ(tok->decode(std::vector<int32_t>{256, 258}, false), "ab<c>");
}

TEST(TokenizerUnit, Phi3ControlTokensSwallowFollowingSpaces) {
  auto spec = byte_level_spec({"<|user|>"}, {});
  spec.token_types.assign(spec.tokens.size(), 1);
  spec.token_types[256] = 3;
  spec.model_name = "Phi-3 mini";  // llama.cpp sets RSTRIP on special tokens for phi-3 names
  const auto tok = Tokenizer::from_spec(spec);
  EXPECT_EQ(tok->encode("<|user|> \t hi", false, true), (std::vector<int32_t>{256, 'h', 'i'}));
  EXPECT_TRUE(tok->token_attr(256) & kAttrRstrip);
}

TEST(TokenizerUnit, EndOfGenerationByName) {
  auto spec = byte_level_spec({"<|im_end|>", "<|endoftext|>", "<reponame>", "<|im_start|>"}, {});
  spec.special_ids["eos"] = 257;
  const auto tok = Tokenizer::from_spec(spec);
  EXPECT_TRUE(tok->is_eog(256));  // <|im_end|>, made a control token although typed normal
  EXPECT_TRUE(tok->is_control(256));
  EXPECT_TRUE(tok->is_eog(257));   // eos
  EXPECT_TRUE(tok->is_eog(258));   // <reponame> is llama.cpp's FIM "repo" token
  EXPECT_FALSE(tok->is_eog(259));  // <|im_start|>
  EXPECT_FALSE(tok->is_eog(100000));
  EXPECT_EQ(tok->eos_id(), 257);
}

TEST(TokenizerUnit, RequiredSpecialIdsOutsideTheVocabularyAreRejected) {
  const auto spec0 = byte_level_spec({}, {});
  const int64_t n = static_cast<int64_t>(spec0.tokens.size());
  for (const auto& [key, value] :
       {std::pair<std::string, int64_t>{"bos", n}, {"eos", 1000000000}, {"eot", -5}, {"eom", n + 1}}) {
    auto spec = spec0;
    spec.special_ids[key] = value;
    try {
      Tokenizer::from_spec(spec);
      ADD_FAILURE() << key << " = " << value << " accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("'tokenizer.ggml." + key + "_token_id' is " + std::to_string(value)), std::string::npos)
          << msg;
      EXPECT_NE(msg.find("[0, " + std::to_string(n) + ")"), std::string::npos) << msg;
    }
  }
}

TEST(TokenizerUnit, OptionalSpecialIdsOutsideTheVocabularyKeepDefaults) {
  auto spec = byte_level_spec({}, {});
  const int64_t n = static_cast<int64_t>(spec.tokens.size());
  spec.special_ids["unknown"] = n;  // llama.cpp warns and keeps the default
  spec.special_ids["padding"] = 1000000000;
  spec.special_ids["mask"] = -1;
  spec.special_ids["bos"] = 5;
  const auto tok = Tokenizer::from_spec(spec);
  EXPECT_EQ(tok->bos_id(), 5);
  for (int32_t id = 0; id < tok->vocab_size(); ++id) ASSERT_NO_THROW(tok->token_attr(id));
  EXPECT_FALSE(tok->is_special(static_cast<int32_t>(n)));
}

TEST(TokenizerUnit, RejectsWhatItCannotTokenize) {
  auto spec = byte_level_spec({}, {}, "no-such-pre");
  try {
    Tokenizer::from_spec(spec);
    ADD_FAILURE() << "unknown pre-tokenizer accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-pre"), std::string::npos);
  }
  spec.pre = "gpt-2";
  spec.model = "bert";
  EXPECT_THROW(Tokenizer::from_spec(spec), Error);
  spec.model = "gpt2";
  spec.tokens.clear();
  EXPECT_THROW(Tokenizer::from_spec(spec), Error);
  // SentencePiece without a byte token for a character it cannot spell.
  VocabSpec spm;
  spm.model = "llama";
  spm.tokens = {"<unk>", "<s>", "</s>", "a"};
  const auto tok = Tokenizer::from_spec(spm);
  EXPECT_THROW((void)tok->encode("b", false, false), Error);
  EXPECT_EQ(tok->encode("", true, false), (std::vector<int32_t>{1}));
}

TEST(TokenizerUnit, Utf8Helpers) {
  size_t pos = 0;
  EXPECT_EQ(decode_utf8_lenient("\xC0\x80", pos), 0u);  // overlong accepted, like llama.cpp
  EXPECT_EQ(pos, 2u);
  EXPECT_EQ(decode_utf8_lenient("\xED\xA0\x80"), std::vector<uint32_t>{0xD800});  // surrogate as written
  EXPECT_EQ(decode_utf8_lenient("\xF4\x90\x80\x80"), (std::vector<uint32_t>{0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD}));
  EXPECT_EQ(decode_utf8_lenient("\xE2\x82"
                                "a"),
            (std::vector<uint32_t>{0xFFFD, 0xFFFD, 'a'}));
  EXPECT_TRUE(is_valid_utf8("h\xC3\xA9\xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_valid_utf8("\xC0\x80"));
  EXPECT_FALSE(is_valid_utf8("\xED\xA0\x80"));
  EXPECT_EQ(incomplete_utf8_suffix("ab\xE2\x82"), 2u);
  EXPECT_EQ(incomplete_utf8_suffix("ab\xF0\x9F\x98"), 3u);
  EXPECT_EQ(incomplete_utf8_suffix("ab\xE2\x28"), 0u);
  EXPECT_EQ(incomplete_utf8_suffix("ab\x80"), 0u);
  EXPECT_EQ(sanitize_utf8("a\xE2\x82"
                          "b\xFF"),
            "a\xEF\xBF\xBD"
            "b\xEF\xBF\xBD");               // maximal subparts
  EXPECT_EQ(byte_to_unicode(' '), 0x120u);  // 'Ġ'
  EXPECT_EQ(byte_to_unicode('!'), static_cast<uint32_t>('!'));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(unicode_to_byte(byte_to_unicode(static_cast<uint8_t>(b))), b);
  EXPECT_EQ(unicode_to_byte('A' + 0x1000), -1);
  EXPECT_EQ(unicode_class('7'), UnicodeClass::Number);
  EXPECT_EQ(unicode_class(0x4E2D), UnicodeClass::Letter);  // 中
  EXPECT_EQ(unicode_class(0x0301), UnicodeClass::Mark);
  EXPECT_EQ(unicode_class(0x1F6DC), UnicodeClass::Symbol);  // new in Unicode 15
  EXPECT_EQ(unicode_class(0x0378), UnicodeClass::Undefined);
  EXPECT_TRUE(unicode_is_whitespace(0x3000));
  EXPECT_FALSE(unicode_is_whitespace(0x1C));  // not White_Space in llama.cpp's table
}

TEST(TokenizerUnit, MultiStringFinder) {
  MultiStringFinder f;
  f.build({"he", "she", "his", "hers", "x"});
  EXPECT_EQ(f.present("ushers"), (std::vector<bool>{true, true, false, true, false}));
  EXPECT_EQ(f.longest_at("hers", 0), 3);
  EXPECT_EQ(f.longest_at("ahers", 0), -1);
  EXPECT_EQ(f.longest_at("he", 0), 0);
}

TEST(TokenizerUnit, LlamaSplitterGpt2Rules) {
  const LlamaSplitter split(llama_pre_tokenizer("gpt-2").regexes);
  const auto words = split.split("Hello world's  12 !!", false);
  EXPECT_EQ(words, (std::vector<std::string>{"Hello", " world", "'s", " ", " 12", " !!"}));
  EXPECT_EQ(split.split(" a", true), std::vector<std::string>{"\xC4\xA0"
                                                              "a"});  // byte-level 'Ġa'
  EXPECT_FALSE(llama_pre_tokenizer_names().empty());
}

}  // namespace
}  // namespace tessera
