// The grammar layer over the real SmolLM2 vocabulary: masks allow exactly the tokens that keep
// the output inside the grammar, accepted tokens advance it, rollback and fork restore and split
// its state, and what cannot be compiled is an Error naming the problem.
#include <gtest/gtest.h>

#include <random>

#include <cmath>
#include <filesystem>
#include <memory>
#include <regex>
#include <string>

#include "core/token_bitmask.h"
#include "core/error.h"
#include "format/gguf.h"
#include "grammar/grammar.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;

namespace {

class GrammarMatcherTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
    if (!std::filesystem::exists(path)) return;
    file_ = GGUFFile::open(path).release();
    tok_ = Tokenizer::from_gguf(*file_).release();
    compiler_ = new GrammarCompiler(*tok_, tok_->vocab_size(), 2);
  }
  static void TearDownTestSuite() {
    delete compiler_;
    delete tok_;
    delete file_;
  }
  void SetUp() override {
    if (!compiler_) GTEST_SKIP() << "model not found";
  }

  static std::shared_ptr<const CompiledGrammar> compile(GrammarSpec::Kind kind, const std::string& text) {
    return compiler_->compile(GrammarSpec{kind, text, {}});
  }
  static TokenBitmask mask_of(GrammarMatcher& m) {
    TokenBitmask mask(static_cast<size_t>(token_bitmask_words(m.vocab_size())));
    m.fill_next_token_bitmask(mask);
    return mask;
  }
  static int allowed_count(const TokenBitmask& mask) {
    int n = 0;
    for (int32_t t = 0; t < tok_->vocab_size(); ++t) n += token_bitmask_allows(mask, t);
    return n;
  }
  // Feeds text token by token (as the tokenizer splits it), checking each token is in the
  // mask before it is accepted.
  static void feed(GrammarMatcher& m, const std::string& text) {
    for (const int32_t t : tok_->encode(text, false, false)) {
      const TokenBitmask mask = mask_of(m);
      ASSERT_TRUE(token_bitmask_allows(mask, t)) << "token " << t << " '" << tok_->token_piece(t) << "' of " << text;
      ASSERT_TRUE(m.accept(t));
    }
  }

  static GGUFFile* file_;
  static Tokenizer* tok_;
  static GrammarCompiler* compiler_;
};

GGUFFile* GrammarMatcherTest::file_ = nullptr;
Tokenizer* GrammarMatcherTest::tok_ = nullptr;
GrammarCompiler* GrammarMatcherTest::compiler_ = nullptr;

TEST_F(GrammarMatcherTest, RegexMaskAllowsOnlyTokensThatStayInTheLanguage) {
  GrammarMatcher m(compile(GrammarSpec::Kind::Regex, "[0-9]{3}-[a-z]+"));
  TokenBitmask mask = mask_of(m);
  int allowed = 0;
  for (int32_t t = 0; t < tok_->vocab_size(); ++t) {
    if (!token_bitmask_allows(mask, t)) continue;
    ++allowed;
    const std::string piece(tok_->token_piece(t));
    // A token may cover up to the 3 digits and on into the dash and letters.
    EXPECT_TRUE(std::regex_match(piece, std::regex("[0-9]{1,3}|[0-9]{3}-[a-z]*"))) << "'" << piece << "'";
  }
  EXPECT_GE(allowed, 10);  // every single digit at least
  EXPECT_FALSE(token_bitmask_allows(mask, tok_->eos_id()));
  feed(m, "123-abc");
  mask = mask_of(m);
  EXPECT_TRUE(token_bitmask_allows(mask, tok_->eos_id()));  // complete: the end is allowed, and more letters
  EXPECT_FALSE(token_bitmask_allows(mask, *tok_->token_id("1")));
  EXPECT_FALSE(m.accept(*tok_->token_id("1")));  // refused, state unchanged
  EXPECT_TRUE(m.accept(tok_->eos_id()));
  EXPECT_TRUE(m.terminated());
}

TEST_F(GrammarMatcherTest, JsonSchemaWalksAValidDocumentAndEndsOnlyWhenComplete) {
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 20},
      "age": {"type": "integer", "minimum": 0, "maximum": 150},
      "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
    "required": ["name", "age", "tags"], "additionalProperties": false})";
  GrammarMatcher m(compile(GrammarSpec::Kind::JsonSchema, schema));
  const TokenBitmask first = mask_of(m);
  EXPECT_TRUE(token_bitmask_allows(first, *tok_->token_id("{")));
  EXPECT_FALSE(token_bitmask_allows(first, *tok_->token_id("[")));
  EXPECT_FALSE(token_bitmask_allows(first, tok_->eos_id()));
  // Fixed separators (no free whitespace): ", " and ": ".
  feed(m, R"({"name": "Ann", "age": 41, "tags": ["a")");
  EXPECT_FALSE(token_bitmask_allows(mask_of(m), tok_->eos_id()));
  feed(m, "]}");
  const TokenBitmask done = mask_of(m);
  EXPECT_TRUE(token_bitmask_allows(done, tok_->eos_id()));
  for (int32_t t = 0; t < tok_->vocab_size(); ++t)
    if (token_bitmask_allows(done, t)) {
      EXPECT_TRUE(tok_->is_eog(t)) << "only the end of generation may follow, not " << t;
    }
  EXPECT_GE(allowed_count(done), 1);
}

TEST_F(GrammarMatcherTest, RollbackRestoresTheEarlierMask) {
  GrammarMatcher m(compile(GrammarSpec::Kind::JsonObject, ""));
  feed(m, R"({"a": )");
  const int64_t at = m.n_accepted();
  const TokenBitmask before = mask_of(m);
  feed(m, R"([1, 2, {"b")");
  const int64_t extra = m.n_accepted() - at;
  ASSERT_GT(extra, 2);
  EXPECT_NE(mask_of(m), before);
  m.rollback(static_cast<int>(extra));
  EXPECT_EQ(m.n_accepted(), at);
  EXPECT_EQ(mask_of(m), before);
  // A rejected speculative token and what follows it are gone: another path is taken.
  feed(m, R"("x"})");
  EXPECT_TRUE(token_bitmask_allows(mask_of(m), tok_->eos_id()));
  EXPECT_THROW(m.rollback(static_cast<int>(m.n_accepted()) + 1), Error);
}

TEST_F(GrammarMatcherTest, ForkSplitsTheStateAndTheOriginalKeepsItsOwn) {
  auto grammar = compiler_->compile(GrammarSpec{GrammarSpec::Kind::Choice, "", {"yes", "no", "maybe"}});
  GrammarMatcher m(grammar);
  const TokenBitmask start = mask_of(m);
  for (int32_t t = 0; t < tok_->vocab_size(); ++t) {
    if (!token_bitmask_allows(start, t)) continue;
    const std::string piece(tok_->token_piece(t));
    EXPECT_TRUE(std::string("yes").starts_with(piece) || std::string("no").starts_with(piece) ||
                std::string("maybe").starts_with(piece))
        << "'" << piece << "'";
  }
  GrammarMatcher fork = m.fork();
  feed(fork, "maybe");
  EXPECT_TRUE(token_bitmask_allows(mask_of(fork), tok_->eos_id()));
  EXPECT_EQ(mask_of(m), start);  // the original did not move
  feed(m, "no");
  EXPECT_TRUE(token_bitmask_allows(mask_of(m), tok_->eos_id()));
  EXPECT_EQ(fork.n_accepted(), static_cast<int64_t>(tok_->encode("maybe", false, false).size()));
}

TEST_F(GrammarMatcherTest, ApplyingTheMaskLeavesOnlyAllowedLogits) {
  GrammarMatcher m(compile(GrammarSpec::Kind::Regex, "(true|false)"));
  const TokenBitmask mask = mask_of(m);
  std::vector<float> logits(static_cast<size_t>(tok_->vocab_size()), 1.5f);
  apply_token_bitmask(logits, mask);
  for (int32_t t = 0; t < tok_->vocab_size(); ++t)
    EXPECT_EQ(std::isfinite(logits[static_cast<size_t>(t)]), token_bitmask_allows(mask, t)) << t;
}

// Masks of every shape — runs of empty words, full words, mixed words, a vocabulary that ends
// inside a word — against the bit-by-bit definition.
TEST(ApplyTokenBitmask, ClearsExactlyTheForbiddenTokens) {
  std::mt19937 rng(11);
  for (const size_t n : {size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{1000}, size_t{128256}}) {
    const size_t words = (n + 31) / 32 + 1;  // a mask may be longer than the row
    for (int trial = 0; trial < 4; ++trial) {
      std::vector<int32_t> mask(words);
      for (auto& m : mask) {
        const uint32_t kind = rng() % 4;
        m = static_cast<int32_t>(kind == 0 ? 0u : kind == 1 ? 0xffffffffu : static_cast<uint32_t>(rng()));
        if (kind == 0 && rng() % 2) m = 0;  // longer runs of empty words
      }
      std::vector<float> logits(n, 2.0f);
      apply_token_bitmask(logits, mask);
      for (size_t t = 0; t < n; ++t)
        ASSERT_EQ(std::isfinite(logits[t]), token_bitmask_allows(mask, static_cast<int32_t>(t))) << n << " " << t;
    }
  }
  std::vector<float> row(65, 0.0f);
  std::vector<int32_t> short_mask(2);
  EXPECT_THROW(apply_token_bitmask(row, short_mask), Error);
}

TEST_F(GrammarMatcherTest, WhatCannotBeCompiledIsAnErrorNamingIt) {
  const auto message = [](GrammarSpec spec) {
    try {
      compiler_->compile(spec);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("compiled");
  };
  EXPECT_NE(message({GrammarSpec::Kind::JsonSchema, R"({"type": "object",)", {}}).find("not valid JSON"),
            std::string::npos);
  EXPECT_NE(message({GrammarSpec::Kind::JsonSchema, R"({"type": "strange"})", {}}), "compiled");
  EXPECT_NE(message({GrammarSpec::Kind::Regex, "(abc", {}}), "compiled");
  EXPECT_NE(message({GrammarSpec::Kind::Ebnf, "root ::= \"a\" | ", {}}), "compiled");
  EXPECT_NE(message({GrammarSpec::Kind::Ebnf, "start ::= \"a\"", {}}), "compiled");  // no root rule
  EXPECT_NE(message({GrammarSpec::Kind::Choice, "", {}}).find("empty"), std::string::npos);
  // The compiler is still usable afterwards.
  GrammarMatcher m(compile(GrammarSpec::Kind::Ebnf, R"(root ::= "a" ("b" | "c")*)"));
  feed(m, "abcb");
}

}  // namespace
