// StopMatcher against a direct reference on the whole text: whatever the cut into tokens, the
// released text is the text before the first-completed stop string, and nothing after it.
#include <gtest/gtest.h>

#include <random>

#include "server/api/stop_matcher.h"

using tessera::api::StopMatcher;

namespace {

// Reference: the stop string that ends first in the whole text (the longest on a tie).
std::string reference(const std::string& text, const std::vector<std::string>& stops, bool include, bool* stopped) {
  size_t best_at = std::string::npos, best_end = std::string::npos, best_len = 0;
  for (const std::string& s : stops)
    for (size_t at = 0; at + s.size() <= text.size(); ++at)
      if (text.compare(at, s.size(), s) == 0) {
        const size_t end = at + s.size();
        if (end < best_end || (end == best_end && at < best_at)) {
          best_at = at;
          best_end = end;
          best_len = s.size();
        }
        break;
      }
  *stopped = best_at != std::string::npos;
  if (!*stopped) return text;
  return text.substr(0, include ? best_at + best_len : best_at);
}

std::string run(const std::vector<std::string>& chunks, const std::vector<std::string>& stops, bool include,
                bool* stopped) {
  StopMatcher m(stops, include);
  std::string out;
  for (const std::string& c : chunks) {
    const std::string piece = m.push(c);
    out += piece;
  }
  if (!m.stopped()) out += m.flush();
  *stopped = m.stopped();
  return out;
}

}  // namespace

TEST(ApiStopMatcher, StopSpanningTokensIsNotLeaked) {
  StopMatcher m({"\nUser:"}, false);
  EXPECT_EQ(m.push("Hello"), "Hello");
  EXPECT_EQ(m.push(" there\n"), " there");  // "\n" could start the stop: held
  EXPECT_EQ(m.push("Us"), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.push("er: more"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "\nUser:");
  EXPECT_EQ(m.push("anything"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(ApiStopMatcher, FalseStartIsReleased) {
  StopMatcher m({"STOP"}, false);
  EXPECT_EQ(m.push("a ST"), "a ");
  EXPECT_EQ(m.held_bytes(), 2u);
  EXPECT_EQ(m.push("OOP"), "STOOP");
  EXPECT_EQ(m.push("S"), "");
  EXPECT_EQ(m.flush(), "S");
  EXPECT_FALSE(m.stopped());
}

TEST(ApiStopMatcher, IncludeStopStringInOutput) {
  StopMatcher m({"END"}, true);
  EXPECT_EQ(m.push("the E"), "the ");
  EXPECT_EQ(m.push("ND and more"), "END");
  EXPECT_TRUE(m.stopped());
}

TEST(ApiStopMatcher, OverlappingStopsFirstCompletedWins) {
  bool stopped = false;
  // "b" completes (at byte 2) before "abc" (byte 3).
  EXPECT_EQ(run({"xab", "c"}, {"abc", "b"}, false, &stopped), "xa");
  EXPECT_EQ(run({"xa", "bc"}, {"abc", "b"}, false, &stopped), "xa");
  // Same end: the longer (earlier start) wins.
  EXPECT_EQ(run({"xabc"}, {"bc", "abc"}, true, &stopped), "xabc");
  EXPECT_EQ(run({"xab", "c"}, {"bc", "abc"}, false, &stopped), "x");
}

TEST(ApiStopMatcher, UnicodeStopsHoldWholeCharacters) {
  // "é" is 2 bytes, "日本" 6: a held prefix always starts at a character boundary.
  StopMatcher m({"日本語"}, false);
  EXPECT_EQ(m.push("café 日"), "café ");
  EXPECT_EQ(m.push("本"), "");
  EXPECT_EQ(m.push("人"), "日本人");
  EXPECT_EQ(m.push("日本語!"), "");
  EXPECT_TRUE(m.stopped());
}

TEST(ApiStopMatcher, NoStopsPassesEverything) {
  StopMatcher m({}, false);
  EXPECT_EQ(m.push("abc"), "abc");
  EXPECT_EQ(m.flush(), "");
}

TEST(ApiStopMatcher, RandomCutsMatchReference) {
  std::mt19937 rng(7);
  const std::vector<std::string> alphabet = {"a", "b", "c", "é", "日", "\n"};
  for (int trial = 0; trial < 2000; ++trial) {
    std::string text;
    const int len = static_cast<int>(rng() % 24);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<std::string> stops;
    const int n_stops = 1 + static_cast<int>(rng() % 3);
    for (int s = 0; s < n_stops; ++s) {
      std::string stop;
      const int slen = 1 + static_cast<int>(rng() % 3);
      for (int i = 0; i < slen; ++i) stop += alphabet[rng() % 4];
      stops.push_back(stop);
    }
    // Cut at random byte positions (tokens need not end on characters).
    std::vector<std::string> chunks;
    size_t pos = 0;
    while (pos < text.size()) {
      const size_t n = 1 + rng() % 4;
      chunks.push_back(text.substr(pos, n));
      pos += n;
    }
    const bool include = rng() % 2;
    bool want_stop = false, got_stop = false;
    const std::string want = reference(text, stops, include, &want_stop);
    const std::string got = run(chunks, stops, include, &got_stop);
    ASSERT_EQ(got, want) << "text '" << text << "' trial " << trial;
    ASSERT_EQ(got_stop, want_stop);
  }
}
