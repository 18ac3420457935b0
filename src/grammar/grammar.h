#pragma once
// Structured output: a request's grammar (JSON, a JSON schema, a regex, a choice of strings
// or an EBNF grammar) compiled against the model's vocabulary, and the per-sequence matcher
// that turns it into a token mask before every sampling step. The engine is XGrammar's C++
// core (built by scripts/xgrammar-deps.sh); its headers stay inside this layer.
// Contract and the library decision: docs/design/structured-output.md.
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/token_bitmask.h"

namespace tessera {

class Tokenizer;

// What a request constrains its output to.
struct GrammarSpec {
  enum class Kind : uint8_t {
    JsonObject,  // any JSON object (response_format json_object)
    JsonSchema,  // text: a JSON schema
    Regex,       // text: a regular expression the whole output matches
    Choice,      // choices: the output is exactly one of them
    Ebnf,        // text: an EBNF/GBNF grammar whose start rule is `root`
    // text: an XGrammar structural tag, {"type": "structural_tag", "format": {...}} (tool
    // calls: each function's parameter schema inside its format's wrapper).
    StructuralTag,
  };
  Kind kind = Kind::JsonObject;
  std::string text;
  std::vector<std::string> choices;
};

// A grammar compiled for one vocabulary: immutable, shared by every sequence that uses it.
class CompiledGrammar {
 public:
  struct Impl;
  explicit CompiledGrammar(std::unique_ptr<Impl> impl);
  ~CompiledGrammar();
  const Impl& impl() const { return *impl_; }
  int32_t vocab_size() const;

 private:
  std::unique_ptr<Impl> impl_;
};

// Compiles GrammarSpecs for one model's vocabulary. Thread-safe; keeps a bounded cache of
// compiled grammars (the same schema twice compiles once).
class GrammarCompiler {
 public:
  // n_vocab: the model's logits width (at least the tokenizer's vocabulary; ids past it are
  // never allowed). The end-of-generation tokens end a completed grammar.
  GrammarCompiler(const Tokenizer& tokenizer, int32_t n_vocab, int threads = 2);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // Throws tessera::Error naming what cannot be compiled (bad JSON, unsupported schema
  // keyword, bad regex, EBNF syntax error with its position).
  std::shared_ptr<const CompiledGrammar> compile(const GrammarSpec& spec) const;
  int32_t vocab_size() const { return n_vocab_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int32_t n_vocab_;
};

// A token mask (layout, size and application: core/token_bitmask.h; applied to the logits by
// the backend, Backend::apply_token_bitmask).
using TokenBitmask = std::vector<int32_t>;

// The state of one sequence in its grammar: advances with each accepted token, rolls back
// tokens (rejected speculative ones), forks (n > 1 choices). Not thread-safe.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(GrammarMatcher&&) noexcept;
  GrammarMatcher& operator=(GrammarMatcher&&) noexcept;

  // The tokens allowed next, into mask [token_bitmask_words(vocab_size)]. Once the grammar is
  // complete only end-of-generation tokens are allowed.
  void fill_next_token_bitmask(std::span<int32_t> mask);
  // Advances by one token; false (state unchanged) when the grammar forbids it.
  bool accept(int32_t token);
  // Undoes the last n accepted tokens (n <= the tokens accepted so far).
  void rollback(int n);
  // An independent matcher in the same state.
  GrammarMatcher fork() const;
  // An end-of-generation token was accepted: nothing may follow.
  bool terminated() const;
  int32_t vocab_size() const;
  int64_t n_accepted() const { return n_accepted_; }

 private:
  struct Impl;
  explicit GrammarMatcher(std::unique_ptr<Impl> impl, std::shared_ptr<const CompiledGrammar> grammar, int64_t n);
  std::unique_ptr<Impl> impl_;
  std::shared_ptr<const CompiledGrammar> grammar_;
  int64_t n_accepted_ = 0;
};

}  // namespace tessera
