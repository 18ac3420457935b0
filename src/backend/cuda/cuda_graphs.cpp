// Stream capture into CUDA graphs (the runner's graph primitives), and the planned logits
// readback.
//
// The ModelRunner (engine/model_runner.h) decides which forwards become graphs and stages
// their inputs at fixed device addresses; here a capture is only: every op the model issues
// between begin_capture() and end_capture() goes into one graph instead of running. A
// scratch buffer that grows bumps graph_epoch() (cuda_backend.cpp), which tells the runner
// its graphs point into freed memory.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_factory.h"
#include "core/error.h"

namespace tessera {

namespace {

using cuda::round_up;

// An instantiated graph, launched on the backend's stream.
class CudaGraph final : public Backend::Graph {
 public:
  CudaGraph(cudaGraphExec_t exec, cudaStream_t stream) : exec_(exec), stream_(stream) {}
  ~CudaGraph() override { cudaGraphExecDestroy(exec_); }  // errors dropped: destructors do not throw
  void launch() override { TESSERA_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

 private:
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

void CudaBackend::begin_capture() {
  TESSERA_CHECK(graphs_enabled_, "cuda: graphs are off on this backend");
  TESSERA_CHECK(!capturing_, "cuda: a graph capture is already open");
  TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

std::unique_ptr<Backend::Graph> CudaBackend::end_capture() {
  TESSERA_CHECK(capturing_, "cuda: end_capture without begin_capture");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  cudaError_t err = cudaStreamEndCapture(stream_, &graph);
  cudaGraphExec_t exec = nullptr;
  if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
  if (graph) cudaGraphDestroy(graph);
  TESSERA_CUDA_CHECK(err);
  return std::make_unique<CudaGraph>(exec, stream_);
}

void CudaBackend::abandon_capture() {
  if (!capturing_) return;
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(stream_, &graph);
  if (graph) cudaGraphDestroy(graph);
  cudaGetLastError();  // the capture's error is the exception that interrupted it
}

void CudaBackend::read_logits(float* host, const float* device, int n_rows, int n_vocab, const LogitsReadback& plan) {
  TESSERA_CHECK(!capturing_, "cuda: read_logits inside a graph capture");
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("logits readback"); });
  const size_t row_bytes = sizeof(float) * static_cast<size_t>(n_vocab);
  if (!plan.argmax_only || n_rows <= 0) {
    copy_to_host(host, device, row_bytes * std::max(n_rows, 0));
    return;
  }
  // Argmax of every row (a pass over the logits, microseconds), only the ids cross the bus;
  // the rows someone reads in full are copied in runs, in the same synchronization.
  if (static_cast<size_t>(n_rows) * 4 > argmax_dev_cap_) {
    if (argmax_dev_) TESSERA_CUDA_CHECK(cudaFree(argmax_dev_));
    argmax_dev_ = nullptr;
    argmax_dev_cap_ = round_up(static_cast<size_t>(n_rows) * 4, 1024);
    argmax_dev_ = static_cast<int32_t*>(alloc(argmax_dev_cap_));
    argmax_host_ = cuda_pinned_host(argmax_dev_cap_);
  }
  cuda::launch_row_argmax(device, n_rows, n_vocab, argmax_dev_, stream_);
  auto* ids = static_cast<int32_t*>(argmax_host_.get());
  TESSERA_CUDA_CHECK(
      cudaMemcpyAsync(ids, argmax_dev_, static_cast<size_t>(n_rows) * 4, cudaMemcpyDeviceToHost, stream_));
  const auto copy_runs = [&](auto wanted) {
    for (int r = 0; r < n_rows;) {
      if (!wanted(r)) {
        ++r;
        continue;
      }
      int end = r + 1;
      while (end < n_rows && wanted(end)) ++end;
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(host + static_cast<size_t>(r) * n_vocab,
                                         device + static_cast<size_t>(r) * n_vocab, row_bytes * (end - r),
                                         cudaMemcpyDeviceToHost, stream_));
      r = end;
    }
  };
  copy_runs([&](int r) { return !plan.argmax_only[r]; });
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (profiler_) profiler_->collect();
  bool any_bad = false;
  for (int r = 0; r < n_rows; ++r)
    if (plan.argmax_only[r]) {
      plan.argmax[r] = ids[r];
      any_bad = any_bad || ids[r] < 0;
    }
  if (!any_bad) return;
  // Rows the device could not reduce (NaN, +inf, all -inf) come back whole for the sampler.
  copy_runs([&](int r) { return plan.argmax_only[r] && ids[r] < 0; });
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::apply_token_bitmask(float* logits, int n_vocab, std::span<const int32_t> rows, const int32_t* masks,
                                      int words) {
  TESSERA_CHECK(!capturing_, "cuda: apply_token_bitmask inside a graph capture");
  check_token_bitmask(n_vocab, words);
  const size_t n = rows.size();
  if (n == 0) return;
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("token masks"); });
  const size_t rows_bytes = round_up(n * sizeof(int32_t), 256);  // the masks start 256-aligned
  const size_t mask_bytes = n * static_cast<size_t>(words) * sizeof(int32_t);
  if (rows_bytes + mask_bytes > mask_dev_cap_) {
    if (mask_dev_) TESSERA_CUDA_CHECK(cudaFree(mask_dev_));  // waits for a kernel still reading it
    mask_dev_ = nullptr;
    mask_dev_cap_ = round_up(rows_bytes + mask_bytes, 1 << 16);
    mask_dev_ = alloc(mask_dev_cap_);
  }
  if (!mask_rows_uploaded_) TESSERA_CUDA_CHECK(cudaEventCreateWithFlags(&mask_rows_uploaded_, cudaEventDisableTiming));
  // The staging may still feed the last call's upload (no readback since).
  TESSERA_CUDA_CHECK(cudaEventSynchronize(mask_rows_uploaded_));
  if (n * sizeof(int32_t) > mask_rows_host_cap_) {
    mask_rows_host_cap_ = round_up(n * sizeof(int32_t), 4096);
    mask_rows_host_ = cuda_pinned_host(mask_rows_host_cap_);
  }
  std::memcpy(mask_rows_host_.get(), rows.data(), n * sizeof(int32_t));
  auto* rows_dev = static_cast<int32_t*>(mask_dev_);
  auto* masks_dev = reinterpret_cast<int32_t*>(static_cast<char*>(mask_dev_) + rows_bytes);
  TESSERA_CUDA_CHECK(
      cudaMemcpyAsync(rows_dev, mask_rows_host_.get(), n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  TESSERA_CUDA_CHECK(cudaEventRecord(mask_rows_uploaded_, stream_));
  // One copy for every mask of the step; asynchronous when they lie in pinned memory.
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(masks_dev, masks, mask_bytes, cudaMemcpyHostToDevice, stream_));
  cuda::launch_apply_token_bitmask(logits, n_vocab, rows_dev, static_cast<int>(n), masks_dev, words, stream_);
}

}  // namespace tessera
