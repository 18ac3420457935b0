#include "server/api/prompt_workers.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

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
  // Below the engine and I/O threads: a tenant's megabytes of prompt text must not take a core
  // from the engine's spinning thread pool, whose every job then waits for the descheduled
  // thread (measured: another tenant's 1-token chat went from 0.2 s to 2-3 s on 2 busy cores).
  // Raising one's own niceness needs no privilege; failure only loses the preference.
  const id_t tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  const int nice_now = ::getpriority(PRIO_PROCESS, tid);
  if (errno == 0) ::setpriority(PRIO_PROCESS, tid, std::min(nice_now + kNiceIncrement, 19));
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
