#include "server/api/tool_request.h"

#include <set>

#include "core/error.h"
#include "grammar/grammar.h"
#include "server/api/api_error.h"

namespace tessera::api {

namespace {

bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > kMaxToolNameBytes) return false;
  for (const char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  return true;
}

// One entry of `tools`: {"type": "function", "function": {"name", "description"?,
// "parameters"?, "strict"?}}; returns its name.
std::string check_tool(const json& tool, const std::string& param) {
  if (!tool.is_object())
    invalid_param(param, "invalid_type", "'", param, "' must be an object, got ", json_type_name(tool));
  const Fields t(tool, param + ".");
  const std::optional<std::string> type = t.string("type", 64);
  if (!type) invalid_param(param + ".type", "missing_required_parameter", "'", param, ".type' is required");
  if (*type != "function")
    invalid_param(param + ".type", "invalid_value", "'", param, ".type' must be 'function', got '", *type, "'");
  const json* fn = t.get("function");
  const std::string fparam = param + ".function";
  if (!fn) invalid_param(fparam, "missing_required_parameter", "'", fparam, "' is required");
  if (!fn->is_object())
    invalid_param(fparam, "invalid_type", "'", fparam, "' must be an object, got ", json_type_name(*fn));
  const Fields f(*fn, fparam + ".");
  const std::optional<std::string> name = f.string("name", 1024);
  if (!name) invalid_param(fparam + ".name", "missing_required_parameter", "'", fparam, ".name' is required");
  if (!valid_tool_name(*name))
    invalid_param(fparam + ".name", "invalid_value", "'", fparam, ".name' is ", json(*name).dump(),
                  "; a function name is 1 to ", kMaxToolNameBytes, " characters of a-z, A-Z, 0-9, _ and -");
  (void)f.string("description", kMaxToolsBytes);
  (void)f.boolean("strict");
  if (const json* params = f.get("parameters")) {
    if (!params->is_object())
      invalid_param(fparam + ".parameters", "invalid_type", "'", fparam,
                    ".parameters' must be a JSON schema object, got ", json_type_name(*params));
    if (params->contains("type") && !(*params)["type"].is_string() && !(*params)["type"].is_array())
      invalid_param(fparam + ".parameters", "invalid_value", "'", fparam,
                    ".parameters.type' must be a string or an array of strings");
  }
  return *name;
}

ToolChoice parse_choice(const Fields& body, const std::set<std::string>& names, std::string& named) {
  const json* v = body.get("tool_choice");
  const bool have_tools = !names.empty();
  if (!v) return have_tools ? ToolChoice::Auto : ToolChoice::None;
  if (v->is_string()) {
    const std::string s = v->get<std::string>();
    if (s == "none") return ToolChoice::None;
    if (s != "auto" && s != "required")
      invalid_param("tool_choice", "invalid_value", "'tool_choice' must be 'none', 'auto', 'required' or ",
                    "{\"type\": \"function\", \"function\": {\"name\": ...}}, got ", v->dump());
    if (s == "auto") return have_tools ? ToolChoice::Auto : ToolChoice::None;
    if (!have_tools)
      invalid_param("tool_choice", "invalid_value", "'tool_choice' is 'required' but the request has no 'tools'");
    return ToolChoice::Required;
  }
  if (!v->is_object())
    invalid_param("tool_choice", "invalid_type", "'tool_choice' must be a string or an object, got ",
                  json_type_name(*v));
  const Fields c(*v, "tool_choice.");
  const std::optional<std::string> type = c.string("type", 64);
  if (type != "function") invalid_param("tool_choice.type", "invalid_value", "'tool_choice.type' must be 'function'");
  const json* fn = c.get("function");
  if (!fn || !fn->is_object())
    invalid_param("tool_choice.function", fn ? "invalid_type" : "missing_required_parameter",
                  "'tool_choice.function' must be an object with the function's name");
  const std::optional<std::string> name = Fields(*fn, "tool_choice.function.").string("name", 1024);
  if (!name)
    invalid_param("tool_choice.function.name", "missing_required_parameter", "'tool_choice.function.name' is required");
  if (!names.contains(*name))
    invalid_param("tool_choice.function.name", "invalid_value", "'tool_choice' names the function ", json(*name).dump(),
                  ", which is not in 'tools'");
  named = *name;
  return ToolChoice::Named;
}

// The text a call in `format` starts with, up to its arguments object, and what ends it.
std::pair<std::string, std::string> call_wrapper(ToolFormat format, const std::string& name) {
  const std::string quoted = json(name).dump();
  switch (format) {
    case ToolFormat::Hermes:
      return {"<tool_call>\n{\"name\": " + quoted + ", \"arguments\": ", "}\n</tool_call>"};
    case ToolFormat::Llama3Json:
      return {"{\"name\": " + quoted + ", \"parameters\": ", "}"};
    case ToolFormat::Mistral:
      return {"{\"name\": " + quoted + ", \"arguments\": ", "}"};
  }
  return {};
}

const json& parameters_of(const json& tool) {
  static const json kAnyObject = {{"type", "object"}};
  const json& fn = tool["function"];
  return fn.contains("parameters") && fn["parameters"].is_object() ? fn["parameters"] : kAnyObject;
}

// One structural-tag `tag` per function the request may call: the format's wrapper around
// its parameters schema.
json call_tags(const ToolRequest& request, ToolFormat format) {
  json tags = json::array();
  for (const json& tool : request.tools) {
    const std::string name = tool["function"]["name"].get<std::string>();
    if (request.choice == ToolChoice::Named && name != request.named) continue;
    const auto [begin, end] = call_wrapper(format, name);
    // One space at most between JSON tokens: a small model at temperature 1 otherwise runs
    // into whitespace until max_tokens cuts the call short.
    tags.push_back(
        {{"type", "tag"},
         {"begin", begin},
         {"content", {{"type", "json_schema"}, {"json_schema", parameters_of(tool)}, {"max_whitespace_cnt", 1}}},
         {"end", end}});
  }
  return tags;
}

}  // namespace

ToolRequest parse_tool_request(const Fields& body) {
  for (const char* legacy : {"functions", "function_call"})
    if (body.has(legacy))
      throw ApiError(400,
                     detail::concat("'", legacy, "' is deprecated and not supported; use 'tools' and 'tool_choice'"),
                     "invalid_request_error", std::string(legacy), "unsupported_parameter");
  ToolRequest r;
  std::set<std::string> names;
  if (const json* tools = body.get("tools")) {
    if (!tools->is_array())
      invalid_param("tools", "invalid_type", "'tools' must be an array of tools, got ", json_type_name(*tools));
    if (tools->size() > kMaxTools)
      invalid_param("tools", "invalid_value", "'tools' has ", tools->size(), " tools, at most ", kMaxTools,
                    " are allowed");
    const size_t bytes = tools->dump().size();
    if (bytes > kMaxToolsBytes)
      invalid_param("tools", "invalid_value", "'tools' is ", bytes, " bytes as JSON, at most ", kMaxToolsBytes,
                    " are allowed");
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string param = "tools[" + std::to_string(i) + "]";
      const std::string name = check_tool((*tools)[i], param);
      if (!names.insert(name).second)
        invalid_param(param + ".function.name", "invalid_value", "'tools' names the function ", json(name).dump(),
                      " twice");
    }
    if (!tools->empty()) r.tools = *tools;
  }
  r.choice = parse_choice(body, names, r.named);
  r.parallel = body.boolean("parallel_tool_calls").value_or(true);
  return r;
}

std::optional<GrammarSpec> tool_call_grammar(const ToolRequest& request, ToolFormat format) {
  if (!request.constrained()) return std::nullopt;
  json tags = call_tags(request, format);
  const bool one = request.choice == ToolChoice::Named || !request.parallel;
  const char* separator = format == ToolFormat::Hermes ? "\n" : format == ToolFormat::Llama3Json ? "; " : ", ";
  json calls = {{"type", "tags_with_separator"},
                {"tags", std::move(tags)},
                {"separator", separator},
                {"at_least_one", true},
                {"stop_after_first", one}};
  // Mistral's [TOOL_CALLS] is a control token, which grammars never produce: the list alone.
  json format_json = format == ToolFormat::Mistral ? json{{"type", "sequence"},
                                                          {"elements",
                                                           {{{"type", "const_string"}, {"value", "["}},
                                                            std::move(calls),
                                                            {{"type", "const_string"}, {"value", "]"}}}}}
                                                   : std::move(calls);
  return GrammarSpec{GrammarSpec::Kind::StructuralTag,
                     json{{"type", "structural_tag"}, {"format", std::move(format_json)}}.dump(),
                     {}};
}

std::optional<GrammarSpec> auto_tool_call_grammar(const ToolRequest& request, ToolFormat format) {
  if (request.choice != ToolChoice::Auto || request.tools.is_null() || request.tools.empty() ||
      format != ToolFormat::Hermes)
    return std::nullopt;
  json triggered = {{"type", "triggered_tags"},
                    {"triggers", {"<tool_call>"}},
                    {"tags", call_tags(request, format)},
                    {"at_least_one", false},
                    {"stop_after_first", !request.parallel}};
  return GrammarSpec{
      GrammarSpec::Kind::StructuralTag, json{{"type", "structural_tag"}, {"format", std::move(triggered)}}.dump(), {}};
}

std::shared_ptr<const CompiledGrammar> auto_tool_call_compiled_grammar(const ToolRequest& request, ToolFormat format,
                                                                       const GrammarCompiler* compiler) {
  const std::optional<GrammarSpec> spec = auto_tool_call_grammar(request, format);
  if (!spec || !compiler) return nullptr;
  try {
    return compiler->compile(*spec);
  } catch (const Error&) {
    return nullptr;
  }
}

std::shared_ptr<const CompiledGrammar> tool_call_compiled_grammar(const ToolRequest& request, ToolFormat format,
                                                                  const GrammarCompiler* compiler) {
  const std::optional<GrammarSpec> spec = tool_call_grammar(request, format);
  if (!spec) return nullptr;
  if (!compiler)
    invalid_param("tool_choice", "unsupported_parameter",
                  "'tool_choice' required or a named function needs structured output, which this server lacks");
  // Each schema alone first, so that a bad one is named.
  for (size_t i = 0; i < request.tools.size(); ++i) {
    const json& tool = request.tools[i];
    if (request.choice == ToolChoice::Named && tool["function"]["name"] != request.named) continue;
    const std::string param = "tools[" + std::to_string(i) + "].function.parameters";
    try {
      (void)compiler->compile(GrammarSpec{GrammarSpec::Kind::JsonSchema, parameters_of(tool).dump(), {}});
    } catch (const Error& e) {
      invalid_param(param, "invalid_grammar", "'", param, "' cannot be compiled: ", e.what());
    }
  }
  try {
    return compiler->compile(*spec);
  } catch (const Error& e) {
    invalid_param("tools", "invalid_grammar", "the tool-call grammar cannot be compiled: ", e.what());
  }
}

size_t normalize_tool_calls(json& message, const std::string& param) {
  size_t bytes = 0;
  const Fields m(message, param + ".");
  if (const json* id = m.get("tool_call_id"); id && !id->is_string())
    invalid_param(param + ".tool_call_id", "invalid_type", "'", param, ".tool_call_id' must be a string");
  const json* calls = m.get("tool_calls");
  if (!calls) return 0;
  const std::string cparam = param + ".tool_calls";
  if (message["role"] != "assistant")
    invalid_param(cparam, "invalid_value", "'", cparam, "' is only allowed in assistant messages");
  if (!calls->is_array())
    invalid_param(cparam, "invalid_type", "'", cparam, "' must be an array, got ", json_type_name(*calls));
  if (calls->size() > kMaxTools)
    invalid_param(cparam, "invalid_value", "'", cparam, "' has ", calls->size(), " calls, at most ", kMaxTools);
  json out = json::array();
  for (size_t k = 0; k < calls->size(); ++k) {
    const std::string p = cparam + "[" + std::to_string(k) + "]";
    json call = (*calls)[k];
    if (!call.is_object()) invalid_param(p, "invalid_type", "'", p, "' must be an object, got ", json_type_name(call));
    const Fields c(call, p + ".");
    if (const std::optional<std::string> type = c.string("type", 64); type && *type != "function")
      invalid_param(p + ".type", "invalid_value", "'", p, ".type' must be 'function'");
    (void)c.string("id", 1024);
    const json* fn = c.get("function");
    if (!fn || !fn->is_object())
      invalid_param(p + ".function", "invalid_type", "'", p, ".function' must be an object with name and arguments");
    const Fields f(*fn, p + ".function.");
    const std::optional<std::string> name = f.string("name", 1024);
    if (!name) invalid_param(p + ".function.name", "missing_required_parameter", "'", p, ".function.name' is required");
    bytes += name->size();
    json& args = call["function"]["arguments"];
    const std::string aparam = p + ".function.arguments";
    if (args.is_null()) {
      args = json::object();
    } else if (args.is_string()) {
      const std::string& text = args.get_ref<const std::string&>();
      bytes += text.size();
      json parsed = json::parse(text, nullptr, false);
      if (!parsed.is_object())
        invalid_param(aparam, "invalid_value", "'", aparam, "' must be a JSON object (as a string), got ",
                      json(text.substr(0, 64)).dump());
      args = std::move(parsed);
    } else if (args.is_object()) {
      bytes += args.dump().size();
    } else {
      invalid_param(aparam, "invalid_type", "'", aparam, "' must be a JSON string, got ", json_type_name(args));
    }
    out.push_back(std::move(call));
  }
  message["tool_calls"] = std::move(out);
  return bytes;
}

}  // namespace tessera::api
