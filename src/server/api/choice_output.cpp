#include "server/api/choice_output.h"

namespace tessera::api {

ChoiceOutput::ChoiceOutput(const Tokenizer& tok, std::vector<std::string> stops, bool include_stop_str,
                           bool skip_special)
    : detok_(tok, skip_special), matcher_(std::move(stops), include_stop_str) {}

std::string ChoiceOutput::add_token(int32_t token) {
  if (matcher_.stopped()) return {};
  ++n_tokens_;
  return matcher_.push(detok_.push(token));
}

std::string ChoiceOutput::finish() {
  if (matcher_.stopped()) return {};
  std::string out = matcher_.push(detok_.flush());
  if (!matcher_.stopped()) out += matcher_.flush();
  return out;
}

}  // namespace tessera::api
