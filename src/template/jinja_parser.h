#pragma once
// Recursive-descent parser following jinja2's grammar and operator precedence.
#include <vector>

#include "template/jinja_ast.h"
#include "template/jinja_lexer.h"

namespace tessera::jinja {

// Throws tessera::Error "line L, column C: ..." on bad syntax, and when blocks or expressions
// nest deeper than max_nesting (a deeper tree could exhaust the stack when walked).
Body parse(const std::vector<Token>& tokens, int max_nesting);

}  // namespace tessera::jinja
