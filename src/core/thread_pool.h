#pragma once
// A persistent pool of worker threads for the CPU backend. The calling thread is worker 0
// and takes part in every job, so a pool of size 1 runs everything inline.
//
// Workers spin briefly between jobs (a decode step launches hundreds of short jobs) and
// then sleep on a futex, so an idle engine burns no CPU.
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "core/function_ref.h"

namespace tessera {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(thread_index, n_threads) once on every thread and returns when all are done.
  // Not reentrant: fn must not call run() on the same pool.
  void run(FunctionRef<void(int, int)> fn);

  // Runs fn(begin, end) over [0, n) in chunks of `grain` taken dynamically by the threads.
  void parallel_for(int64_t n, int64_t grain, FunctionRef<void(int64_t, int64_t)> fn);

  // Threads of this machine usable for compute (hardware concurrency, at least 1).
  static int default_threads();

 private:
  void worker_loop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  FunctionRef<void(int, int)>* job_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tessera
