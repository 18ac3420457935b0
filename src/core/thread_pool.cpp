#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define TESSERA_PAUSE() _mm_pause()
#else
#define TESSERA_PAUSE() ((void)0)
#endif

namespace tessera {

namespace {
// About 50-100 µs of spinning before a worker sleeps: longer than the gap between the ops of
// one forward pass, far shorter than the gap between requests.
constexpr int kSpinIterations = 1 << 14;
// Spins before a waiting thread starts yielding its core: when the machine is oversubscribed
// the thread we wait for may be descheduled, and pure spinning would burn our whole time slice.
constexpr int kSpinBeforeYield = 1 << 10;

inline void spin_pause(int iteration) {
  if (iteration < kSpinBeforeYield)
    TESSERA_PAUSE();
  else
    std::this_thread::yield();
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::default_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

void ThreadPool::run(FunctionRef<void(int, int)> fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  job_ = &fn;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  if (sleepers_.load(std::memory_order_acquire) > 0) generation_.notify_all();
  fn(0, n_threads_);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) spin_pause(spin);
  job_ = nullptr;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  std::atomic<int64_t> next{0};
  run([&](int, int) {
    for (;;) {
      const int64_t b = next.fetch_add(grain, std::memory_order_relaxed);
      if (b >= n) break;
      fn(b, std::min(n, b + grain));
    }
  });
}

void ThreadPool::worker_loop(int index) {
  // Generation 0 is the pool's birth: a job published before this thread first runs is
  // still seen as new.
  uint32_t seen = 0;
  for (;;) {
    uint32_t now = generation_.load(std::memory_order_acquire);
    for (int spin = 0; now == seen && spin < kSpinIterations; ++spin) {
      spin_pause(spin);
      now = generation_.load(std::memory_order_acquire);
    }
    if (now == seen) {
      sleepers_.fetch_add(1, std::memory_order_acq_rel);
      now = generation_.load(std::memory_order_acquire);
      while (now == seen) {
        generation_.wait(seen, std::memory_order_acquire);
        now = generation_.load(std::memory_order_acquire);
      }
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
    }
    seen = now;
    if (stop_.load(std::memory_order_acquire)) return;
    (*job_)(index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace tessera
