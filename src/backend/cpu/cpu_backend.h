#pragma once
// The CPU implementation of the backend op interface: a persistent thread pool, SIMD row
// kernels picked at run time, and block-format matmuls (backend/cpu/matmul.h).
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/matmul.h"
#include "backend/query_observer.h"
#include "core/aligned_buffer.h"
#include "core/thread_pool.h"

namespace tessera {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads);
  // With a given row-kernel table (tests run every ISA path this machine has).
  CpuBackend(int threads, const cpu::OpsTable& ops);
  ~CpuBackend() override;

  std::string_view name() const override { return "cpu"; }
  std::string describe() const override;
  ThreadPool& pool() { return pool_; }

  void* alloc(size_t bytes) override;
  void free(void* p) override;
  void synchronize() override {}

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
  void attention(const float* q, int64_t ldq, const KvLayerView& kv, const AttentionBatch& batch, int n_heads,
                 float scale, float* out, int64_t ldo) override;
  void swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) override;
  void add(float* x, const float* y, int64_t n) override;
  void geglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) override;
  void rms_norm_heads(float* x, int64_t ld, int n_rows, int n_heads, int head_dim, const float* w, float eps) override;
  void scale(float* x, float s, int64_t n) override;
  void gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst) override;
  void copy_to_host(void* host, const void* device, size_t bytes) override;
  void moe_ffn(const float* x, int n_rows, int dim, const MoeFfnWeights& moe, float* out) override;
  std::shared_ptr<const void> upload(const void* host, size_t bytes) override;
  void copy_to_device(void* device, const void* host, size_t bytes) override;
  bool supports_kv_format(const KvFormat&) const override { return true; }
  bool supports_key_centering_by_position() const override { return true; }
  bool supports_tree_attention() const override { return true; }
  // attention() hands its queries to f first (backend/query_observer.h); empty f: none.
  void set_query_observer(QueryObserver f) { query_observer_ = std::move(f); }

 private:
  // cos/sin of every rotated pair for positions [0, size), per RoPE configuration:
  // row p is [rot_dim/2] cos then [rot_dim/2] sin. Grown on demand, computed in double.
  const float* rope_table(const RopeConfig& cfg, int max_pos);

  ThreadPool pool_;
  CpuMatmul matmul_;
  const cpu::OpsTable& ops_;
  std::vector<AlignedBuffer<float>> scratch_;  // per thread, for attention tiles
  struct RopeTable {
    RopeConfig cfg;
    int n_pos = 0;
    std::vector<float> values;
  };
  std::vector<RopeTable> rope_tables_;
  std::vector<const float*> rope_rows_;
  std::vector<cpu::AttentionTask> tasks_;
  std::vector<float> partials_;         // key splits' (O, m, l) per task, merged after the tasks
  std::vector<int64_t> split_offsets_;  // where each (unsplit) task's splits start in partials_
  QueryObserver query_observer_;
  struct StoreRun {
    int token, block, offset, n;  // batch rows [token, token + n) go to block, from offset
  };
  std::vector<StoreRun> store_runs_;
  struct MoeScratch {  // moe_ffn's buffers, grown on demand (cpu_moe.cpp)
    std::vector<float> probs, xg, gate_up, h, y, weight_of;
    std::vector<int32_t> choice, order, start, fill, rows, slot_of;
  } moe_;
};

}  // namespace tessera
