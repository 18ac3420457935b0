#pragma once
// The CUDA implementation of the backend op interface, for one device and one stream.
// Weights arrive through upload() (cudaMalloc + one copy, never managed memory); activations
// and the KV pool come from alloc(); the index arrays of a forward arrive in device memory
// (the ModelRunner stages them). Stream capture into CUDA graphs (cuda_graphs.cpp) is offered
// to the runner, which captures and replays whole forwards.
#include <cuda_runtime.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_profile.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe_kernels.h"

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

  // Every format of kv_format.h (quantized ones: kv_store_quant.cu, attention_quant_*.cu),
  // with groups of channels (int8:gN, int4:gN) a multiple of 8: a lane's 8 channels share
  // one scale.
  bool supports_kv_format(const KvFormat& f) const override { return f.scale != KvScale::Group || f.group % 8 == 0; }
  bool supports_tree_attention() const override { return true; }
  void move_kv_tokens(const KvLayerView& kv, std::span<const KvSlotMove> moves) override;

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void synchronize() override;

  void embed(const WeightMatrix& table, const int32_t* ids, int n, float* out) override;
  void embed_range(const WeightMatrix& table, int64_t first_id, const int32_t* ids, int n, float* out) override;
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
  void rope_kv_store_attention(float* q, int64_t ldq, int n_heads, float* k, int64_t ldk, const float* v, int64_t ldv,
                               const KvLayerView& kv, const AttentionBatch& batch, const RopeConfig& cfg, float scale,
                               float* out, int64_t ldo) override;
  void swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) override;
  void swiglu_matmul(const float* gate, const float* up, int64_t ld_in, float* h, int n_rows, int dim,
                     std::span<const MatmulTarget> targets) override;
  void add_rms_norm_matmul(const float* x, const float* residual, const float* w, float* x_out, float* xn, int n_rows,
                           int dim, float eps, std::span<const MatmulTarget> targets) override;
  void add_rms_norm_swiglu_ffn(const float* x, const float* residual, const float* w, float* x_out, float* xn,
                               int n_rows, int dim, float eps, const MatmulTarget& gate, const MatmulTarget& up,
                               float* h, const MatmulTarget& down) override;
  void add(float* x, const float* y, int64_t n) override;
  void geglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) override;
  void rms_norm_heads(float* x, int64_t ld, int n_rows, int n_heads, int head_dim, const float* w, float eps) override;
  void scale(float* x, float s, int64_t n) override;
  void gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst) override;
  void copy_to_host(void* host, const void* device, size_t bytes) override;
  // Routing, grouping and expert products on the device (cuda_moe.cpp, moe.cu).
  void moe_ffn(const float* x, int n_rows, int dim, const MoeFfnWeights& moe, float* out) override;

  std::shared_ptr<const void> upload(const void* host, size_t bytes) override;
  void copy_to_device(void* device, const void* host, size_t bytes) override;
  size_t device_free_bytes() override;

  void copy_device(void* dst, const void* src, size_t bytes) override;
  void copy_to_host_async(void* host, const void* device, size_t bytes) override;
  void copy_to_device_async(void* device, const void* host, size_t bytes) override;
  std::shared_ptr<void> alloc_host(size_t bytes) override;
  void read_logits(float* host, const float* device, int n_rows, int n_vocab, const LogitsReadback& plan) override;
  // Rows staged through a pinned buffer, masks copied straight from the caller (cuda_graphs.cpp).
  void apply_token_bitmask(float* logits, int n_vocab, std::span<const int32_t> rows, const int32_t* masks,
                           int words) override;

  bool supports_graphs() const override { return graphs_enabled_; }
  void begin_capture() override;
  std::unique_ptr<Graph> end_capture() override;
  void abandon_capture() override;
  uint64_t graph_epoch() const override { return graph_epoch_; }

  // The per-op device-time table since the last call (TESSERA_CUDA_DIAG=profile), then reset.
  std::string take_profile();

 private:
  // The batch as the kernels take it (its arrays are device pointers already).
  cuda::DeviceBatch device_batch(const AttentionBatch& b);
  // Matmul paths (cuda_backend.cpp). runs: the targets after coalesce(); `in` says what the
  // row of a one-row product is (fused inputs: the bulk kernel only); pre16: activations already
  // converted to 16 bits (bf16 when pre_bf16), dense [n_rows, cols].
  static constexpr int kMaxTargets = 8;
  static int coalesce(std::span<const MatmulTarget> targets, MatmulTarget* runs);
  // x_is_q8: x is already quantized per 32 columns in q8_input(n_rows, cols) (every run takes it:
  // takes_q8_input), written there by the kernel before (norm or SwiGLU); in.x is not read.
  void gemv(const cuda::GemvInput& in, int n_rows, int64_t ldx, int64_t cols, const MatmulTarget* runs, int n_runs,
            bool x_is_q8 = false);
  // The scratch the integer decode kernels read x from: slot 0 x as it is, slot 1 x through an
  // act-order permutation (two halves of xq8_).
  cuda::Q8Rows q8_input(int n_rows, int64_t cols, int slot = 0);
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

  bool graphs_enabled_ = true;
  bool capturing_ = false;    // between begin_capture() and end_capture()
  uint64_t graph_epoch_ = 0;  // bumped when a scratch buffer moves

  int32_t* argmax_dev_ = nullptr;  // row argmax ids
  size_t argmax_dev_cap_ = 0;
  std::shared_ptr<void> argmax_host_;  // pinned
  size_t argmax_host_cap_ = 0;

  // apply_token_bitmask: device copies of the rows and masks, and the pinned rows staging,
  // rewritten only once its last upload has been read (mask_rows_uploaded_).
  void* mask_dev_ = nullptr;  // [rows, padded to 64 ints] then [n, words] masks
  size_t mask_dev_cap_ = 0;
  std::shared_ptr<void> mask_rows_host_;
  size_t mask_rows_host_cap_ = 0;  // bytes
  cudaEvent_t mask_rows_uploaded_ = nullptr;

  int device_ = 0;
  int sm_count_ = 0;
  std::string describe_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::GemmLt> gemm_;

  void* act16_ = nullptr;  // activations as bf16/f16 for cuBLASLt
  size_t act16_cap_ = 0;
  void* wdeq_ = nullptr;  // a quantized weight decoded to bf16
  size_t wdeq_cap_ = 0;
  void* xq8_ = nullptr;  // decode activations quantized per 32 columns (two: as given, in an act-order order)
  size_t xq8_cap_ = 0;
  void* actq_ = nullptr;  // activations as E4M3 codes + per-row scales (the FP8 GEMM)
  size_t actq_cap_ = 0;
  void* partials_ = nullptr;  // split-KV attention partial results
  size_t partials_cap_ = 0;

  // moe_ffn (cuda_moe.cpp): its buffers, the per-expert path's gathered rows, and each
  // layer's expert pointer table on the device (kept as long as the backend: graphs hold them).
  const cuda::MoeExpert* moe_expert_table(const MoeFfnWeights& moe);
  void* moe_buf_ = nullptr;
  size_t moe_buf_cap_ = 0;
  void* moe_gather_ = nullptr;
  size_t moe_gather_cap_ = 0;
  struct MoeTable {
    std::vector<cuda::MoeExpert> host;
    cuda::MoeExpert* dev = nullptr;
  };
  std::vector<MoeTable> moe_tables_;
  std::vector<cuda::MoeExpert> moe_want_;  // the table a call asks for (no allocation per call)
  std::vector<int32_t> moe_start_;         // per-expert path: offsets read back

  struct RopeTable {
    RopeConfig cfg;
    std::vector<float> freq_factors;  // host copy of cfg.freq_factors (a device pointer)
    double* inv_freq = nullptr;       // device, [rot_dim/2]
  };
  std::vector<RopeTable> rope_tables_;

  std::unique_ptr<cuda::OpProfiler> profiler_;  // TESSERA_CUDA_DIAG=profile
};

}  // namespace tessera
