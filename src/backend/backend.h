#pragma once
// The op interface every compute device implements. Model code (model/arch/*.cpp) is written
// once against it. Pointers passed to ops are device pointers of this backend (for the CPU,
// host memory); buffers come from alloc(). Ops are issued in order; synchronize() waits for
// them (a no-op on the CPU, where every op returns when done).
#include <cstddef>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "backend/tensor.h"
#include "core/error.h"

namespace tessera {

struct RopeConfig {
  int head_dim = 0;       // elements per head
  int rot_dim = 0;        // leading elements of each head that rotate (= head_dim usually)
  float freq_base = 10000.0f;
  bool neox = false;      // pairs (i, i + rot_dim/2) instead of (2i, 2i + 1)
  // Llama 3 frequency scaling (rope_scaling.rope_type == "llama3"); factor 0 = off.
  float llama3_factor = 0.0f;
  float llama3_low_freq_factor = 1.0f;
  float llama3_high_freq_factor = 4.0f;
  int llama3_original_ctx = 8192;
  // Linear position scaling (rope_scaling.type == "linear"): positions / linear_factor.
  float linear_factor = 1.0f;
  // Per-pair frequency divisors [rot_dim/2] (GGUF tensor rope_freqs.weight), or nullptr.
  const float* freq_factors = nullptr;
};

// Inverse frequency of rotated pair i, in double, with Llama 3's rescaling, the per-pair
// divisors (read from `host_freq_factors`, a host copy of cfg.freq_factors, or nullptr) and
// linear scaling: every backend's RoPE uses it, so their angles agree.
double rope_inv_freq(const RopeConfig& cfg, int i, const float* host_freq_factors);
// Whether two configurations give the same rotation (for caching tables per configuration).
bool same_rope_config(const RopeConfig& a, const RopeConfig& b);

// One layer's paged KV storage: K and V each [n_blocks, n_kv_heads, block_size, head_dim],
// so one head's keys of one block are contiguous.
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  DType dtype = DType::F16;  // F16 or F32
  int n_blocks = 0;
  int block_size = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
};

// Host-side description of a variable-length batch: sequences s = 0..n_seqs-1 own query rows
// [q_start[s], q_start[s+1]) of the flat token dimension, and after this step's KV write hold
// kv_len[s] tokens, found through block_tables[s * max_blocks + i].
struct AttentionBatch {
  int n_tokens = 0;
  int n_seqs = 0;
  const int32_t* positions = nullptr;     // [n_tokens] absolute position of each row
  const int32_t* slot_mapping = nullptr;  // [n_tokens] block * block_size + offset
  const int32_t* q_start = nullptr;       // [n_seqs + 1]
  const int32_t* kv_len = nullptr;        // [n_seqs]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks]
  int max_blocks = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual std::string describe() const = 0;  // threads / ISA or device name, for reports

  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void synchronize() = 0;

  // out[i, :] = table[ids[i], :]                                     out: [n, table.cols]
  virtual void embed(const WeightMatrix& table, const int32_t* ids, int n, float* out) = 0;
  // out = x / rms(x) * w, row-wise                                   x, out: [n_rows, dim]
  virtual void rms_norm(const float* x, const float* w, float* out, int n_rows, int dim, float eps) = 0;
  // x += residual, then out = rms_norm(x) (fused: one pass over x)
  virtual void add_rms_norm(float* x, const float* residual, const float* w, float* out,
                            int n_rows, int dim, float eps) = 0;
  // x_out = x + residual, then targets' y = W · (rms_norm(x_out) * w): a block's pre-norm and
  // the product after it, so a device backend can fold the norm into the product. x_out must
  // not alias x or residual (a backend may read them while writing it); xn: [n_rows, dim]
  // workspace, its contents afterwards unspecified. All rows dense ([n_rows, dim]).
  virtual void add_rms_norm_matmul(const float* x, const float* residual, const float* w, float* x_out, float* xn,
                                   int n_rows, int dim, float eps, std::span<const MatmulTarget> targets) {
    check_add_rms_norm_matmul_buffers(x, residual, x_out);
    copy_device(x_out, x, sizeof(float) * static_cast<size_t>(n_rows) * dim);
    add_rms_norm(x_out, residual, w, xn, n_rows, dim, eps);
    matmul(xn, n_rows, dim, targets);
  }
  // Shared-input matrix products (see MatmulTarget)                  x: [n_rows, ldx]
  virtual void matmul(const float* x, int n_rows, int64_t ldx, std::span<const MatmulTarget> targets) = 0;
  // x[r, :] += bias                                                  x: [n_rows, ld]
  virtual void add_bias(float* x, int64_t ld, const float* bias, int n_rows, int dim) = 0;
  // Rotates every head of every row in place                         x: [n_rows, ld]
  virtual void rope(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* positions,
                    const RopeConfig& cfg) = 0;
  // Writes this step's keys and values into their slots      k, v: [n_tokens, n_kv_heads*hd]
  virtual void kv_store(const KvLayerView& kv, const float* k, int64_t ldk, const float* v,
                        int64_t ldv, const AttentionBatch& batch) = 0;
  // Causal attention of every query row over its sequence's cached keys and values
  // (tiled, online softmax, GQA).              q: [n_tokens, n_heads*hd]; out likewise
  virtual void attention(const float* q, int64_t ldq, const KvLayerView& kv, const AttentionBatch& batch,
                         int n_heads, float scale, float* out, int64_t ldo) = 0;
  // RoPE on every query and key head of each row (q: n_q_heads heads at stride ldq, k:
  // kv.n_kv_heads heads at stride ldk), then this step's rotated keys and its values into
  // their slots: one call, so a backend can do it in one pass. K's heads may follow Q's in
  // the same rows (the model's Q|K|V layout): then one rope call takes both.
  virtual void rope_kv_store(float* q, int64_t ldq, int n_q_heads, float* k, int64_t ldk, const float* v,
                             int64_t ldv, const KvLayerView& kv, const AttentionBatch& batch, const RopeConfig& cfg) {
    if (k == q + static_cast<int64_t>(n_q_heads) * cfg.head_dim && ldk == ldq) {
      rope(q, batch.n_tokens, ldq, n_q_heads + kv.n_kv_heads, batch.positions, cfg);
    } else {
      rope(q, batch.n_tokens, ldq, n_q_heads, batch.positions, cfg);
      rope(k, batch.n_tokens, ldk, kv.n_kv_heads, batch.positions, cfg);
    }
    kv_store(kv, k, ldk, v, ldv, batch);
  }
  // rope_kv_store, then attention over the cache it wrote: one call, so a backend can fuse
  // them at decode (RoPE and the store inside the attention kernel). q and k hold unspecified
  // values afterwards (rotated in place, or as they were).   out: [n_tokens, n_heads*hd]
  virtual void rope_kv_store_attention(float* q, int64_t ldq, int n_heads, float* k, int64_t ldk, const float* v,
                                       int64_t ldv, const KvLayerView& kv, const AttentionBatch& batch,
                                       const RopeConfig& cfg, float scale, float* out, int64_t ldo) {
    rope_kv_store(q, ldq, n_heads, k, ldk, v, ldv, kv, batch, cfg);
    attention(q, ldq, kv, batch, n_heads, scale, out, ldo);
  }
  // out = silu(gate) * up                        gate, up: [n_rows, ld_in]; out: [n_rows, dim]
  virtual void swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) = 0;
  // targets' y = W · (silu(gate) * up): the FFN's down projection with SwiGLU in front, so a
  // backend can fuse them (a device one feeds the product without an f32 round trip).
  // h: [n_rows, dim] workspace; its contents afterwards are unspecified.
  virtual void swiglu_matmul(const float* gate, const float* up, int64_t ld_in, float* h, int n_rows, int dim,
                             std::span<const MatmulTarget> targets) {
    swiglu(gate, up, ld_in, h, n_rows, dim);
    matmul(h, n_rows, dim, targets);
  }
  // The feed-forward block after its pre-norm: x_out = x + residual; gate's and up's y =
  // W · (rms_norm(x_out) * w) (add_rms_norm_matmul's contract); down's y = W_down ·
  // (silu(gate) * up). One call, so a backend can fuse the SwiGLU into the gate|up product
  // at decode. gate and up: n_ff rows each, y at the same ldy; down: n_ff columns. xn: [n_rows,
  // dim] and h: [n_rows, n_ff] workspaces, unspecified afterwards. down's y may be residual.
  virtual void add_rms_norm_swiglu_ffn(const float* x, const float* residual, const float* w, float* x_out, float* xn,
                                       int n_rows, int dim, float eps, const MatmulTarget& gate,
                                       const MatmulTarget& up, float* h, const MatmulTarget& down) {
    check_swiglu_ffn_targets(dim, gate, up, down);
    const MatmulTarget gate_up[] = {gate, up};
    add_rms_norm_matmul(x, residual, w, x_out, xn, n_rows, dim, eps, gate_up);
    const MatmulTarget out[] = {down};
    swiglu_matmul(gate.y, up.y, gate.ldy, h, n_rows, static_cast<int>(gate.w.rows), out);
  }
  // x += y                                                           [n]
  virtual void add(float* x, const float* y, int64_t n) = 0;
  // Copies rows: dst[i, :] = src[rows[i], :] (gathers the rows whose logits are wanted)
  virtual void gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst) = 0;
  // Device → host copy (a plain memcpy on the CPU)
  virtual void copy_to_host(void* host, const void* device, size_t bytes) = 0;

  // ---- Residency and input staging, for backends whose memory is not the host's ----
  // (Appended as one group so that other additions merge beside it.)

  // A copy of `bytes` of host data that this backend's ops can read, alive as long as the
  // handle: model weights are uploaded once through this. The CPU returns `host` itself.
  virtual std::shared_ptr<const void> upload(const void* host, size_t bytes) = 0;
  // Host → device copy into memory from alloc() (a plain memcpy on the CPU).
  virtual void copy_to_device(void* device, const void* host, size_t bytes) = 0;
  // Announces the host index arrays of the forward about to run (the batch, token ids and
  // logits rows), so that a device backend moves them in one transfer instead of one per op.
  // Ops given host arrays that were not announced still work. A no-op on the CPU.
  virtual void stage_inputs(const AttentionBatch& batch, const int32_t* tokens, const int32_t* logits_rows,
                            int n_logits_rows) {}
  // Device memory still free, in bytes; 0 for a backend that computes in host memory.
  virtual size_t device_free_bytes() { return 0; }

  // ---- Serving on a device: KV block moves, logits readback, decode graphs ----

  // Device → device copy, ordered with the ops (copy-on-write KV blocks).
  virtual void copy_device(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
  // Host ↔ device copies that complete by the next synchronize() (swap of KV blocks); the
  // host memory must stay alive until then. Fastest from alloc_host() memory.
  virtual void copy_to_host_async(void* host, const void* device, size_t bytes) { copy_to_host(host, device, bytes); }
  virtual void copy_to_device_async(void* device, const void* host, size_t bytes) {
    copy_to_device(device, host, bytes);
  }
  // Host memory for transfers (page-locked on a device backend), freed with the handle.
  virtual std::shared_ptr<void> alloc_host(size_t bytes) {
    return std::shared_ptr<void>(new uint8_t[std::max<size_t>(bytes, 1)], [](void* p) { delete[] static_cast<uint8_t*>(p); });
  }

  // Which rows of the next forward's logits the caller reads in full. Rows flagged
  // argmax_only get only their argmax (lowest id on ties) in argmax[row]; a device backend
  // then moves 4 bytes instead of the row. argmax[row] = -1 when the row holds a NaN or
  // +inf or is all -inf: that row is copied in full (so the sampler reports the problem).
  struct LogitsReadback {
    int n_rows = 0;
    const uint8_t* argmax_only = nullptr;  // [n_rows], 1 = argmax only
    int32_t* argmax = nullptr;             // [n_rows] host, written for flagged rows
  };
  // The plan the next read_logits() follows (once); without one every row is copied.
  void plan_logits_readback(const LogitsReadback& plan) { logits_plan_ = plan; }
  // Logits [n_rows, n_vocab] at `device` to `host`, following and clearing the plan; a model
  // calls it once, at the end of its forward.
  void read_logits(float* host, const float* device, int n_rows, int n_vocab) {
    const LogitsReadback plan = logits_plan_;
    logits_plan_ = {};
    read_logits_planned(host, device, n_rows, n_vocab, plan.n_rows == n_rows ? plan : LogitsReadback{});
  }

  // Decode forwards (every sequence one new token, logits rows 0..n-1) of n sequences run
  // fastest when padded to decode_graph_batch(n) sequences: such a forward is captured once
  // as a graph and replayed. 0: this backend replays no graphs; pass batches as they are.
  virtual int decode_graph_batch(int n_seqs) const { return 0; }

 protected:
  // add_rms_norm_swiglu_ffn's shapes, checked by every implementation.
  static void check_swiglu_ffn_targets(int dim, const MatmulTarget& gate, const MatmulTarget& up,
                                       const MatmulTarget& down) {
    TESSERA_CHECK(gate.w.cols == dim && up.w.cols == dim, "add_rms_norm_swiglu_ffn: gate and up are ", gate.w.cols,
                  " and ", up.w.cols, " wide, not ", dim);
    TESSERA_CHECK(gate.w.rows == up.w.rows && down.w.cols == gate.w.rows && gate.ldy == up.ldy,
                  "add_rms_norm_swiglu_ffn: gate (", gate.w.rows, " rows), up (", up.w.rows, " rows, ldy ", up.ldy,
                  " vs ", gate.ldy, ") and down (", down.w.cols, " columns) do not match");
  }
  // add_rms_norm_matmul's contract, checked by every implementation: x_out is a buffer of its
  // own (a device backend reads x and residual in every block while one block writes x_out).
  static void check_add_rms_norm_matmul_buffers(const float* x, const float* residual, const float* x_out) {
    TESSERA_CHECK(x_out != x && x_out != residual, "add_rms_norm_matmul: x_out aliases ",
                  x_out == x ? "x" : "residual", "; it needs a buffer of its own");
  }
  // The whole copy, then the argmax of flagged rows on the host (same rule as the sampler).
  virtual void read_logits_planned(float* host, const float* device, int n_rows, int n_vocab,
                                   const LogitsReadback& plan) {
    copy_to_host(host, device, sizeof(float) * static_cast<size_t>(n_rows) * n_vocab);
    if (!plan.argmax_only) return;
    for (int r = 0; r < n_rows; ++r)
      if (plan.argmax_only[r]) plan.argmax[r] = host_row_argmax(host + static_cast<size_t>(r) * n_vocab, n_vocab);
  }
  // First index of the largest value; -1 for a NaN, a +inf or a row of -inf.
  static int32_t host_row_argmax(const float* row, int n) {
    int32_t best = -1;
    float best_v = -INFINITY;
    for (int i = 0; i < n; ++i) {
      const float v = row[i];
      if (std::isnan(v) || v == INFINITY) return -1;
      if (v > best_v) {
        best_v = v;
        best = i;
      }
    }
    return best;
  }

 private:
  LogitsReadback logits_plan_;
};

struct BackendOptions {
  std::string device = "cpu";  // "cpu" or "cuda[:N]"
  int threads = 0;             // CPU threads; 0 = all cores
  // CUDA: capture decode forwards as graphs and replay them (off: every op is launched).
  bool cuda_graphs = true;
};

// Makes the backend named by options.device; throws tessera::Error naming what is missing
// (e.g. a build without CUDA).
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

}  // namespace tessera
