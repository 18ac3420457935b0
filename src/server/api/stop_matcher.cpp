#include "server/api/stop_matcher.h"

#include <algorithm>

namespace tessera::api {

StopMatcher::StopMatcher(std::vector<std::string> stops, bool include_stop_in_output)
    : stops_(std::move(stops)), include_(include_stop_in_output) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  for (const std::string& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  if (stops_.empty()) return std::string(text);
  held_.append(text);

  // The match that ends first (the longest on a tie). Only the held tail plus the new text
  // can hold one: released text was checked not to start a match.
  size_t best_at = std::string::npos, best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& s : stops_) {
    const size_t at = held_.find(s);  // a string's first occurrence is also its first end
    if (at == std::string::npos) continue;
    const size_t end = at + s.size();
    if (!best || end < best_end || (end == best_end && at < best_at)) {
      best_at = at;
      best_end = end;
      best = &s;
    }
  }
  if (best) {
    stopped_ = true;
    matched_ = *best;
    std::string out = held_.substr(0, include_ ? best_at + best->size() : best_at);
    held_.clear();
    return out;
  }

  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  const size_t longest = std::min(held_.size(), max_stop_ - 1);
  for (size_t len = longest; len > 0 && keep == 0; --len) {
    const std::string_view tail(held_.data() + held_.size() - len, len);
    for (const std::string& s : stops_)
      if (s.size() > len && std::string_view(s).substr(0, len) == tail) {
        keep = len;
        break;
      }
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  if (stopped_) return {};
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace tessera::api
