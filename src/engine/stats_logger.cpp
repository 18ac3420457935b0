#include "engine/stats_logger.h"

#include <cstdio>

namespace tessera {

namespace {
double percent(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }
}  // namespace

bool stats_active(const EngineStats& before, const EngineStats& after) {
  return after.scheduled_tokens != before.scheduled_tokens || after.running > 0 || after.waiting > 0;
}

std::string format_stats_line(const EngineStats& before, const EngineStats& after, double seconds) {
  const double s = seconds > 0 ? seconds : 1.0;
  const double prompt_tps = static_cast<double>(after.prompt_tokens - before.prompt_tokens) / s;
  const double gen_tps = static_cast<double>(after.generated_tokens - before.generated_tokens) / s;
  const int used = after.kv_total_blocks - after.kv_free_blocks;
  // The hit rate of this interval's lookups; without any, the rate since start.
  const int64_t queried = after.prefix.queried_tokens - before.prefix.queried_tokens;
  const double hit_rate = queried > 0 ? percent(static_cast<double>(after.prefix.hit_tokens - before.prefix.hit_tokens),
                                                static_cast<double>(queried))
                                      : 100.0 * after.prefix.hit_ratio();
  char window[96] = "";
  if (after.kv_window_total_blocks > 0) {
    const int w_used = after.kv_window_total_blocks - after.kv_window_free_blocks;
    std::snprintf(window, sizeof window, ", window pool %.1f%% (%d of %d blocks)",
                  percent(w_used, after.kv_window_total_blocks), w_used, after.kv_window_total_blocks);
  }
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "prompt throughput %.1f tokens/s, generation throughput %.1f tokens/s, running %zu, waiting %zu, "
                "swapped %zu sequences, KV cache usage %.1f%% (%d of %d blocks)%s, prefix cache hit rate %.1f%%",
                prompt_tps, gen_tps, after.running, after.waiting - after.swapped, after.swapped,
                percent(used, after.kv_total_blocks), used, after.kv_total_blocks, window, hit_rate);
  return buf;
}

std::optional<std::string> StatsLineMaker::tick(const EngineStats& now, std::chrono::steady_clock::time_point t) {
  std::optional<std::string> line;
  if (last_ && stats_active(*last_, now))
    line = format_stats_line(*last_, now, std::chrono::duration<double>(t - last_t_).count());
  last_ = now;
  last_t_ = t;
  return line;
}

PeriodicStatsLogger::PeriodicStatsLogger(std::chrono::milliseconds interval, std::function<EngineStats()> source,
                                         std::function<void(const std::string&)> sink)
    : interval_(interval), source_(std::move(source)), sink_(std::move(sink)) {
  maker_.tick(source_(), std::chrono::steady_clock::now());
  thread_ = std::thread([this] { run(); });
}

PeriodicStatsLogger::~PeriodicStatsLogger() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void PeriodicStatsLogger::run() {
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, interval_, [this] { return stop_; })) {
    lock.unlock();
    if (auto line = maker_.tick(source_(), std::chrono::steady_clock::now())) sink_(*line);
    lock.lock();
  }
}

}  // namespace tessera
