// One RequestProgress per request: the stream publishes immutable snapshots that the engine
// and the server share, never copies that drift apart.
#include <gtest/gtest.h>

#include "engine/request.h"

namespace tessera {
namespace {

TEST(RequestProgress, PublishedSnapshotsAreSharedAndNeverChanged) {
  RequestStream stream(1);
  const auto empty = stream.progress();
  ASSERT_NE(empty, nullptr);
  EXPECT_FALSE(empty->scheduled_at.has_value());
  // Two readers see the same object, not copies.
  EXPECT_EQ(stream.progress().get(), stream.progress().get());

  const auto at = std::chrono::steady_clock::now();
  stream.update_progress([&](RequestProgress& p) {
    p.scheduled_at = at;
    p.cached_prompt_tokens = 16;
  });
  const auto scheduled = stream.progress();
  EXPECT_NE(scheduled.get(), empty.get());
  EXPECT_FALSE(empty->scheduled_at.has_value());  // a reader's kept snapshot is untouched
  ASSERT_TRUE(scheduled->scheduled_at.has_value());
  EXPECT_EQ(*scheduled->scheduled_at, at);

  // A later edit keeps the earlier fields (it applies to the current progress).
  auto entries = std::make_shared<const std::vector<Logprobs>>(2);
  stream.update_progress([&](RequestProgress& p) { p.prompt_logprobs = entries; });
  const auto both = stream.progress();
  EXPECT_EQ(both->cached_prompt_tokens, 16);
  EXPECT_EQ(both->prompt_logprobs, entries);
  EXPECT_EQ(scheduled->prompt_logprobs, nullptr);
}

}  // namespace
}  // namespace tessera
