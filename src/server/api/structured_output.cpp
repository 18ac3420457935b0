#include "server/api/structured_output.h"

#include "core/error.h"
#include "grammar/grammar.h"
#include "server/api/api_error.h"

namespace tessera::api {

namespace {

constexpr const char* kGuidedFields[] = {"guided_json", "guided_regex", "guided_choice", "guided_grammar"};

// A schema given as an object (or, for guided_json, as a string holding one), as text.
std::string schema_text(const json& schema, const std::string& param) {
  std::string text;
  if (schema.is_object()) {
    text = schema.dump();
  } else if (schema.is_string()) {
    text = schema.get<std::string>();
  } else {
    invalid_param(param, "invalid_type", "'", param, "' must be a JSON schema object, got ", json_type_name(schema));
  }
  if (text.size() > kMaxGrammarBytes)
    invalid_param(param, "invalid_value", "'", param, "' is ", text.size(), " bytes, at most ", kMaxGrammarBytes,
                  " are allowed");
  return text;
}

std::optional<GrammarSpec> response_format(const Fields& body, std::string& param) {
  const json* rf = body.get("response_format");
  if (!rf) return std::nullopt;
  param = "response_format";
  if (!rf->is_object())
    invalid_param(param, "invalid_type", "'response_format' must be an object, got ", json_type_name(*rf));
  const Fields f(*rf, "response_format.");
  const std::optional<std::string> type = f.string("type", 64);
  if (!type) invalid_param("response_format.type", "missing_required_parameter", "'response_format.type' is required");
  if (*type == "text") return std::nullopt;
  if (*type == "json_object") return GrammarSpec{GrammarSpec::Kind::JsonObject, {}, {}};
  if (*type != "json_schema")
    invalid_param("response_format.type", "invalid_value", "'response_format.type' must be 'text', 'json_object' or ",
                  "'json_schema', got '", *type, "'");
  const json* js = f.get("json_schema");
  if (!js)
    invalid_param("response_format.json_schema", "missing_required_parameter",
                  "'response_format.json_schema' is required when the type is 'json_schema'");
  if (!js->is_object())
    invalid_param("response_format.json_schema", "invalid_type",
                  "'response_format.json_schema' must be an object, got ", json_type_name(*js));
  const Fields j(*js, "response_format.json_schema.");
  (void)j.string("name", 256);  // OpenAI requires a name; only its type is checked here
  (void)j.boolean("strict");    // the output always follows the schema, strict or not
  param = "response_format.json_schema.schema";
  const json* schema = j.get("schema");
  // OpenAI's schema is optional: without one the output is any JSON object.
  if (!schema) return GrammarSpec{GrammarSpec::Kind::JsonObject, {}, {}};
  if (!schema->is_object())
    invalid_param(param, "invalid_type", "'", param, "' must be an object, got ", json_type_name(*schema));
  return GrammarSpec{GrammarSpec::Kind::JsonSchema, schema_text(*schema, param), {}};
}

GrammarSpec guided(const Fields& body, const std::string& field) {
  const json& v = *body.get(field);
  if (field == "guided_json") return GrammarSpec{GrammarSpec::Kind::JsonSchema, schema_text(v, field), {}};
  if (field == "guided_choice") {
    if (!v.is_array() || v.empty())
      invalid_param(field, "invalid_type", "'guided_choice' must be a non-empty array of strings, got ",
                    v.is_array() ? "an empty array" : json_type_name(v));
    GrammarSpec spec{GrammarSpec::Kind::Choice, {}, {}};
    size_t bytes = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      if (!v[i].is_string())
        invalid_param(field, "invalid_type", "'guided_choice' entry ", i, " must be a string, got ",
                      json_type_name(v[i]));
      spec.choices.push_back(v[i].get<std::string>());
      bytes += spec.choices.back().size();
    }
    if (bytes > kMaxGrammarBytes)
      invalid_param(field, "invalid_value", "'guided_choice' holds ", bytes, " bytes, at most ", kMaxGrammarBytes,
                    " are allowed");
    return spec;
  }
  const std::optional<std::string> text = body.string(field, kMaxGrammarBytes);
  if (text->empty()) invalid_param(field, "invalid_value", "'", field, "' is empty");
  return GrammarSpec{field == "guided_regex" ? GrammarSpec::Kind::Regex : GrammarSpec::Kind::Ebnf, *text, {}};
}

}  // namespace

std::optional<GrammarSpec> parse_structured_output(const Fields& body, std::string& param) {
  std::string set;  // the guided_* field given, if any
  for (const char* field : kGuidedFields) {
    if (!body.has(field)) continue;
    if (!set.empty())
      invalid_param(field, "invalid_value", "'", set, "' and '", field, "' cannot both be set; choose one");
    set = field;
  }
  std::optional<GrammarSpec> rf = response_format(body, param);
  if (set.empty()) return rf;
  if (rf)
    invalid_param(set, "invalid_value", "'response_format' and '", set,
                  "' cannot both constrain the output; choose one");
  param = set;
  return guided(body, set);
}

std::shared_ptr<const CompiledGrammar> structured_output_grammar(const Fields& body, const GrammarCompiler* compiler) {
  std::string param;
  const std::optional<GrammarSpec> spec = parse_structured_output(body, param);
  if (!spec) return nullptr;
  if (!compiler) invalid_param(param, "unsupported_parameter", "'", param, "': this server has no structured output");
  try {
    return compiler->compile(*spec);
  } catch (const Error& e) {
    invalid_param(param, "invalid_grammar", "'", param, "' cannot be compiled: ", e.what());
  }
}

}  // namespace tessera::api
