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

// Chat messages, checked and normalized for templates: roles must be one of kChatRoles, content
// parts of type "text" are joined into one string, and all message text together is at most
// kMaxPromptBytes (checked before any templating or tokenizing).
json normalize_messages(const json& messages);

// The roles a chat message may have; any other is a 400 naming it.
inline constexpr const char* kChatRoles[] = {"system", "user", "assistant", "tool", "developer"};

// chat_template_kwargs, checked: an object of at most kMaxTemplateKwargs keys, none of which
// shadows a variable the server sets (messages, tools, add_generation_prompt, *_token, ...),
// nested at most kMaxTemplateKwargsDepth levels and kMaxTemplateKwargsBytes as JSON.
inline constexpr size_t kMaxTemplateKwargs = 32;
inline constexpr size_t kMaxTemplateKwargsBytes = 64 * 1024;
inline constexpr int kMaxTemplateKwargsDepth = 8;
json parse_template_kwargs(const json* kwargs);

// Renders messages with the model's template: the template's raise_exception (a verdict on the
// messages) is a 400; any other template failure is the server's, a 500 "chat_template_error".
RenderedChat render_chat(const ServedModel& model, const json& messages, bool add_generation_prompt, const json& extra);

// Tokenizes a rendered chat: special tokens are read only in the text the template wrote
// itself; every client string (role, name, content, kwargs) is plain text, even where it spells
// <|im_start|>.
std::vector<int32_t> tokenize_chat(const Tokenizer& tok, const RenderedChat& rendered, bool add_special);

// The `model` field, when given, must name the served model: 404 model_not_found otherwise.
void check_model_name(const json& body, const ServedModel& model);

}  // namespace tessera::api
