#pragma once
// Endpoint-specific request bodies → a GenerationPlan: /v1/completions (prompt as a string, a
// list of strings, a list of token ids or a list of lists; echo) and /v1/chat/completions
// (messages rendered through the model's chat template). Every refusal is an ApiError.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/api/generation.h"
#include "server/api/served_model.h"

namespace tessera::api {

// The parsed body of POST /v1/completions, everything but tenant, id and time.
GenerationPlan parse_completion_request(const json& body, const ServedModel& model);
// The parsed body of POST /v1/chat/completions.
GenerationPlan parse_chat_request(const json& body, const ServedModel& model);

// Chat messages, checked and normalized for templates: content parts of type "text" are
// joined into one string. Returns the normalized messages and, in user_texts, every text a
// client wrote (for tokenize_chat).
json normalize_messages(const json& messages, std::vector<std::string>& user_texts);

// Renders messages with the model's template: the template's raise_exception (a verdict on the
// messages) is a 400; any other template failure is the server's, a 500 "chat_template_error".
std::string render_chat(const ServedModel& model, const json& messages, bool add_generation_prompt,
                        const json& extra);

// Tokenizes rendered chat text: the template's own special tokens are parsed as such, but text
// a client wrote is always plain text, even where it spells a special token (<|im_start|>).
std::vector<int32_t> tokenize_chat(const Tokenizer& tok, const std::string& rendered,
                                   const std::vector<std::string>& user_texts, bool add_special);

// The `model` field, when given, must name the served model: 404 model_not_found otherwise.
void check_model_name(const json& body, const ServedModel& model);

}  // namespace tessera::api
