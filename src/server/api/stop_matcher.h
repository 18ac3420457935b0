#pragma once
// Stop strings, matched on the output text as it streams. Text that might be the start of a
// stop string is held back until it can no longer be, so a stop string that spans several
// tokens is never leaked to the client. On a match the text before it is released (and the
// stop string itself with include_stop_str_in_output), and nothing after it ever is.
//
// The stop string that is complete first wins: the match that ends earliest in the text (on a
// tie, the one that starts earliest, i.e. the longest). This depends only on the whole text,
// never on how it was cut into tokens.
// Matching is on bytes: both the text and the stop strings are valid UTF-8, so a match or a
// held-back prefix always starts on a character boundary.
#include <string>
#include <string_view>
#include <vector>

namespace tessera::api {

class StopMatcher {
 public:
  StopMatcher(std::vector<std::string> stops, bool include_stop_in_output);

  // Appends text; returns what can be released now. After a match: stopped() is true, the
  // text up to (or through) the stop string has been released, and later calls return "".
  std::string push(std::string_view text);
  // The end of the output without a match: everything held back.
  std::string flush();

  bool stopped() const { return stopped_; }
  // The stop string that matched ("" if none).
  const std::string& matched() const { return matched_; }
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  bool include_;
  size_t max_stop_ = 0;
  std::string held_;  // released text never re-enters; this is only the undecided tail
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace tessera::api
