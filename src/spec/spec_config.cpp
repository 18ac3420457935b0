#include "spec/spec_config.h"

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "spec/ngram_drafter.h"

namespace tessera {

namespace {

constexpr int kMaxSpeculativeTokens = 32;
constexpr int kMaxLookup = 64;
constexpr int kMaxLookupCandidates = 8;

int int_field(const nlohmann::json& j, const char* key, int fallback) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) fail("--speculative-config: \"", key, "\" must be an integer, got ", it->dump());
  const int64_t v = it->get<int64_t>();
  if (v < INT32_MIN || v > INT32_MAX) fail("--speculative-config: \"", key, "\" = ", v, " is out of range");
  return static_cast<int>(v);
}

}  // namespace

std::string_view spec_method_name(SpecMethod m) {
  switch (m) {
    case SpecMethod::Ngram:
      return "ngram";
    case SpecMethod::DraftModel:
      return "draft_model";
    case SpecMethod::EarlyExit:
      return "early_exit";
    case SpecMethod::None:
      break;
  }
  return "none";
}

void SpeculativeConfig::validate() const {
  if (method == SpecMethod::None) return;
  TESSERA_CHECK(num_speculative_tokens >= 1 && num_speculative_tokens <= kMaxSpeculativeTokens,
                "--speculative-config: num_speculative_tokens = ", num_speculative_tokens, " is outside [1, ",
                kMaxSpeculativeTokens, "]");
  TESSERA_CHECK(prompt_lookup_min >= 1 && prompt_lookup_min <= kMaxLookup,
                "--speculative-config: prompt_lookup_min = ", prompt_lookup_min, " is outside [1, ", kMaxLookup, "]");
  TESSERA_CHECK(prompt_lookup_max >= prompt_lookup_min && prompt_lookup_max <= kMaxLookup,
                "--speculative-config: prompt_lookup_max = ", prompt_lookup_max,
                " is outside [prompt_lookup_min = ", prompt_lookup_min, ", ", kMaxLookup, "]");
  TESSERA_CHECK(prompt_lookup_candidates >= 1 && prompt_lookup_candidates <= kMaxLookupCandidates,
                "--speculative-config: prompt_lookup_candidates = ", prompt_lookup_candidates, " is outside [1, ",
                kMaxLookupCandidates, "]");
  TESSERA_CHECK(draft_layers >= 0, "--speculative-config: draft_layers = ", draft_layers, " is negative");
  if (method == SpecMethod::DraftModel)
    TESSERA_CHECK(!draft_model.empty(),
                  "--speculative-config: method \"draft_model\" needs \"model\" (a model spec, "
                  "as -m takes it)");
  if (method == SpecMethod::EarlyExit)
    TESSERA_CHECK(draft_layers >= 1,
                  "--speculative-config: method \"early_exit\" needs \"draft_layers\" >= 1 (the "
                  "target's first layers the drafter runs)");
  TESSERA_CHECK(disable_by_batch_size >= 0, "--speculative-config: disable_by_batch_size = ", disable_by_batch_size,
                " is negative");
}

SpeculativeConfig parse_speculative_config(std::string_view text) {
  SpeculativeConfig c;
  if (text.empty()) return c;
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    fail("--speculative-config is not valid JSON: ", e.what());
  }
  if (!j.is_object()) fail("--speculative-config must be a JSON object, got ", j.dump());
  static constexpr const char* kKnown[] = {"method",
                                           "num_speculative_tokens",
                                           "prompt_lookup_max",
                                           "prompt_lookup_min",
                                           "prompt_lookup_candidates",
                                           "disable_by_batch_size",
                                           "adaptive",
                                           "model",
                                           "draft_layers"};
  for (const auto& [key, value] : j.items()) {
    bool known = false;
    for (const char* k : kKnown) known = known || key == k;
    if (!known)
      fail("--speculative-config: unknown key \"", key,
           "\" (known: method, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min, "
           "prompt_lookup_candidates, disable_by_batch_size, adaptive, model, draft_layers)");
  }
  const auto method = j.find("method");
  if (method == j.end() || !method->is_string())
    fail(
        "--speculative-config: \"method\" is required and must be a string (supported: \"ngram\", \"draft_model\", "
        "\"early_exit\")");
  const std::string m = method->get<std::string>();
  constexpr const char* kSupported = "supported: \"ngram\", \"draft_model\", \"early_exit\"";
  if (m == "ngram") {
    c.method = SpecMethod::Ngram;
  } else if (m == "draft_model") {
    c.method = SpecMethod::DraftModel;
  } else if (m == "early_exit") {
    c.method = SpecMethod::EarlyExit;
  } else if (m == "eagle" || m == "eagle3" || m == "medusa" || m == "mlp_speculator") {
    fail("--speculative-config: method \"", m, "\" is not built yet; ", kSupported);
  } else {
    fail("--speculative-config: unknown method \"", m, "\"; ", kSupported);
  }
  if (const auto model = j.find("model"); model != j.end() && !model->is_null()) {
    if (!model->is_string() || model->get<std::string>().empty())
      fail("--speculative-config: \"model\" must be a model spec string (as -m takes it), got ", model->dump());
    if (c.method != SpecMethod::DraftModel)
      fail("--speculative-config: \"model\" is only for method \"draft_model\" (early_exit drafts with the target)");
    c.draft_model = model->get<std::string>();
  }
  c.draft_layers = int_field(j, "draft_layers", 0);
  if (c.draft_layers != 0 && !c.uses_model())
    fail("--speculative-config: \"draft_layers\" is only for methods \"draft_model\" and \"early_exit\"");
  if (!j.contains("num_speculative_tokens"))
    fail("--speculative-config: \"num_speculative_tokens\" is required (the draft tokens verified per step)");
  c.num_speculative_tokens = int_field(j, "num_speculative_tokens", 0);
  c.prompt_lookup_max = int_field(j, "prompt_lookup_max", c.prompt_lookup_max);
  // vLLM: a lone prompt_lookup_max sets the minimum to the same value only if it is smaller.
  c.prompt_lookup_min = int_field(j, "prompt_lookup_min", std::min(c.prompt_lookup_min, c.prompt_lookup_max));
  c.prompt_lookup_candidates = int_field(j, "prompt_lookup_candidates", 1);
  if (c.prompt_lookup_candidates != 1 && c.method != SpecMethod::Ngram)
    fail("--speculative-config: \"prompt_lookup_candidates\" is only for method \"ngram\"");
  c.disable_by_batch_size = int_field(j, "disable_by_batch_size", 0);
  if (const auto a = j.find("adaptive"); a != j.end()) {
    if (!a->is_boolean()) fail("--speculative-config: \"adaptive\" must be true or false, got ", a->dump());
    c.adaptive = a->get<bool>();
  }
  c.validate();
  return c;
}

std::string describe_speculative_config(const SpeculativeConfig& c) {
  if (!c.enabled()) return "off";
  std::string s = std::string(spec_method_name(c.method));
  if (c.method == SpecMethod::DraftModel) s += " " + c.draft_model;
  if (c.draft_layers > 0) s += " layers " + std::to_string(c.draft_layers);
  s += " k=" + std::to_string(c.num_speculative_tokens);
  if (c.method == SpecMethod::Ngram)
    s += " lookup " + std::to_string(c.prompt_lookup_min) + ".." + std::to_string(c.prompt_lookup_max);
  if (c.method == SpecMethod::Ngram && c.prompt_lookup_candidates > 1)
    s += " candidates " + std::to_string(c.prompt_lookup_candidates);
  if (c.adaptive) s += " adaptive";
  if (c.disable_by_batch_size > 0) s += " off above " + std::to_string(c.disable_by_batch_size) + " seqs";
  return s;
}

std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& c) {
  c.validate();
  if (!c.enabled()) return nullptr;
  if (c.uses_model())
    fail("--speculative-config: method \"", spec_method_name(c.method),
         "\" runs a model; its drafter is built with the target (ModelEngine), not by make_drafter");
  return std::make_unique<NgramDrafter>(NgramDrafterConfig{.prompt_lookup_min = c.prompt_lookup_min,
                                                           .prompt_lookup_max = c.prompt_lookup_max,
                                                           .candidates = c.prompt_lookup_candidates});
}

}  // namespace tessera
