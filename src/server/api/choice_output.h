#pragma once
// One choice's output as the client sees it: engine tokens through the incremental
// detokenizer (never broken UTF-8) and then the stop-string matcher (never a leaked stop
// string). Streaming and complete responses both read text from here.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sample/sampler.h"
#include "server/api/stop_matcher.h"
#include "tokenizer/detokenizer.h"

namespace tessera::api {

class ChoiceOutput {
 public:
  ChoiceOutput(const Tokenizer& tok, std::vector<std::string> stops, bool include_stop_str, bool skip_special);

  // One output token; returns the text it released (possibly empty). After a stop string
  // matched, stopped() is true and further tokens are ignored.
  std::string add_token(int32_t token);
  // The engine ended the choice (EOS, stop token, length, abort): whatever is still held.
  std::string finish();

  bool stopped() const { return matcher_.stopped(); }
  // The stop string that ended the choice ("" if none did).
  const std::string& matched_stop() const { return matcher_.matched(); }
  int64_t n_tokens() const { return n_tokens_; }

 private:
  IncrementalDetokenizer detok_;
  StopMatcher matcher_;
  int64_t n_tokens_ = 0;
};

}  // namespace tessera::api
