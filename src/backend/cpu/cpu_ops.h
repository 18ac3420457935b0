#pragma once
// Row kernels of the CPU backend other than the matmul. Each is compiled twice from one
// source (cpu_ops_impl.h): for baseline x86-64 and for AVX2+FMA; cpu_ops_table() picks one
// at run time. The threading is the caller's (CpuBackend): these work on a range of rows.
#include <cstdint>

#include "backend/backend.h"

namespace tessera::cpu {

struct AttentionTask {
  int seq;      // sequence index in the batch
  int kv_head;  // KV head; its query heads are kv_head*group .. +group
  int q_begin;  // query rows [q_begin, q_end) of that sequence (flat batch rows)
  int q_end;
  int g_begin = 0;  // query heads of the group this task computes: [g_begin, g_end), in
  int g_end = -1;   // 0 .. group; g_end < 0 means the whole group
  // A split of the keys (decode of few sequences: more tasks than (sequence, KV head) pairs):
  // key blocks [blk_begin, blk_end) of the sequence's table; the task writes its unnormalized
  // output and softmax state to `partial` ([query vector][head_dim + 2]: O, then m and l; m in
  // natural-log units, -inf with no visible key) for CpuBackend to merge, not to `out`.
  int blk_begin = 0;
  int blk_end = 1 << 30;
  float* partial = nullptr;
};

// Scratch floats one attention task needs, for up to `max_q_rows` query rows.
int64_t attention_scratch_floats(int max_q_rows, int group, int block_size, int head_dim);

struct OpsTable {
  const char* isa;
  void (*rms_norm_rows)(const float* x, const float* w, float* out, int64_t n_rows, int dim, float eps);
  void (*add_rms_norm_rows)(float* x, const float* residual, const float* w, float* out, int64_t n_rows, int dim,
                            float eps);
  void (*swiglu_rows)(const float* gate, const float* up, int64_t ld_in, float* out, int64_t n_rows, int dim);
  // x: [n_rows, ld]; cos_sin: per row, [rot_dim/2] cos then [rot_dim/2] sin
  void (*rope_rows)(float* x, int64_t n_rows, int64_t ld, int n_heads, int head_dim, int rot_dim, bool neox,
                    const float* const* cos_sin_rows);
  void (*attention)(const float* q, int64_t ldq, const KvLayerView& kv, const AttentionBatch& batch, int n_heads,
                    float scale, float* out, int64_t ldo, const AttentionTask& task, float* scratch);
  void (*geglu_rows)(const float* gate, const float* up, int64_t ld_in, float* out, int64_t n_rows, int dim);
};

const OpsTable& ops_table();  // best for this CPU, or forced by TESSERA_ISA=scalar|avx2
const OpsTable& ops_table_scalar();
const OpsTable* ops_table_avx2();  // nullptr when this CPU lacks AVX2+FMA+F16C

}  // namespace tessera::cpu
