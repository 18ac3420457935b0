#pragma once
// Per-op device timing for profiling without Nsight (TESSERA_CUDA_DIAG=profile, cuda_diag.h): every backend
// op is bracketed by two CUDA events on the backend's stream; after each synchronization the
// finished intervals are added to per-op totals, and the backend prints the table when it is
// destroyed. The intervals hold the kernels' run time plus any wait for the host to launch
// them (profiling turns decode graphs off), so the sum is close to the step's wall time and
// the shares say where the device time goes.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tessera::cuda {

class OpProfiler {
 public:
  explicit OpProfiler(cudaStream_t stream) : stream_(stream) {}
  ~OpProfiler();
  OpProfiler(const OpProfiler&) = delete;
  OpProfiler& operator=(const OpProfiler&) = delete;

  void begin(std::string name);
  void end();
  // After the stream has been synchronized: folds the finished intervals into the totals.
  void collect();
  // "op | calls | total ms | share | mean us" rows, largest first.
  std::string report() const;
  bool empty() const { return totals_.empty(); }

 private:
  cudaEvent_t take();
  struct Interval {
    std::string name;
    cudaEvent_t start = nullptr, stop = nullptr;
  };
  struct Total {
    double ms = 0;
    int64_t calls = 0;
  };
  cudaStream_t stream_;
  std::vector<Interval> pending_;
  std::vector<cudaEvent_t> free_;
  std::map<std::string, Total> totals_;
  int open_ = -1;  // index in pending_ of the interval begun and not ended
};

// Brackets one op; names are formatted only when profiling is on.
class OpScope {
 public:
  template <typename NameFn>
  OpScope(OpProfiler* p, NameFn&& name) : p_(p) {
    if (p_) p_->begin(name());
  }
  ~OpScope() {
    if (p_) p_->end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  OpProfiler* p_;
};

}  // namespace tessera::cuda
