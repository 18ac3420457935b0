#pragma once
// The CUDA implementation of the backend op interface, for one device and one stream.
// Weights arrive through upload() (cudaMalloc + one copy, never managed memory); activations
// and the KV pool come from alloc(); the index arrays of a forward are staged once per
// forward (stage_inputs) into device memory that the kernels read. Decode forwards of the
// graph batch sizes are captured once as CUDA graphs and replayed (cuda_decode_graphs.cpp).
#include <cuda_runtime.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_profile.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"

namespace tessera {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device, bool graphs = true);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  std::string describe() const override { return describe_; }
  int device() const { return device_; }
  int sm_count() const { return sm_count_; }
  cudaStream_t stream() const { return stream_; }

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void synchronize() override;

  void embed(const WeightMatrix& table, const int32_t* ids, int n, float* out) override;
  void rms_norm(const float* x, const float* w, float* out, int n_rows, int dim, float eps) override;
  void add_rms_norm(float* x, const float* residual, const float* w, float* out, int n_rows, int dim,
                    float eps) override;
  void matmul(const float* x, int n_rows, int64_t ldx, std::span<const MatmulTarget> targets) override;
  void add_bias(float* x, int64_t ld, const float* bias, int n_rows, int dim) override;
  void rope(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* positions, const RopeConfig& cfg) override;
  void kv_store(const KvLayerView& kv, const float* k, int64_t ldk, const float* v, int64_t ldv,
                const AttentionBatch& batch) override;
  void rope_kv_store(float* q, int64_t ldq, int n_q_heads, float* k, int64_t ldk, const float* v, int64_t ldv,
                     const KvLayerView& kv, const AttentionBatch& batch, const RopeConfig& cfg) override;
  void attention(const float* q, int64_t ldq, const KvLayerView& kv, const AttentionBatch& batch, int n_heads,
                 float scale, float* out, int64_t ldo) override;
  void rope_kv_store_attention(float* q, int64_t ldq, int n_heads, float* k, int64_t ldk, const float* v,
                               int64_t ldv, const KvLayerView& kv, const AttentionBatch& batch, const RopeConfig& cfg,
                               float scale, float* out, int64_t ldo) override;
  void swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) override;
  void swiglu_matmul(const float* gate, const float* up, int64_t ld_in, float* h, int n_rows, int dim,
                     std::span<const MatmulTarget> targets) override;
  void add_rms_norm_matmul(const float* x, const float* residual, const float* w, float* x_out, float* xn, int n_rows,
                           int dim, float eps, std::span<const MatmulTarget> targets) override;
  void add_rms_norm_swiglu_ffn(const float* x, const float* residual, const float* w, float* x_out, float* xn,
                               int n_rows, int dim, float eps, const MatmulTarget& gate, const MatmulTarget& up,
                               float* h, const MatmulTarget& down) override;
  void add(float* x, const float* y, int64_t n) override;
  void gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst) override;
  void copy_to_host(void* host, const void* device, size_t bytes) override;

  std::shared_ptr<const void> upload(const void* host, size_t bytes) override;
  void copy_to_device(void* device, const void* host, size_t bytes) override;
  void stage_inputs(const AttentionBatch& batch, const int32_t* tokens, const int32_t* logits_rows,
                    int n_logits_rows) override;
  size_t device_free_bytes() override;

  void copy_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host_async(void* host, const void* device, size_t bytes) override;
  void copy_to_device_async(void* device, const void* host, size_t bytes) override;
  std::shared_ptr<void> alloc_host(size_t bytes) override;
  int decode_graph_batch(int n_seqs) const override;
  // Graphs captured so far and forwards replayed from them (for tests and reports).
  int graphs_captured() const { return graphs_captured_; }
  int64_t graph_replays() const { return graph_replays_; }
  // The per-op device-time table since the last call (TESSERA_CUDA_DIAG=profile), then reset.
  std::string take_profile();

 protected:
  void read_logits_planned(float* host, const float* device, int n_rows, int n_vocab,
                           const LogitsReadback& plan) override;

 private:
  // Index arrays the ops read, each with its own device buffer.
  enum Role { kTokens, kPositions, kSlots, kQStart, kKvLen, kTables, kRows, kRoleCount };
  struct Staged {
    const int32_t* host = nullptr;  // the announced host array
    std::vector<int32_t> copy;      // its contents when announced (a reused pointer must match)
    size_t offset = 0;              // in ints, inside staged_dev_
  };
  // Device copy of a host index array: the staged one when `host` was announced with the
  // same contents, else a fresh copy into the role's own buffer (stream-ordered).
  const int32_t* ints(Role role, const int32_t* host, size_t n, bool* staged = nullptr);
  cuda::DeviceBatch device_batch(const AttentionBatch& b);
  // Matmul paths (cuda_backend.cpp). runs: the targets after coalesce(); `in` says what the
  // row of a one-row product is (fused inputs: the bulk kernel only); pre16: activations already
  // converted to 16 bits (bf16 when pre_bf16), dense [n_rows, cols].
  static constexpr int kMaxTargets = 8;
  static int coalesce(std::span<const MatmulTarget> targets, MatmulTarget* runs);
  bool recorded_matmul(int op, const float* x, const float* x2, int n_rows, int64_t ldx, int64_t cols,
                       std::span<const MatmulTarget> targets);
  void gemv(const cuda::GemvInput& in, int n_rows, int64_t ldx, int64_t cols, const MatmulTarget* runs, int n_runs);
  void gemm(const float* x, int n_rows, int64_t ldx, int64_t cols, const MatmulTarget* runs, int n_runs,
            const uint16_t* pre16, bool pre_bf16);
  // A device scratch buffer of at least `bytes` (grown, never shrunk).
  void* scratch(void*& buf, size_t& cap, size_t bytes);
  const double* rope_inv_freq_table(const RopeConfig& cfg);
  // How the decode attention splits each sequence's keys (attention(), cuda_backend.cpp).
  struct DecodeSplit {
    int max_len = 0;  // keys the block tables can describe (their width rounded up to a power of two)
    int split_len = 0;
    int max_splits = 0;
  };
  DecodeSplit decode_split(const KvLayerView& kv, const AttentionBatch& batch, int n_heads) const;
  // The table, after checking that no position is negative (a clear error, not a bad angle).
  const double* checked_rope_table(const int32_t* positions, int n_rows, const RopeConfig& cfg);

  // ---- Decode graphs (cuda_decode_graphs.cpp) ----
  // A decode forward of a graph batch size, keyed by (sequences, block-table stride): the
  // first one runs eagerly (loads kernels, sizes scratch, makes GEMM plans), the second is
  // captured, later ones replay. Its index arrays live at a fixed device address.
  struct DecodeGraph {
    bool seen = false;
    bool broken = false;            // capture failed once: always eager
    cudaGraphExec_t exec = nullptr;
    uint64_t signature = 0;         // of the captured ops' arguments
    int32_t* inputs = nullptr;      // device, the staged index arrays
  };
  enum class GraphMode { kNone, kEager, kCapture, kReplay };
  // The graph entry for this forward when it is a decode forward of a graph size, else null.
  DecodeGraph* decode_graph_for(const AttentionBatch& b, const int32_t* tokens, const int32_t* logits_rows,
                                int n_logits_rows, int stride);
  // Ends a capture (instantiates and launches) or launches the replayed graph.
  void finish_graph_forward();
  // Ends a capture left open by an exception, dropping it.
  void abandon_graph_forward();
  // Destroys every graph (a scratch buffer they point into moved).
  void drop_graphs();
  // Adds an op's arguments to the forward's signature; true when the op is already in the
  // graph being replayed (the caller returns without launching).
  template <typename... A>
  bool recorded(int op, const A&... args);
  void sign(uint64_t word) { op_sig_ = (op_sig_ ^ word) * 0x100000001b3ull + (op_sig_ >> 29); }

  bool graphs_enabled_ = true;
  GraphMode graph_mode_ = GraphMode::kNone;
  DecodeGraph* graph_ = nullptr;  // of the forward in flight
  uint64_t op_sig_ = 0;
  std::map<std::pair<int, int>, DecodeGraph> graphs_;
  int graphs_captured_ = 0;
  int64_t graph_replays_ = 0;
  const int32_t* staged_base_ = nullptr;  // device copy of this forward's staged arrays
  int staged_stride_ = 0;                 // row stride of the staged block tables

  int32_t* argmax_dev_ = nullptr;  // row argmax ids
  size_t argmax_dev_cap_ = 0;
  std::shared_ptr<void> argmax_host_;  // pinned
  size_t argmax_host_cap_ = 0;

  int device_ = 0;
  int sm_count_ = 0;
  std::string describe_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::GemmLt> gemm_;

  Staged staged_[kRoleCount];
  int32_t* staged_dev_ = nullptr;
  size_t staged_cap_ = 0;
  int32_t* staged_host_ = nullptr;  // pinned, so the one copy is asynchronous
  size_t staged_host_cap_ = 0;
  cudaEvent_t staged_copied_ = nullptr;  // the pinned buffer is free again once this fires
  void* role_buf_[kRoleCount] = {};
  size_t role_cap_[kRoleCount] = {};

  void* act16_ = nullptr;  // activations as bf16/f16 for cuBLASLt
  size_t act16_cap_ = 0;
  void* wdeq_ = nullptr;   // a quantized weight decoded to bf16
  size_t wdeq_cap_ = 0;
  void* partials_ = nullptr;  // split-KV attention partial results
  size_t partials_cap_ = 0;

  struct RopeTable {
    RopeConfig cfg;
    std::vector<float> freq_factors;  // host copy of cfg.freq_factors (a device pointer)
    double* inv_freq = nullptr;       // device, [rot_dim/2]
  };
  std::vector<RopeTable> rope_tables_;

  std::unique_ptr<cuda::OpProfiler> profiler_;  // TESSERA_CUDA_DIAG=profile
};

namespace cuda {
// Words of an op's signature (cuda graphs): pointers, integers, floats (by their bits).
template <typename T>
uint64_t sig_word(const T& v) {
  if constexpr (std::is_pointer_v<T>)
    return reinterpret_cast<uintptr_t>(v);
  else if constexpr (std::is_same_v<T, float>) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return u;
  } else
    return static_cast<uint64_t>(v);
}
}  // namespace cuda

template <typename... A>
bool CudaBackend::recorded(int op, const A&... args) {
  if (graph_mode_ != GraphMode::kCapture && graph_mode_ != GraphMode::kReplay) return false;
  sign(static_cast<uint64_t>(op));
  (sign(cuda::sig_word(args)), ...);
  return graph_mode_ == GraphMode::kReplay;
}

}  // namespace tessera
