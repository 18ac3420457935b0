#include "server/api/prompt_workers.h"

#include <algorithm>

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

int PromptWorkers::max_running(const std::string& tenant) const {
  const int n = n_threads();
  return tenant.empty() ? n : std::max(1, n - 1);
}

void PromptWorkers::submit(const std::string& tenant, std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    TenantQueue& q = tenants_[tenant];
    if (q.tasks.empty()) turn_.push_back(tenant);
    q.tasks.push_back(std::move(task));
    ++queued_;
  }
  ready_.notify_one();
}

bool PromptWorkers::take(std::function<void()>& task, std::string& tenant) {
  // Round-robin: the first tenant in turn that is under its cap; it goes to the back.
  for (auto it = turn_.begin(); it != turn_.end(); ++it) {
    TenantQueue& q = tenants_[*it];
    if (q.running >= max_running(*it)) continue;
    tenant = *it;
    turn_.erase(it);
    task = std::move(q.tasks.front());
    q.tasks.pop_front();
    --queued_;
    ++q.running;
    if (!q.tasks.empty()) turn_.push_back(tenant);
    return true;
  }
  return false;
}

void PromptWorkers::run() {
  for (;;) {
    std::function<void()> task;
    std::string tenant;
    {
      std::unique_lock lock(mutex_);
      // Stopping still drains the queue; tasks are taken only under their tenant's cap.
      ready_.wait(lock, [&] { return (stop_ && queued_ == 0) || take(task, tenant); });
      if (!task) return;  // stopping, and nothing left
    }
    task();
    {
      std::lock_guard lock(mutex_);
      auto it = tenants_.find(tenant);
      if (--it->second.running == 0 && it->second.tasks.empty()) tenants_.erase(it);
    }
    ready_.notify_all();  // a capped tenant's next task may run now
  }
}

}  // namespace tessera::api
