#pragma once
// --speculative-config: what to speculate with and how far, as vLLM spells it, e.g.
//   {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
// Contract: docs/design/spec-decode.md.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "spec/drafter.h"

namespace tessera {

enum class SpecMethod : uint8_t { None, Ngram };
std::string_view spec_method_name(SpecMethod m);  // "none", "ngram"

struct SpeculativeConfig {
  SpecMethod method = SpecMethod::None;
  int num_speculative_tokens = 0;  // k: the most draft tokens one sequence verifies per step
  int prompt_lookup_max = 4;       // ngram: longest suffix matched
  int prompt_lookup_min = 2;       // ngram: shortest suffix matched
  // No speculation in a step whose running sequences exceed this (0 = never off). Where
  // verification starts to cost more than it saves depends on the device and the model:
  // measure it (docs/benchmarks/spec-decode.md), do not guess it.
  int disable_by_batch_size = 0;
  // k per sequence follows its running acceptance (spec/draft_length.h); off = always k.
  bool adaptive = true;

  bool enabled() const { return method != SpecMethod::None && num_speculative_tokens > 0; }
  // Throws tessera::Error naming the field out of range.
  void validate() const;
};

// Parses the JSON object (an empty string = speculation off). Throws tessera::Error naming
// the field that is wrong: unknown keys, wrong types, methods not built.
SpeculativeConfig parse_speculative_config(std::string_view json);
// One line for start-up summaries: "ngram k=4 lookup 2..4", or "off".
std::string describe_speculative_config(const SpeculativeConfig& c);

// The drafter the config names (nullptr when speculation is off).
std::unique_ptr<Drafter> make_drafter(const SpeculativeConfig& c);

}  // namespace tessera
