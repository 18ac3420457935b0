#pragma once
// The tool-calling fields of a chat request (tools, tool_choice, parallel_tool_calls), checked,
// and what they ask of generation: the tools the chat template renders, whether the output is
// parsed for calls, and for tool_choice "required" or a named function the grammar that makes
// the output a well-formed call (docs/design/openai-api.md, "Tool calling").
#include <cstddef>
#include <memory>
#include <optional>
#include <string>

#include "server/api/json_fields.h"
#include "server/api/tool_parser.h"

namespace tessera {
struct GrammarSpec;
class CompiledGrammar;
class GrammarCompiler;
}  // namespace tessera

namespace tessera::api {

inline constexpr size_t kMaxTools = 128;
inline constexpr size_t kMaxToolsBytes = 256 * 1024;  // all of `tools`, as JSON
inline constexpr size_t kMaxToolNameBytes = 64;       // OpenAI's limit

enum class ToolChoice : uint8_t { None, Auto, Required, Named };

struct ToolRequest {
  json tools = nullptr;  // the request's list as given (null: no tools), for the template
  ToolChoice choice = ToolChoice::None;
  std::string named;     // ToolChoice::Named: the function
  bool parallel = true;  // parallel_tool_calls: more than one call may be made
  // Whether the output is read for tool calls (tools given and tool_choice not "none").
  bool parse_output() const { return !tools.is_null() && choice != ToolChoice::None; }
  // Whether generation is constrained to calls ("required" or a named function).
  bool constrained() const { return choice == ToolChoice::Required || choice == ToolChoice::Named; }
};

// Reads and checks the fields: every malformed tool, duplicate name, unknown named function or
// wrong type is a 400 naming the field (tools[i].function.name, tool_choice, ...). The legacy
// `functions` / `function_call` are refused (400 unsupported_parameter): use tools.
ToolRequest parse_tool_request(const Fields& body);

// The structural tag that makes the output one or more calls in `format` (each function's
// parameters schema inside the format's wrapper); nullopt unless constrained().
std::optional<GrammarSpec> tool_call_grammar(const ToolRequest& request, ToolFormat format);

// tool_choice "auto" in a format whose calls open with a text marker (Hermes' <tool_call>): free
// text, but from the marker on one of the tools' calls with arguments that follow its schema
// (an XGrammar triggered tag), so a call the model starts always parses. nullopt for the other
// choices, no tools, or formats without such a marker (Llama 3 JSON opens with "{", Mistral with
// a control token).
std::optional<GrammarSpec> auto_tool_call_grammar(const ToolRequest& request, ToolFormat format);

// The compiled grammar for a constrained request (null otherwise); a schema the grammar engine
// cannot compile is a 400 naming tools[i].function.parameters. A server without a compiler
// answers 400 for tool_choice required / named.
std::shared_ptr<const CompiledGrammar> tool_call_compiled_grammar(const ToolRequest& request, ToolFormat format,
                                                                  const GrammarCompiler* compiler);
// The compiled auto_tool_call_grammar, or null: none applies, no compiler, or a tool schema the
// grammar engine cannot compile (then the output stays free, as "auto" always was: no 400).
std::shared_ptr<const CompiledGrammar> auto_tool_call_compiled_grammar(const ToolRequest& request, ToolFormat format,
                                                                       const GrammarCompiler* compiler);

// An assistant message's tool_calls and a tool message's fields, checked in place (param:
// "messages[i]"); each call's function.arguments given as a JSON string becomes the object it
// spells, as transformers' templates expect (Qwen2.5 and Hermes write it with `| tojson`).
// Returns the bytes of text the calls hold, for the messages' size bound.
size_t normalize_tool_calls(json& message, const std::string& param);

}  // namespace tessera::api
