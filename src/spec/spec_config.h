#pragma once
// --speculative-config: what to speculate with and how far, as vLLM spells it, e.g.
//   {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
//   {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_candidates": 3}  (a tree of up to
//     3 distinct continuations where the engine can verify trees; 1, the default, is a chain)
//   {"method": "draft_model", "model": "smollm2-135m", "num_speculative_tokens": 4, "draft_layers": 6}
//   {"method": "early_exit", "num_speculative_tokens": 4, "draft_layers": 10}
// Contract: docs/design/spec-decode.md.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "spec/drafter.h"

namespace tessera {

// DraftModel: another model (same vocabulary) with its own paged KV; EarlyExit: the target's
// own first draft_layers layers + final norm + head (engine/model_drafter.h builds both).
enum class SpecMethod : uint8_t { None, Ngram, DraftModel, EarlyExit };
std::string_view spec_method_name(SpecMethod m);  // "none", "ngram", "draft_model", "early_exit"

struct SpeculativeConfig {
  SpecMethod method = SpecMethod::None;
  int num_speculative_tokens = 0;    // k: the most draft tokens one sequence verifies per step
  int prompt_lookup_max = 4;         // ngram: longest suffix matched
  int prompt_lookup_min = 2;         // ngram: shortest suffix matched
  int prompt_lookup_candidates = 1;  // ngram: distinct continuations drafted as a tree (1 = a chain)
  std::string draft_model;           // draft_model: the model spec, as -m takes it
  // draft_model: run only the first L layers of the draft (0 = all); early_exit: L, required.
  // Checked against the model's layer count when the drafter is built.
  int draft_layers = 0;
  // No speculation in a step whose running sequences exceed this (0 = never off). Where
  // verification starts to cost more than it saves depends on the device and the model:
  // measure it (docs/benchmarks/spec-decode.md), do not guess it.
  int disable_by_batch_size = 0;
  // k per sequence follows its running acceptance (spec/draft_length.h); off = always k.
  bool adaptive = true;

  bool enabled() const { return method != SpecMethod::None && num_speculative_tokens > 0; }
  // The most draft tokens (tree nodes) one sequence may verify in a step: its logits rows.
  int max_draft_nodes() const {
    if (method != SpecMethod::Ngram || prompt_lookup_candidates <= 1) return num_speculative_tokens;
    return std::max(num_speculative_tokens,
                    std::min(kMaxDraftTreeNodes, prompt_lookup_candidates * num_speculative_tokens));
  }
  // The drafter runs a model: built by the engine (engine/model_drafter.h), not make_drafter.
  bool uses_model() const { return method == SpecMethod::DraftModel || method == SpecMethod::EarlyExit; }
  // Throws tessera::Error naming the field out of range.
  void validate() const;
};

// Parses the JSON object (an empty string = speculation off). Throws tessera::Error naming
// the field that is wrong: unknown keys, wrong types, methods not built.
SpeculativeConfig parse_speculative_config(std::string_view json);
// One line for start-up summaries: "ngram k=4 lookup 2..4 candidates 3", or "off".
std::string describe_speculative_config(const SpeculativeConfig& c);

// The drafter the config names (nullptr when speculation is off). Model drafters need the
// target and are built by the engine: asking for one here is an error.
std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& c);

}  // namespace tessera
