#pragma once
// A few threads that prepare generation requests (body JSON, chat template, tokenization)
// off the HTTP I/O threads: a 2,000-token chat prompt takes about 5 ms to render and
// tokenize on SmolLM2 (docs/design/openai-api.md), time during which an I/O thread would
// write no other connection's chunks.
//
// Fair per tenant (issue 20: one key's 4 MiB prompts kept every worker busy while another
// key's 5-token chat waited seconds): each tenant has its own queue, tenants are served
// round-robin, and a named tenant (an API key) never holds more than n_threads - 1 workers,
// so one always stays free for the others. The anonymous tenant ("" when the server has no
// keys: one tenant in all) may use every worker. A tenant's own tasks run in submission order.
// Workers run at a lower CPU priority than the engine and I/O threads (kNiceIncrement).
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
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

  // Thread-safe. The task must not throw. `tenant` is Tenant::name ("" without API keys).
  void submit(const std::string& tenant, std::function<void()> task);
  int n_threads() const { return static_cast<int>(threads_.size()); }
  // Workers a tenant may hold at once.
  int max_running(const std::string& tenant) const;

 private:
  struct TenantQueue {
    std::deque<std::function<void()>> tasks;
    int running = 0;
  };
  // Worker threads run this much nicer than the process (Linux per-thread niceness).
  static constexpr int kNiceIncrement = 10;
  void run();
  // The next task by round-robin over tenants under their cap; false when none may run.
  bool take(std::function<void()>& task, std::string& tenant);

  std::mutex mutex_;
  std::condition_variable ready_;
  std::map<std::string, TenantQueue> tenants_;  // tenants with queued or running tasks
  std::deque<std::string> turn_;                // tenants with queued tasks, next first
  size_t queued_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera::api
