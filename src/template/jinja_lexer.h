#pragma once
// Splits template source into tokens the way jinja2's lexer does: data between tags, and inside
// {{ }} / {% %} the names, literals and operators. Whitespace control (`-`, `+`, trim_blocks,
// lstrip_blocks) and comments are applied here, so the parser never sees them.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "template/jinja_ast.h"

namespace tessera::jinja {

enum class TokenKind { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
  TokenKind kind;
  SourcePos pos;
  std::string text;  // Data, Name, String (unescaped), Op
  int64_t int_value = 0;
  double float_value = 0;
};

struct LexerOptions {
  bool trim_blocks = false;
  bool lstrip_blocks = false;
  bool keep_trailing_newline = false;
};

// Throws tessera::Error "line L, column C: ..." on malformed input.
std::vector<Token> tokenize(std::string_view source, const LexerOptions& options);

// Throws TemplateError: "line L, column C: message".
[[noreturn]] void fail_at(SourcePos pos, const std::string& message);

}  // namespace tessera::jinja
