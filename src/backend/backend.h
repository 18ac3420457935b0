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

#include "backend/op_types.h"
#include "backend/tensor.h"
#include "core/token_bitmask.h"
#include "core/error.h"

namespace tessera {

// A variable-length batch: sequences s = 0..n_seqs-1 own query rows [q_start[s], q_start[s+1])
// of the flat token dimension, and after this step's KV write hold kv_len[s] tokens, found
// through block_tables[s * max_blocks + i]. The arrays are in this backend's memory (device
// pointers; the ModelRunner stages them); the scalars are host values, so a backend plans its
// launches without reading the arrays back.
struct AttentionBatch {
  int n_tokens = 0;
  int n_seqs = 0;
  bool one_row_each = false;              // every sequence has exactly one query row (a decode batch)
  const int32_t* positions = nullptr;     // [n_tokens] absolute position of each row
  const int32_t* slot_mapping = nullptr;  // [n_tokens] block * block_size + offset
  const int32_t* q_start = nullptr;       // [n_seqs + 1]
  const int32_t* kv_len = nullptr;        // [n_seqs]
  const int32_t* block_tables = nullptr;  // [n_seqs, max_blocks]
  int max_blocks = 0;                     // row stride of block_tables (may exceed every sequence's blocks)
  // The most query rows one sequence has (0: not counted; a backend then takes no kernel
  // that needs it). Part of a graph's key: kernels may size their grids by it.
  int max_rows = 0;
  // Sliding-window attention (Gemma 3's local layers): a query at position p attends keys at
  // positions p - window + 1 .. p only; 0 = every earlier key (plain causal). Per layer: the
  // model passes a copy of the batch with this set.
  int window = 0;
  // Tree verification (docs/design/spec-decode.md, "Trees"): a sequence's query rows may be a
  // tree of draft candidates instead of a chain. Row i of a sequence still writes the key in
  // the slot after row i - 1's, but it follows only its ancestors: bit j of tree_mask[t] says
  // whether row t sees the key its sequence's row j wrote (j < 32; keys before the
  // sequence's first row are seen as always, and keys of rows >= 32 causally). A chain's
  // rows hold every bit up to their own. nullptr: every sequence is a chain (plain causal).
  const uint32_t* tree_mask = nullptr;  // [n_tokens]
  // The position RoPE rotates each row by: a tree node's depth, not its slot. nullptr: the
  // positions above (equal for every chain). Masks and windows always use `positions`.
  const int32_t* rope_positions = nullptr;  // [n_tokens]
  const int32_t* rotation_positions() const { return rope_positions ? rope_positions : positions; }
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
  virtual void add_rms_norm(float* x, const float* residual, const float* w, float* out, int n_rows, int dim,
                            float eps) = 0;
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
  virtual void rope(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* positions, const RopeConfig& cfg) = 0;
  // Writes this step's keys and values into their slots      k, v: [n_tokens, n_kv_heads*hd]
  virtual void kv_store(const KvLayerView& kv, const float* k, int64_t ldk, const float* v, int64_t ldv,
                        const AttentionBatch& batch) = 0;
  // Causal attention of every query row over its sequence's cached keys and values
  // (tiled, online softmax, GQA).              q: [n_tokens, n_heads*hd]; out likewise
  virtual void attention(const float* q, int64_t ldq, const KvLayerView& kv, const AttentionBatch& batch, int n_heads,
                         float scale, float* out, int64_t ldo) = 0;
  // RoPE on every query and key head of each row (q: n_q_heads heads at stride ldq, k:
  // kv.n_kv_heads heads at stride ldk), then this step's rotated keys and its values into
  // their slots: one call, so a backend can do it in one pass. K's heads may follow Q's in
  // the same rows (the model's Q|K|V layout): then one rope call takes both.
  virtual void rope_kv_store(float* q, int64_t ldq, int n_q_heads, float* k, int64_t ldk, const float* v, int64_t ldv,
                             const KvLayerView& kv, const AttentionBatch& batch, const RopeConfig& cfg) {
    if (k == q + static_cast<int64_t>(n_q_heads) * cfg.head_dim && ldk == ldq) {
      rope(q, batch.n_tokens, ldq, n_q_heads + kv.n_kv_heads, batch.rotation_positions(), cfg);
    } else {
      rope(q, batch.n_tokens, ldq, n_q_heads, batch.rotation_positions(), cfg);
      rope(k, batch.n_tokens, ldk, kv.n_kv_heads, batch.rotation_positions(), cfg);
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
                                       int n_rows, int dim, float eps, const MatmulTarget& gate, const MatmulTarget& up,
                                       float* h, const MatmulTarget& down) {
    check_swiglu_ffn_targets(dim, gate, up, down);
    const MatmulTarget gate_up[] = {gate, up};
    add_rms_norm_matmul(x, residual, w, x_out, xn, n_rows, dim, eps, gate_up);
    const MatmulTarget out[] = {down};
    swiglu_matmul(gate.y, up.y, gate.ldy, h, n_rows, static_cast<int>(gate.w.rows), out);
  }
  // x += y                                                           [n]
  virtual void add(float* x, const float* y, int64_t n) = 0;

  // ---- Gemma 3's ops ----
  // (Appended as one group so that other additions merge beside it.)

  // out = gelu_tanh(gate) * up (GeGLU)            gate, up: [n_rows, ld_in]; out: [n_rows, dim]
  virtual void geglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) = 0;
  // In place, every head of every row: x_h = x_h / rms(x_h) * w (QK-norm; w shared by the
  // heads)                                                 x: [n_rows, ld], n_heads*head_dim used
  virtual void rms_norm_heads(float* x, int64_t ld, int n_rows, int n_heads, int head_dim, const float* w,
                              float eps) = 0;
  // x *= s                                                           [n]
  virtual void scale(float* x, float s, int64_t n) = 0;
  // Copies rows: dst[i, :] = src[rows[i], :] (gathers the rows whose logits are wanted; rows
  // is a device array)
  virtual void gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst) = 0;
  // Device → host copy (a plain memcpy on the CPU)
  virtual void copy_to_host(void* host, const void* device, size_t bytes) = 0;

  // ---- Mixture of experts (Mixtral, Qwen3-MoE) ----
  // Per row of x: p = softmax(router · x) over the experts, the n_used largest (ties: lower
  // index first) with weights w = p / (sum of the chosen p) (w = p without moe.renormalize), then
  // out = sum over the chosen k of w_k · down_k(silu(gate_k · x) ⊙ up_k · x).  x, out: [n_rows, dim]
  virtual void moe_ffn(const float* x, int n_rows, int dim, const MoeFfnWeights& moe, float* out) {
    fail("backend ", name(), ": mixture-of-experts layers are not implemented here (run the model on the CPU)");
  }

  // ---- Residency and input staging, for backends whose memory is not the host's ----
  // (Appended as one group so that other additions merge beside it.)

  // A copy of `bytes` of host data that this backend's ops can read, alive as long as the
  // handle: model weights are uploaded once through this. The CPU returns `host` itself.
  virtual std::shared_ptr<const void> upload(const void* host, size_t bytes) = 0;
  // Host → device copy into memory from alloc() (a plain memcpy on the CPU).
  virtual void copy_to_device(void* device, const void* host, size_t bytes) = 0;
  // Device memory still free, in bytes; 0 for a backend that computes in host memory.
  virtual size_t device_free_bytes() { return 0; }

  // ---- Serving on a device: KV block moves, logits readback ----

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
    return std::shared_ptr<void>(new uint8_t[std::max<size_t>(bytes, 1)],
                                 [](void* p) { delete[] static_cast<uint8_t*>(p); });
  }

  // Which rows of a logits readback the caller reads in full. Rows flagged argmax_only get
  // only their argmax (lowest id on ties) in argmax[row]; a device backend then moves 4 bytes
  // instead of the row. argmax[row] = -1 when the row holds a NaN or +inf or is all -inf:
  // that row is copied in full (so the sampler reports the problem).
  struct LogitsReadback {
    const uint8_t* argmax_only = nullptr;  // [n_rows], 1 = argmax only; null: every row in full
    int32_t* argmax = nullptr;             // [n_rows] host, written for flagged rows
  };
  // Logits [n_rows, n_vocab] at `device` to `host` as `plan` says; waits for the ops before it.
  virtual void read_logits(float* host, const float* device, int n_rows, int n_vocab, const LogitsReadback& plan) {
    copy_to_host(host, device, sizeof(float) * static_cast<size_t>(n_rows) * n_vocab);
    if (!plan.argmax_only) return;
    for (int r = 0; r < n_rows; ++r)
      if (plan.argmax_only[r]) plan.argmax[r] = host_row_argmax(host + static_cast<size_t>(r) * n_vocab, n_vocab);
  }

  // ---- Structured output: token masks on the logits, before their readback ----

  // For i < rows.size(): every logit of row rows[i] whose token mask i forbids becomes -inf
  // (core/token_bitmask.h's layout: bit t % 32 of word t / 32, 1 = allowed); rows[i] = -1
  // skips mask i. logits: [*, n_vocab] in this backend's memory; rows [n] and masks [n, words]
  // (words >= (n_vocab + 31) / 32) in host memory. Ordered with the ops, so a read_logits()
  // after it (its argmax included) sees the masked rows. masks must stay unchanged until the
  // next read_logits() or synchronize(): a device backend uploads them in one asynchronous
  // copy, without staging when they come from alloc_host().
  virtual void apply_token_bitmask(float* logits, int n_vocab, std::span<const int32_t> rows, const int32_t* masks,
                                   int words) {
    check_token_bitmask(n_vocab, words);
    for (size_t i = 0; i < rows.size(); ++i)
      if (rows[i] >= 0)
        tessera::apply_token_bitmask(std::span<float>(logits + static_cast<size_t>(rows[i]) * n_vocab, n_vocab),
                                     std::span<const int32_t>(masks + i * words, static_cast<size_t>(words)));
  }

  // ---- KV storage formats ----

  // Whether kv_store and attention center keys by position (layer constants with a RoPE
  // part, kv_codec.h): store k − R(p)·m, add q·R(p)·m back to each score. (The first key's
  // own center, the constants' `first` part, every backend with TurboQuant keys reads.)
  virtual bool supports_key_centering_by_position() const { return false; }
  // Moves single tokens' K and V within one layer's cache, in order: each head's codes and
  // the token's own scales (formats whose scales are per page cannot move a token alone; the
  // caller checks). Tree verification moves the kept path to its slots. The default copies
  // through copy_device piece by piece; a device backend launches one kernel.
  virtual void move_kv_tokens(const KvLayerView& kv, std::span<const KvSlotMove> moves);
  // Whether attention follows AttentionBatch::tree_mask and RoPE its rope_positions (tree
  // verification of draft candidates). A backend without them gets chains only.
  virtual bool supports_tree_attention() const { return false; }
  // Whether kv_store and attention take K / V in format f (backend/kv_format.h).
  virtual bool supports_kv_format(const KvFormat& f) const { return f.is_plain(); }

  // ---- Graphs: a stretch of ops recorded once and launched again (the ModelRunner's) ----

  // A recorded stretch of ops. launch() runs them again with the same arguments; what they
  // read at device addresses is read at launch time, so new values staged at the same
  // addresses make a new step.
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual void launch() = 0;
  };
  // Whether begin_capture() works here (false on the CPU, or with graphs switched off).
  virtual bool supports_graphs() const { return false; }
  // Ops issued between begin_capture() and end_capture() are recorded, not run (no copy to
  // the host, no synchronize() in between). abandon_capture() drops a capture an exception
  // interrupted (a no-op when none is open).
  virtual void begin_capture() { fail("backend ", name(), " records no graphs"); }
  virtual std::unique_ptr<Graph> end_capture() { fail("backend ", name(), " records no graphs"); }
  virtual void abandon_capture() {}
  // Changes whenever a scratch buffer the ops use moves: a graph captured under another
  // value reads freed memory and must be captured again.
  virtual uint64_t graph_epoch() const { return 0; }

  // ---- Tensor parallelism (docs/design/parallel.md) ----
  // (Appended as one group so that other additions merge beside it.)

  // A vocabulary-parallel embedding's slice: out[i, :] = table[ids[i] - first_id, :] when
  // first_id <= ids[i] < first_id + table.rows, else zeros (another rank holds that row; the
  // ranks' outputs are then summed).                               out: [n, table.cols]
  virtual void embed_range(const WeightMatrix& table, int64_t first_id, const int32_t* ids, int n, float* out) {
    fail("backend ", name(), ": no vocabulary-parallel embedding (tensor parallelism) here");
  }

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
  // moe_ffn's weights against the width of x, checked by every implementation.
  static void check_moe_ffn(const MoeFfnWeights& moe, int dim) {
    const int n_exp = moe.n_expert, k = moe.n_used, ff = moe.n_ff;
    TESSERA_CHECK(n_exp >= 1 && k >= 1 && k <= n_exp && ff >= 1 && moe.gate && moe.up && moe.down, "moe_ffn: ", k,
                  " of ", n_exp, " experts of width ", ff);
    TESSERA_CHECK(moe.router.rows == n_exp && moe.router.cols == dim, "moe_ffn: router is ", moe.router.rows, "x",
                  moe.router.cols, ", expected ", n_exp, "x", dim);
    for (int e = 0; e < n_exp; ++e) {
      const WeightMatrix &g = moe.gate[e], &u = moe.up[e], &d = moe.down[e];
      TESSERA_CHECK(g.rows == ff && g.cols == dim && u.rows == ff && u.cols == dim && d.rows == dim && d.cols == ff,
                    "moe_ffn: expert ", e, " has gate ", g.rows, "x", g.cols, ", up ", u.rows, "x", u.cols, ", down ",
                    d.rows, "x", d.cols, "; expected ", ff, "x", dim, " and ", dim, "x", ff);
    }
  }
  // add_rms_norm_matmul's contract, checked by every implementation: x_out is a buffer of its
  // own (a device backend reads x and residual in every block while one block writes x_out).
  static void check_add_rms_norm_matmul_buffers(const float* x, const float* residual, const float* x_out) {
    TESSERA_CHECK(x_out != x && x_out != residual, "add_rms_norm_matmul: x_out aliases ", x_out == x ? "x" : "residual",
                  "; it needs a buffer of its own");
  }
  // apply_token_bitmask's mask width, checked by every implementation.
  static void check_token_bitmask(int n_vocab, int words) {
    TESSERA_CHECK(n_vocab >= 1 && words >= token_bitmask_words(n_vocab), "apply_token_bitmask: masks of ", words,
                  " words for ", n_vocab, " logits");
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
