#include "backend/cuda/cuda_profile.h"

#include <algorithm>
#include <cstdio>

#include "backend/cuda/cuda_check.h"

namespace tessera::cuda {

OpProfiler::~OpProfiler() {
  for (auto& iv : pending_) {
    cudaEventDestroy(iv.start);
    cudaEventDestroy(iv.stop);
  }
  for (cudaEvent_t e : free_) cudaEventDestroy(e);
}

cudaEvent_t OpProfiler::take() {
  if (!free_.empty()) {
    cudaEvent_t e = free_.back();
    free_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  TESSERA_CUDA_CHECK(cudaEventCreate(&e));
  return e;
}

void OpProfiler::begin(std::string name) {
  if (open_ >= 0) return;  // nested op (one op calling another): the outer one is timed
  Interval iv{std::move(name), take(), take()};
  TESSERA_CUDA_CHECK(cudaEventRecord(iv.start, stream_));
  pending_.push_back(std::move(iv));
  open_ = static_cast<int>(pending_.size()) - 1;
}

void OpProfiler::end() {
  if (open_ < 0) return;
  TESSERA_CUDA_CHECK(cudaEventRecord(pending_[open_].stop, stream_));
  open_ = -1;
}

void OpProfiler::collect() {
  if (open_ >= 0) return;  // an op is still being enqueued (a sync inside an op)
  for (auto& iv : pending_) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, iv.start, iv.stop) == cudaSuccess) {
      Total& t = totals_[iv.name];
      t.ms += ms;
      ++t.calls;
    } else {
      cudaGetLastError();  // not recorded yet: drop the interval
    }
    free_.push_back(iv.start);
    free_.push_back(iv.stop);
  }
  pending_.clear();
}

std::string OpProfiler::report() const {
  std::vector<std::pair<std::string, Total>> rows(totals_.begin(), totals_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double sum = 0;
  for (const auto& r : rows) sum += r.second.ms;
  std::string out = "| op | calls | total ms | share | mean us |\n|---|---|---|---|---|\n";
  char line[512];
  for (const auto& [name, t] : rows) {
    std::snprintf(line, sizeof line, "| %s | %lld | %.3f | %.1f%% | %.1f |\n", name.c_str(),
                  static_cast<long long>(t.calls), t.ms, sum > 0 ? 100 * t.ms / sum : 0.0,
                  1000 * t.ms / std::max<int64_t>(t.calls, 1));
    out += line;
  }
  std::snprintf(line, sizeof line, "| all ops | | %.3f | 100%% | |\n", sum);
  out += line;
  return out;
}

}  // namespace tessera::cuda
