// JSON request body -> generation parameters, as the server reads POST /v1/completions and
// /v1/chat/completions: parse_json_body, then the endpoint's parser with SmolLM2's tokenizer
// and chat template. Every input is either refused with an ApiError (a tessera::Error: the
// client gets a 4xx naming the field) or gives a plan whose prompts are in-vocabulary token ids
// with one SamplingParams each. Anything else escaping (nlohmann's exceptions, std::out_of_range)
// would be a 500 or a crash: a finding.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "core/error.h"
#include "fuzz_models.h"
#include "server/api/json_fields.h"
#include "server/api/prompt_input.h"
#include "server/api/served_model.h"
#include "template/chat_template.h"

namespace {
struct Served {
  tessera::fuzz::LoadedTokenizer tok = tessera::fuzz::load_tokenizer(tessera::fuzz::kBpeModel);
  std::shared_ptr<tessera::ChatTemplate> chat;
  tessera::api::ServedModel model;

  Served() {
    const tessera::Tokenizer& t = *tok.tokenizer;
    tessera::ChatTemplateOptions o;
    if (t.bos_id() >= 0) o.bos_token = std::string(t.token_text(t.bos_id()));
    if (t.eos_id() >= 0) o.eos_token = std::string(t.token_text(t.eos_id()));
    chat = std::make_shared<tessera::ChatTemplate>(t.chat_template(), o);
    model.name = "fuzz-model";
    model.tokenizer = &t;
    model.vocab_size = t.vocab_size();
    model.max_model_len = 2048;
    model.max_n = 16;
    model.chat = [c = chat](const nlohmann::json& messages, bool add_generation_prompt, const nlohmann::json& extra) {
      return c->apply_marked(messages, add_generation_prompt, extra);
    };
  }
};

const Served& served() {
  static const Served s;
  return s;
}

void check_plan(const tessera::api::GenerationPlan& plan, const tessera::api::ServedModel& model) {
  if (plan.prompts.empty() || plan.sampling.size() != plan.prompts.size()) __builtin_trap();
  for (const tessera::api::PromptInput& p : plan.prompts)
    for (int32_t id : p.tokens)
      if (id < 0 || id >= model.vocab_size) __builtin_trap();
  for (const tessera::SamplingParams& s : plan.sampling)
    if (s.max_tokens < 0) __builtin_trap();
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  served();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  const tessera::api::ServedModel& model = served().model;
  nlohmann::json json;
  try {
    json = tessera::api::parse_json_body(body);
  } catch (const tessera::Error&) {
    return 0;
  }
  try {
    check_plan(tessera::api::parse_completion_request(json, model), model);
  } catch (const tessera::Error&) {
  }
  try {
    check_plan(tessera::api::parse_chat_request(json, model), model);
  } catch (const tessera::Error&) {
  }
  return 0;
}
