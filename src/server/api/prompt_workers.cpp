#include "server/api/prompt_workers.h"

#include "core/error.h"

namespace tessera::api {

PromptWorkers::PromptWorkers(int n_threads) {
  TESSERA_CHECK(n_threads >= 1, "api: prompt workers need at least one thread, got ", n_threads);
  threads_.reserve(n_threads);
  for (int i = 0; i < n_threads; ++i) threads_.emplace_back([this] { run(); });
}

PromptWorkers::~PromptWorkers() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  ready_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void PromptWorkers::submit(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  ready_.notify_one();
}

void PromptWorkers::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and nothing left
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace tessera::api
