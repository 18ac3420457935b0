#pragma once
// Structured output parameters: OpenAI's response_format (json_object, json_schema) and vLLM's
// guided_json, guided_regex, guided_choice and guided_grammar, read and compiled into the
// grammar the engine masks every sampling step with (docs/design/structured-output.md).
#include <memory>
#include <optional>
#include <string>

#include "server/api/json_fields.h"

namespace tessera {
struct GrammarSpec;
class CompiledGrammar;
class GrammarCompiler;
}  // namespace tessera

namespace tessera::api {

// Bounds on what a request may ask to compile.
inline constexpr size_t kMaxGrammarBytes = 64 * 1024;  // a schema (as JSON), regex or grammar

// What the body constrains its output to, or nothing (no such field, or response_format text);
// `param` gets the field's name. At most one of the fields may be set; a malformed one is a
// 400 naming it.
std::optional<GrammarSpec> parse_structured_output(const Fields& body, std::string& param);

// The body's grammar compiled with `compiler`, or null when the output is free. A grammar that
// cannot be compiled is a 400 (code "invalid_grammar") naming the parameter and the problem;
// a server without a compiler answers 400 for any structured output.
std::shared_ptr<const CompiledGrammar> structured_output_grammar(const Fields& body, const GrammarCompiler* compiler);

}  // namespace tessera::api
