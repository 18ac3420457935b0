// Input staging and CUDA graphs for the decode step, and the planned logits readback.
//
// A decode forward (every sequence one new token, logits rows 0..n-1) of a graph batch size
// (1, 2, 4, ..., 128 sequences) is keyed by (sequences, block-table stride rounded up to a
// power of two). Its index arrays are staged at a fixed device address of its own, and every
// kernel reads the sizes that change between steps (positions, context lengths, block
// tables) from there, so one captured graph serves every later step of that key:
//   1st forward of a key: eager (loads kernels, grows scratch, makes cuBLASLt plans);
//   2nd: captured while it runs (ops go into the graph), then launched;
//   later: the ops only add their arguments to a signature, checked against the captured
//   one before the graph is launched.
#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_factory.h"
#include "core/error.h"

namespace tessera {

namespace {

using cuda::next_pow2;
using cuda::round_up;

constexpr int kMaxGraphBatch = 128;

}  // namespace

int64_t cuda_graph_replays(Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda ? cuda->graph_replays() : 0;
}

int CudaBackend::decode_graph_batch(int n_seqs) const {
  if (!graphs_enabled_ || n_seqs < 1 || n_seqs > kMaxGraphBatch) return 0;
  return next_pow2(n_seqs);
}

CudaBackend::DecodeGraph* CudaBackend::decode_graph_for(const AttentionBatch& b, const int32_t* tokens,
                                                         const int32_t* logits_rows, int n_logits_rows, int stride) {
  const int n = b.n_seqs;
  if (!graphs_enabled_ || !tokens || !logits_rows || n < 1 || b.n_tokens != n || n_logits_rows != n ||
      decode_graph_batch(n) != n)
    return nullptr;
  for (int i = 0; i < n; ++i)
    if (b.q_start[i] != i || logits_rows[i] != i) return nullptr;
  if (b.q_start[n] != n) return nullptr;
  return &graphs_[{n, stride}];
}

void CudaBackend::stage_inputs(const AttentionBatch& b, const int32_t* tokens, const int32_t* logits_rows,
                               int n_logits_rows) {
  abandon_graph_forward();
  const int wide = cuda::graph_table_width(b.max_blocks);
  DecodeGraph* g = decode_graph_for(b, tokens, logits_rows, n_logits_rows, wide);
  // A graph reads block tables at a fixed stride: its key's, wider than this batch's.
  const int stride = g ? wide : b.max_blocks;
  const std::pair<const int32_t*, size_t> arrays[kRoleCount] = {
      {tokens, tokens ? static_cast<size_t>(b.n_tokens) : 0},
      {b.positions, static_cast<size_t>(b.n_tokens)},
      {b.slot_mapping, static_cast<size_t>(b.n_tokens)},
      {b.q_start, static_cast<size_t>(b.n_seqs + 1)},
      {b.kv_len, static_cast<size_t>(b.n_seqs)},
      {b.block_tables, static_cast<size_t>(b.n_seqs) * b.max_blocks},
      {logits_rows, static_cast<size_t>(std::max(n_logits_rows, 0))},
  };
  size_t staged_len[kRoleCount];
  size_t total = 0;
  for (int r = 0; r < kRoleCount; ++r) {
    staged_len[r] = r == kTables ? static_cast<size_t>(b.n_seqs) * stride : arrays[r].second;
    total += round_up(staged_len[r], 32);  // 128-byte aligned segments
  }
  // The pinned buffer may still feed the previous forward's copy.
  TESSERA_CUDA_CHECK(cudaEventSynchronize(staged_copied_));
  if (total > staged_host_cap_) {
    TESSERA_CUDA_CHECK(cudaFreeHost(staged_host_));
    staged_host_ = nullptr;
    staged_host_cap_ = round_up(total * 2, 1024);
    TESSERA_CUDA_CHECK(cudaMallocHost(&staged_host_, staged_host_cap_ * sizeof(int32_t)));
  }
  int32_t* dst = nullptr;
  if (g) {
    if (!g->inputs) g->inputs = static_cast<int32_t*>(alloc(total * sizeof(int32_t)));
    dst = g->inputs;
  } else {
    if (total > staged_cap_) {  // graphs never read this buffer: growing it drops none
      if (staged_dev_) TESSERA_CUDA_CHECK(cudaFree(staged_dev_));
      staged_dev_ = nullptr;
      staged_cap_ = round_up(total * 2, 1024);
      staged_dev_ = static_cast<int32_t*>(alloc(staged_cap_ * sizeof(int32_t)));
    }
    dst = staged_dev_;
  }
  size_t off = 0;
  for (int r = 0; r < kRoleCount; ++r) {
    Staged& st = staged_[r];
    const int32_t* src = arrays[r].first;
    st.host = src;
    st.copy.assign(src, src + (src ? arrays[r].second : 0));
    st.offset = off;
    if (r == kTables && src && stride != b.max_blocks) {
      int32_t* out = staged_host_ + off;
      std::fill(out, out + staged_len[r], 0);
      for (int s = 0; s < b.n_seqs; ++s)
        std::copy_n(src + static_cast<size_t>(s) * b.max_blocks, b.max_blocks, out + static_cast<size_t>(s) * stride);
    } else if (!st.copy.empty()) {
      std::memcpy(staged_host_ + off, st.copy.data(), st.copy.size() * sizeof(int32_t));
    }
    off += round_up(staged_len[r], 32);
  }
  staged_base_ = dst;
  staged_stride_ = stride;
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, staged_host_, total * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
  TESSERA_CUDA_CHECK(cudaEventRecord(staged_copied_, stream_));
  if (!g) return;
  graph_ = g;
  op_sig_ = 0xcbf29ce484222325ull;
  if (g->exec) {
    graph_mode_ = GraphMode::kReplay;
  } else if (g->seen && !g->broken) {
    TESSERA_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    graph_mode_ = GraphMode::kCapture;
  } else {
    g->seen = true;
    graph_mode_ = GraphMode::kEager;
  }
}

void CudaBackend::finish_graph_forward() {
  const GraphMode mode = graph_mode_;
  DecodeGraph* g = graph_;
  graph_mode_ = GraphMode::kNone;
  graph_ = nullptr;
  if (mode == GraphMode::kCapture) {
    cudaGraph_t graph = nullptr;
    cudaError_t err = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    if (err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (err != cudaSuccess) {
      g->broken = true;  // this key runs eagerly from now on
      TESSERA_CUDA_CHECK(err);
    }
    g->exec = exec;
    g->signature = op_sig_;
    ++graphs_captured_;
    TESSERA_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
  } else if (mode == GraphMode::kReplay) {
    if (op_sig_ != g->signature) {
      // Same shape, other buffers (another KV cache or model on this backend): the skipped
      // ops cannot be run now, so this forward fails; the key is captured again next time.
      TESSERA_CUDA_CHECK(cudaGraphExecDestroy(g->exec));
      g->exec = nullptr;
      fail("cuda graphs: this decode forward issued other ops than the graph captured for its shape (other "
           "buffers on the same backend?); it will be captured again (--no-cuda-graphs turns graphs off)");
    }
    ++graph_replays_;
    TESSERA_CUDA_CHECK(cudaGraphLaunch(g->exec, stream_));
  }
}

void CudaBackend::abandon_graph_forward() {
  if (graph_mode_ == GraphMode::kCapture) {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();  // the capture's error is the exception that interrupted it
    if (graph_) graph_->broken = true;
  }
  graph_mode_ = GraphMode::kNone;
  graph_ = nullptr;
}

void CudaBackend::drop_graphs() {
  for (auto& [key, g] : graphs_) {
    if (g.exec) TESSERA_CUDA_CHECK(cudaGraphExecDestroy(g.exec));
    g.exec = nullptr;
    g.seen = false;
  }
}

void CudaBackend::read_logits_planned(float* host, const float* device, int n_rows, int n_vocab,
                                      const LogitsReadback& plan) {
  finish_graph_forward();
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
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(ids, argmax_dev_, static_cast<size_t>(n_rows) * 4, cudaMemcpyDeviceToHost, stream_));
  const auto copy_runs = [&](auto wanted) {
    for (int r = 0; r < n_rows;) {
      if (!wanted(r)) {
        ++r;
        continue;
      }
      int end = r + 1;
      while (end < n_rows && wanted(end)) ++end;
      TESSERA_CUDA_CHECK(cudaMemcpyAsync(host + static_cast<size_t>(r) * n_vocab, device + static_cast<size_t>(r) * n_vocab,
                                         row_bytes * (end - r), cudaMemcpyDeviceToHost, stream_));
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

}  // namespace tessera
