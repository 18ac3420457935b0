#pragma once
// A few threads that prepare generation requests (body JSON, chat template, tokenization)
// off the HTTP I/O threads: a 2,000-token chat prompt takes about 5 ms to render and
// tokenize on SmolLM2 (docs/design/openai-api.md), time during which an I/O thread would
// write no other connection's chunks. Tasks run in submission order, each on one thread.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tessera::api {

class PromptWorkers {
 public:
  explicit PromptWorkers(int n_threads);
  // Runs the tasks already queued, then joins.
  ~PromptWorkers();
  PromptWorkers(const PromptWorkers&) = delete;
  PromptWorkers& operator=(const PromptWorkers&) = delete;

  // Thread-safe. The task must not throw.
  void submit(std::function<void()> task);
  int n_threads() const { return static_cast<int>(threads_.size()); }

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera::api
