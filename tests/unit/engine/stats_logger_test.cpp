// The periodic stats line: rates from counter differences over the interval, queue counts
// (swapped apart from waiting), KV usage, the prefix hit rate of the interval (or since
// start when it made no lookup), silence while idle, and the thread's cadence.
#include "engine/stats_logger.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <vector>

using namespace tessera;

namespace {
EngineStats busy() {
  EngineStats s;
  s.scheduled_tokens = 1000;
  s.prompt_tokens = 800;
  s.generated_tokens = 200;
  s.running = 3;
  s.waiting = 5;
  s.swapped = 2;
  s.kv_total_blocks = 200;
  s.kv_free_blocks = 150;
  s.prefix.queried_tokens = 1000;
  s.prefix.hit_tokens = 250;
  return s;
}
}  // namespace

TEST(StatsLogger, LineHasRatesQueuesUsageAndHitRate) {
  const EngineStats before = busy();
  EngineStats after = before;
  after.scheduled_tokens += 3000;
  after.prompt_tokens += 2000;
  after.generated_tokens += 500;
  after.prefix.queried_tokens += 2000;
  after.prefix.hit_tokens += 1500;
  EXPECT_EQ(format_stats_line(before, after, 10.0),
            "prompt throughput 200.0 tokens/s, generation throughput 50.0 tokens/s, running 3, waiting 3, "
            "swapped 2 sequences, KV cache usage 25.0% (50 of 200 blocks), prefix cache hit rate 75.0%");
  after.kv_window_total_blocks = 40;  // a sliding-window pool: its usage follows the main one's
  after.kv_window_free_blocks = 10;
  EXPECT_NE(format_stats_line(before, after, 10.0)
                .find("KV cache usage 25.0% (50 of 200 blocks), window pool 75.0% (30 of 40 blocks), prefix"),
            std::string::npos);
}

TEST(StatsLogger, WithoutLookupsTheHitRateIsSinceStart) {
  const EngineStats s = busy();
  const std::string line = format_stats_line(s, s, 10.0);
  EXPECT_NE(line.find("prefix cache hit rate 25.0%"), std::string::npos) << line;
  EXPECT_NE(line.find("prompt throughput 0.0 tokens/s"), std::string::npos) << line;
}

TEST(StatsLogger, SilentWhileIdle) {
  StatsLineMaker maker;
  const auto t0 = std::chrono::steady_clock::time_point{};
  EngineStats idle;
  idle.kv_total_blocks = idle.kv_free_blocks = 10;
  EXPECT_FALSE(maker.tick(idle, t0));  // the first tick only starts an interval
  EXPECT_FALSE(maker.tick(idle, t0 + std::chrono::seconds(10)));
  EngineStats work = idle;
  work.scheduled_tokens = 40;
  work.generated_tokens = 40;
  const auto line = maker.tick(work, t0 + std::chrono::seconds(20));
  ASSERT_TRUE(line);
  EXPECT_NE(line->find("generation throughput 4.0 tokens/s"), std::string::npos) << *line;
  // Finished in that interval: the next one is idle again.
  EXPECT_FALSE(maker.tick(work, t0 + std::chrono::seconds(30)));
  // A request waiting with nothing computed is activity.
  EngineStats queued = work;
  queued.waiting = 1;
  EXPECT_TRUE(maker.tick(queued, t0 + std::chrono::seconds(40)));
}

TEST(StatsLogger, PeriodicLoggerWritesAtItsIntervalAndStops) {
  std::atomic<int64_t> tokens{0};
  std::mutex mutex;
  std::vector<std::string> lines;
  {
    PeriodicStatsLogger logger(
        std::chrono::milliseconds(20),
        [&] {
          EngineStats s;
          s.scheduled_tokens = s.generated_tokens = tokens.fetch_add(10) + 10;  // always busy
          return s;
        },
        [&](const std::string& line) {
          std::lock_guard lock(mutex);
          lines.push_back(line);
        });
    for (int i = 0; i < 500; ++i) {
      {
        std::lock_guard lock(mutex);
        if (lines.size() >= 3) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }  // joins
  std::lock_guard lock(mutex);
  ASSERT_GE(lines.size(), 3u);
  EXPECT_NE(lines[0].find("generation throughput"), std::string::npos) << lines[0];
}
