// PromptWorkers' fairness (issue 20): one tenant flooding the workers must not delay another
// tenant's prompt by more than that prompt's own work.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "server/api/prompt_workers.h"

namespace tessera::api {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

TEST(PromptWorkers, AnotherTenantIsServedWhileOneFloods) {
  PromptWorkers workers(2);
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> flood_running{0}, flood_peak{0};
  // Tenant A: eight slow prompts (they block until released: a 4 MiB prompt being tokenized).
  for (int i = 0; i < 8; ++i)
    workers.submit("key-aaaa", [&, released] {
      const int now = ++flood_running;
      int peak = flood_peak.load();
      while (now > peak && !flood_peak.compare_exchange_weak(peak, now)) {
      }
      released.wait();
      --flood_running;
    });
  std::this_thread::sleep_for(50ms);   // A holds what it may
  EXPECT_EQ(flood_running.load(), 1);  // n_threads - 1: one worker stays free for others
  // Tenant B's small prompt runs at once, although A has seven more queued.
  std::promise<Clock::time_point> b_ran;
  const Clock::time_point b_submitted = Clock::now();
  workers.submit("key-bbbb", [&] { b_ran.set_value(Clock::now()); });
  auto b_future = b_ran.get_future();
  ASSERT_EQ(b_future.wait_for(2s), std::future_status::ready) << "tenant B starved behind tenant A";
  EXPECT_LT(b_future.get() - b_submitted, 500ms);
  EXPECT_EQ(flood_peak.load(), 1);
  release.set_value();
  // ~PromptWorkers drains A's queue.
}

TEST(PromptWorkers, TenantsTakeTurnsRoundRobin) {
  std::mutex mutex;
  std::vector<std::string> order;
  {
    PromptWorkers workers(1);
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::promise<void> started;
    workers.submit("a", [released, &started] {  // holds the one worker while the rest queue
      started.set_value();
      released.wait();
    });
    started.get_future().wait();
    auto note = [&](std::string s) {
      return [&, s] {
        std::lock_guard lock(mutex);
        order.push_back(s);
      };
    };
    workers.submit("a", note("a1"));
    workers.submit("a", note("a2"));
    workers.submit("a", note("a3"));
    workers.submit("b", note("b1"));
    workers.submit("b", note("b2"));
    workers.submit("c", note("c1"));
    release.set_value();
  }  // joined: every task ran
  EXPECT_EQ(order, (std::vector<std::string>{"a1", "b1", "c1", "a2", "b2", "a3"}));
}

TEST(PromptWorkers, TheAnonymousTenantMayUseEveryWorker) {
  // Without API keys every request is tenant "": nobody to be fair to.
  PromptWorkers workers(3);
  EXPECT_EQ(workers.max_running(""), 3);
  EXPECT_EQ(workers.max_running("key-aaaa"), 2);
  std::atomic<int> running{0};
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  for (int i = 0; i < 3; ++i)
    workers.submit("", [&, released] {
      ++running;
      released.wait();
    });
  const auto deadline = Clock::now() + 2s;
  while (running.load() < 3 && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(running.load(), 3);
  release.set_value();
  EXPECT_EQ(PromptWorkers(1).max_running("key-aaaa"), 1);  // one thread: shared in turns
}

}  // namespace
}  // namespace tessera::api

namespace tessera::api {
namespace {

// Prompt work yields the CPU to the engine and I/O threads: the workers run nicer.
TEST(PromptWorkers, WorkersRunAtALowerCpuPriority) {
  const auto nice_of_this_thread = [] {
    errno = 0;
    return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
  };
  const int ours = nice_of_this_thread();
  std::promise<int> theirs;
  {
    PromptWorkers workers(1);
    workers.submit("key-aaaa", [&] { theirs.set_value(nice_of_this_thread()); });
  }
  EXPECT_EQ(theirs.get_future().get(), std::min(ours + 10, 19));
  EXPECT_EQ(nice_of_this_thread(), ours);  // the caller's own priority is untouched
}

}  // namespace
}  // namespace tessera::api
