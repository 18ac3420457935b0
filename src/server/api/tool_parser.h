#pragma once
// Tool calls in model output: the markup a model writes when it calls a function, parsed into
// OpenAI's message.tool_calls, incrementally (streaming deltas) or all at once. Formats:
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, possibly several
//                (Hermes, Qwen2.5, Qwen3)
//   llama3_json  {"name": ..., "parameters": {...}} at the start of the output, optionally after
//                <|python_tag|>, several separated by ';' (Llama 3.1-3.3)
//   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (the marker is a control
//                token, dropped when special tokens are skipped, so a bare leading '[' counts too)
// Text outside the calls is content. A call whose JSON is malformed is not a call: a complete
// parse then returns the whole text as content (docs/design/openai-api.md, "Tool calling").
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::api {

enum class ToolFormat : uint8_t { Hermes, Llama3Json, Mistral };

// "hermes", "llama3_json", "mistral" (vLLM's --tool-call-parser names).
std::optional<ToolFormat> tool_format_from_name(std::string_view name);
std::string_view tool_format_name(ToolFormat format);
// The format a chat template prompts its model for, from the markers its text spells; Hermes
// when it spells none (the most common). nullopt when the template does not render the tools
// it is given (renders_tools: ChatTemplate::renders_tools): it has no tool support, and its
// model was never told how to call one.
std::optional<ToolFormat> detect_tool_format(std::string_view template_source, bool renders_tools);

// "call_" and 24 random alphanumerics, as vLLM writes ids.
std::string make_tool_call_id();

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, as text (the model's own spelling)
};

// One streamed piece of a call: the first carries id and name (arguments ""), later ones
// argument fragments; joined, the fragments are the call's arguments.
struct ToolCallDelta {
  int index = 0;
  bool first = false;
  std::string id, name;  // first only
  std::string arguments;
};

struct ToolParserOutput {
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return content.empty() && calls.empty(); }
};

// Feeds on a choice's text as it is released and says what is content and what is a call.
// Text that may be the start of a marker (or whitespace that may precede one) is held back
// until it is known, so markup never reaches content.
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolFormat format);
  ToolParserOutput push(std::string_view text);
  // The output ended: what was held back. An unfinished call becomes content if nothing of
  // it was sent yet.
  ToolParserOutput finish();

  const std::vector<ToolCall>& calls() const { return calls_; }  // complete, well-formed
  // A call was malformed (or cut short) after its first delta had been sent.
  bool broken() const { return broken_; }
  // A call was malformed or unfinished at all (sent or not).
  bool malformed() const { return malformed_; }

 private:
  enum class Mode : uint8_t { Content, BeforeCall, InCall, AfterCall };
  void step(ToolParserOutput& out, bool final);
  bool step_content(ToolParserOutput& out, bool final);
  bool step_between(ToolParserOutput& out, bool final);
  bool step_call(ToolParserOutput& out);
  void emit_content(ToolParserOutput& out, std::string_view text, bool before_marker);
  void enter_calls(ToolParserOutput& out);
  void end_calls();
  void finish_call(ToolParserOutput& out);
  void fail_call(ToolParserOutput& out);
  void stream_arguments(ToolParserOutput& out);

  ToolFormat format_;
  Mode mode_ = Mode::Content;
  std::string buf_;         // text not yet consumed
  std::string pending_ws_;  // content whitespace held back (dropped before a marker)
  std::string raw_;         // the markup of the current call block, for a failed call
  bool at_start_ = true;    // nothing but whitespace so far
  bool skip_ws_ = false;    // after a call block: leading whitespace is dropped
  bool in_list_ = false;    // mistral: inside [ ... ]
  bool broken_ = false, malformed_ = false;
  std::vector<ToolCall> calls_;
  struct ScanState {  // the call object being read
    std::string text;
    int depth = 0;
    bool in_str = false, esc = false, expect_key = false, value_next = false, key_str = false;
    size_t str_start = 0;
    std::string key;
    int value_of = 0;  // 0 other, 1 name, 2 arguments
    size_t args_start = std::string::npos, args_end = std::string::npos;
    bool args_open = false, args_container = false;
    std::optional<std::string> name;
    bool started = false;
    size_t sent = 0;  // argument bytes sent
    std::string id;
  } scan_;
};

// A complete output, parsed at once: the same rules as streaming. A malformed call makes the
// whole text content, with no calls.
struct ParsedToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedToolOutput parse_tool_output(ToolFormat format, std::string_view text);

}  // namespace tessera::api
