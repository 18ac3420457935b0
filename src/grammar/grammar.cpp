#include "grammar/grammar.h"

#include <dlpack/dlpack.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <xgrammar/xgrammar.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

namespace tessera {

// Compiled grammars stay cached up to this many bytes (XGrammar evicts the least recently
// used beyond it), so a stream of distinct schemas cannot grow the server without bound.
constexpr int64_t kCompilerCacheBytes = 256ll << 20;
// Most choices of a guided_choice.
constexpr size_t kMaxChoices = 1024;
// JSON is written with fixed separators, no free whitespace: a small model at temperature 1
// otherwise wanders into runs of newlines until max_tokens cuts the object short.
constexpr bool kAnyWhitespace = false;

struct CompiledGrammar::Impl {
  xgrammar::CompiledGrammar compiled;
  int32_t vocab_size = 0;
};

CompiledGrammar::CompiledGrammar(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CompiledGrammar::~CompiledGrammar() = default;
int32_t CompiledGrammar::vocab_size() const { return impl_->vocab_size; }

struct GrammarCompiler::Impl {
  xgrammar::TokenizerInfo info;
  mutable xgrammar::GrammarCompiler compiler;
  Impl(xgrammar::TokenizerInfo i, int threads)
      : info(i), compiler(info, threads, /*cache_enabled=*/true, kCompilerCacheBytes) {}
};

namespace {

// XGrammar's view of the vocabulary: each token's raw bytes, "" for the tokens text can
// never produce (control, unknown, padding past the tokenizer), which it never allows, and
// the end-of-generation tokens, which it allows once the grammar is complete.
xgrammar::TokenizerInfo tokenizer_info(const Tokenizer& tok, int32_t n_vocab) {
  TESSERA_CHECK(n_vocab >= tok.vocab_size(), "grammar: the model's ", n_vocab,
                " logits are fewer than the tokenizer's vocabulary of ", tok.vocab_size());
  std::vector<std::string> vocab(static_cast<size_t>(tok.vocab_size()));
  std::vector<int32_t> stop;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.is_eog(id)) stop.push_back(id);
    if (tok.is_special(id) || tok.is_eog(id)) continue;
    vocab[static_cast<size_t>(id)] = std::string(tok.token_piece(id));
  }
  TESSERA_CHECK(!stop.empty(), "grammar: the vocabulary has no end-of-generation token to end a grammar with");
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, n_vocab, stop, false);
}

// An EBNF string literal of arbitrary text (UTF-8 passes through; quotes, backslashes and
// control characters are escaped).
std::string ebnf_literal(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

xgrammar::CompiledGrammar compile_spec(xgrammar::GrammarCompiler& c, const GrammarSpec& spec) {
  switch (spec.kind) {
    case GrammarSpec::Kind::JsonObject:
      // The builtin JSON grammar admits any value; json_object asks for an object.
      return c.CompileJSONSchema(R"({"type": "object"})", kAnyWhitespace, std::nullopt, std::nullopt,
                                 /*strict_mode=*/false);
    case GrammarSpec::Kind::JsonSchema: {
      // Parsed here first so that malformed JSON gets a message with its position.
      try {
        const nlohmann::json parsed = nlohmann::json::parse(spec.text);
        (void)parsed;
      } catch (const nlohmann::json::parse_error& e) {
        fail("the JSON schema is not valid JSON: ", e.what());
      }
      // strict_mode (vLLM's choice): objects take no properties the schema does not list.
      return c.CompileJSONSchema(spec.text, kAnyWhitespace, std::nullopt, std::nullopt, /*strict_mode=*/true);
    }
    case GrammarSpec::Kind::Regex:
      return c.CompileRegex(spec.text);
    case GrammarSpec::Kind::Choice: {
      TESSERA_CHECK(!spec.choices.empty(), "the choice list is empty");
      TESSERA_CHECK(spec.choices.size() <= kMaxChoices, "the choice list has ", spec.choices.size(),
                    " entries, at most ", kMaxChoices, " are allowed");
      std::string ebnf = "root ::= ";
      for (size_t i = 0; i < spec.choices.size(); ++i) {
        TESSERA_CHECK(!spec.choices[i].empty(), "choice ", i, " is empty");
        ebnf += (i ? " | " : "") + ebnf_literal(spec.choices[i]);
      }
      return c.CompileGrammar(ebnf, "root");
    }
    case GrammarSpec::Kind::Ebnf:
      return c.CompileGrammar(spec.text, "root");
    case GrammarSpec::Kind::StructuralTag:
      return c.CompileStructuralTag(spec.text);
  }
  fail("grammar: unknown kind");
}

}  // namespace

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, int32_t n_vocab, int threads)
    : impl_(std::make_unique<Impl>(tokenizer_info(tokenizer, n_vocab), std::max(1, threads))), n_vocab_(n_vocab) {}

GrammarCompiler::~GrammarCompiler() = default;

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const GrammarSpec& spec) const {
  try {
    return std::make_shared<const CompiledGrammar>(
        std::make_unique<CompiledGrammar::Impl>(CompiledGrammar::Impl{compile_spec(impl_->compiler, spec), n_vocab_}));
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // XGrammar's messages name the construct and, for EBNF and regexes, its position.
    std::string what = e.what();
    while (!what.empty() && (what.back() == '\n' || what.back() == ' ')) what.pop_back();
    fail(what);
  }
}

struct GrammarMatcher::Impl {
  xgrammar::GrammarMatcher matcher;
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar)
    : impl_(std::make_unique<Impl>(Impl{xgrammar::GrammarMatcher(grammar->impl().compiled)})),
      grammar_(std::move(grammar)) {}

GrammarMatcher::GrammarMatcher(std::unique_ptr<Impl> impl, std::shared_ptr<const CompiledGrammar> grammar, int64_t n)
    : impl_(std::move(impl)), grammar_(std::move(grammar)), n_accepted_(n) {}

GrammarMatcher::~GrammarMatcher() = default;
GrammarMatcher::GrammarMatcher(GrammarMatcher&&) noexcept = default;
GrammarMatcher& GrammarMatcher::operator=(GrammarMatcher&&) noexcept = default;

int32_t GrammarMatcher::vocab_size() const { return grammar_->vocab_size(); }

void GrammarMatcher::fill_next_token_bitmask(std::span<int32_t> mask) {
  const int32_t words = token_bitmask_words(vocab_size());
  TESSERA_CHECK(static_cast<int32_t>(mask.size()) == words, "grammar: a mask of ", mask.size(), " words, expected ",
                words);
  int64_t shape[1] = {words};
  DLTensor t{};
  t.data = mask.data();
  t.device = DLDevice{kDLCPU, 0};
  t.ndim = 1;
  t.dtype = xgrammar::GetBitmaskDLType();
  t.shape = shape;
  t.strides = nullptr;
  t.byte_offset = 0;
  impl_->matcher.FillNextTokenBitmask(&t);
}

bool GrammarMatcher::accept(int32_t token) {
  if (token < 0 || token >= vocab_size()) return false;
  if (!impl_->matcher.AcceptToken(token)) return false;
  ++n_accepted_;
  return true;
}

void GrammarMatcher::rollback(int n) {
  TESSERA_CHECK(n >= 0 && n <= n_accepted_, "grammar: rolling back ", n, " tokens of ", n_accepted_, " accepted");
  if (n == 0) return;
  impl_->matcher.Rollback(n);
  n_accepted_ -= n;
}

GrammarMatcher GrammarMatcher::fork() const {
  return GrammarMatcher(std::make_unique<Impl>(Impl{impl_->matcher.Fork()}), grammar_, n_accepted_);
}

bool GrammarMatcher::terminated() const { return impl_->matcher.IsTerminated(); }

}  // namespace tessera
