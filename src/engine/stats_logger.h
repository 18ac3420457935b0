#pragma once
// The periodic stats line of a serving engine, as `vllm serve` logs it: prompt and
// generation throughput over the last interval, running / waiting / swapped sequences, KV
// usage and the prefix cache's hit rate. Logged only while there is activity (tokens in
// the interval, or sequences running or waiting).
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "engine/engine_core.h"

namespace tessera {

// The line for an interval of `seconds` between two snapshots of the counters.
std::string format_stats_line(const EngineStats& before, const EngineStats& after, double seconds);
// Tokens computed in the interval, or sequences still running or waiting at its end.
bool stats_active(const EngineStats& before, const EngineStats& after);

// Turns successive snapshots into lines; no thread, no clock of its own (tests drive it).
class StatsLineMaker {
 public:
  // The line for the interval since the previous call (the first call only starts one),
  // or nothing when the interval was idle.
  std::optional<std::string> tick(const EngineStats& now, std::chrono::steady_clock::time_point t);

 private:
  std::optional<EngineStats> last_;
  std::chrono::steady_clock::time_point last_t_;
};

// Every `interval`, reads `source` on its own thread and gives `sink` the line of each
// active interval. The destructor stops and joins the thread.
class PeriodicStatsLogger {
 public:
  PeriodicStatsLogger(std::chrono::milliseconds interval, std::function<EngineStats()> source,
                      std::function<void(const std::string&)> sink);
  ~PeriodicStatsLogger();
  PeriodicStatsLogger(const PeriodicStatsLogger&) = delete;
  PeriodicStatsLogger& operator=(const PeriodicStatsLogger&) = delete;

 private:
  void run();
  std::chrono::milliseconds interval_;
  std::function<EngineStats()> source_;
  std::function<void(const std::string&)> sink_;
  StatsLineMaker maker_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tessera
