#pragma once
// What the API layer knows of the model it serves: its public name, tokenizer, limits and
// chat template. Built once at start-up (serve_app) and shared, read-only, by every request.
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "server/api/tool_parser.h"
#include "template/rendered_chat.h"

namespace tessera {
class Tokenizer;
struct EngineConfig;
class GrammarCompiler;
}  // namespace tessera

namespace tessera::api {

// Renders chat messages into prompt text (the model's Jinja template, sandboxed), with the byte
// spans the template wrote itself: only there are special tokens read (RenderedChat). Throws
// jinja::RaisedException on raise_exception (the request gets a 400); any other tessera::Error
// is the template failing (a 500 "chat_template_error"). Objects keep the client's key order
// (a tool's parameters print as it wrote them, as Python's tojson does).
using ChatRenderer = std::function<RenderedChat(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                                const nlohmann::ordered_json& extra)>;

struct ServedModel {
  std::string name;  // the `model` a request must name (--served-model-name)
  const Tokenizer* tokenizer = nullptr;
  int32_t vocab_size = 0;
  // Prompt + max_tokens of one choice, at most: the scheduler's max_model_len, or less when
  // the whole KV cache holds fewer tokens.
  int32_t max_model_len = 0;
  int max_n = 16;     // most choices per request (EngineConfig::max_n)
  ChatRenderer chat;  // empty: /v1/chat/completions answers 400
  // Structured output (response_format, guided_*): grammars compiled for this vocabulary;
  // null: such a request answers 400.
  const GrammarCompiler* grammar = nullptr;
  // How this model writes tool calls (--tool-call-parser, or detected from its chat template);
  // nullopt: the template has no tool support and no parser was named, so `tools` is a 400.
  std::optional<ToolFormat> tool_format;
  int64_t created = 0;  // unix time the server started (for /v1/models)
};

// Fills the limits from the engine's configuration (max_model_len capped by the KV pool).
void set_engine_limits(ServedModel& model, const EngineConfig& config);

}  // namespace tessera::api
