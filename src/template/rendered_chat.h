#pragma once
// What a chat template renders, for the tokenizer: kept apart from chat_template.h so that the
// server's headers need not see the Jinja interpreter.
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

// A rendered prompt and the byte ranges [begin, end) of it that the template wrote itself (its
// literals and text, bos_token, eos_token), sorted and disjoint: a tokenizer may read special
// tokens there and only there. Every string from messages or extra is data, even where it
// spells <|im_start|>.
struct RenderedChat {
  std::string text;
  std::vector<std::pair<size_t, size_t>> template_spans;
};

}  // namespace tessera
