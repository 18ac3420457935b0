#include "backend/cpu/cpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "backend/kv_codec.h"
#include "core/error.h"
#include "core/fp16.h"

namespace tessera {

namespace {
// Query rows per attention tile: enough to reuse each K/V block across rows, few enough
// that the tiles of one sequence spread over the threads.
constexpr int kAttentionTileRows = 16;
// Keys a split of a decode task covers at least: below it the merge and the split's own
// setup (queries, first page) cost more than the thread it frees.
constexpr int kMinKeysPerSplit = 256;

// Key blocks a task's rows can see: up to the last row's position (causal) and kv_len.
int attention_visible_blocks(const AttentionBatch& b, const cpu::AttentionTask& t, int block_size) {
  int max_pos = 0;
  for (int r = t.q_begin; r < t.q_end; ++r) max_pos = std::max(max_pos, b.positions[r]);
  const int len = std::min(b.kv_len[t.seq], max_pos + 1);
  return (len + block_size - 1) / block_size;
}

// Splits of the keys per task so that n_tasks * splits reaches `target`, each split keeping at
// least kMinKeysPerSplit keys of the shortest sequence's context; 1 when none pays. (A split
// left without a whole block, were blocks ever larger than that, sees no key: merged as such.)
int attention_key_splits(const AttentionBatch& b, int n_tasks, int64_t target) {
  int min_len = std::numeric_limits<int>::max();
  for (int s = 0; s < b.n_seqs; ++s) min_len = std::min(min_len, b.kv_len[s]);
  const int want = static_cast<int>((target + n_tasks - 1) / n_tasks);
  return std::max(1, std::min(want, min_len / kMinKeysPerSplit));
}

// One task's splits merged into its output rows: O = sum_s e^(m_s - M) O_s over
// L = sum_s e^(m_s - M) l_s, M the largest m_s (a row no split saw stays 0).
void merge_key_splits(const cpu::AttentionTask& t, int n_split, int group, int hd, const float* parts, float* out,
                      int64_t ldo) {
  const int n_q = (t.q_end - t.q_begin) * group;
  const int64_t stride = int64_t{n_q} * (hd + 2);
  for (int r = 0; r < n_q; ++r) {
    float mx = -std::numeric_limits<float>::infinity();
    for (int sp = 0; sp < n_split; ++sp) mx = std::max(mx, parts[sp * stride + int64_t{r} * (hd + 2) + hd]);
    float* dst = out + static_cast<int64_t>(t.q_begin + r / group) * ldo +
                 static_cast<int64_t>(t.kv_head * group + r % group) * hd;
    std::fill(dst, dst + hd, 0.0f);
    if (mx == -std::numeric_limits<float>::infinity()) continue;
    float den = 0.0f;
    for (int sp = 0; sp < n_split; ++sp) {
      const float* p = parts + sp * stride + int64_t{r} * (hd + 2);
      const float w = std::exp(p[hd] - mx);
      den += w * p[hd + 1];
      for (int d = 0; d < hd; ++d) dst[d] += w * p[d];
    }
    const float inv = den > 0 ? 1.0f / den : 0.0f;
    for (int d = 0; d < hd; ++d) dst[d] *= inv;
  }
}
// Rows per chunk of the cheap row-wise ops (norms, SwiGLU) when split over threads.
constexpr int64_t kRowGrain = 8;

}  // namespace

CpuBackend::CpuBackend(int threads) : CpuBackend(threads, cpu::ops_table()) {}

CpuBackend::CpuBackend(int threads, const cpu::OpsTable& ops)
    : pool_(threads > 0 ? threads : ThreadPool::default_threads()), matmul_(pool_), ops_(ops) {
  scratch_.resize(pool_.size());
}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::describe() const {
  return "cpu (" + std::to_string(pool_.size()) + " threads, matmul " + CpuMatmul::isa() + ", ops " + ops_.isa + ")";
}

void* CpuBackend::alloc(size_t bytes) {
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  if (!p && bytes) fail("cpu backend: out of memory allocating ", bytes, " bytes");
  return p;
}

void CpuBackend::free(void* p) { std::free(p); }

void CpuBackend::embed(const WeightMatrix& table, const int32_t* ids, int n, float* out) {
  cpu_get_rows(table, ids, n, out);
}

void CpuBackend::embed_range(const WeightMatrix& table, int64_t first_id, const int32_t* ids, int n, float* out) {
  const int64_t cols = table.cols;
  for (int i = 0; i < n; ++i) {
    const int64_t local = static_cast<int64_t>(ids[i]) - first_id;
    float* row = out + i * cols;
    if (local < 0 || local >= table.rows) {
      std::fill(row, row + cols, 0.0f);
      continue;
    }
    const int32_t id = static_cast<int32_t>(local);
    cpu_get_rows(table, &id, 1, row);
  }
}

void CpuBackend::rms_norm(const float* x, const float* w, float* out, int n_rows, int dim, float eps) {
  pool_.parallel_for(n_rows, kRowGrain,
                     [&](int64_t b, int64_t e) { ops_.rms_norm_rows(x + b * dim, w, out + b * dim, e - b, dim, eps); });
}

void CpuBackend::add_rms_norm(float* x, const float* residual, const float* w, float* out, int n_rows, int dim,
                              float eps) {
  pool_.parallel_for(n_rows, kRowGrain, [&](int64_t b, int64_t e) {
    ops_.add_rms_norm_rows(x + b * dim, residual + b * dim, w, out + b * dim, e - b, dim, eps);
  });
}

void CpuBackend::matmul(const float* x, int n_rows, int64_t ldx, std::span<const MatmulTarget> targets) {
  matmul_.run(x, n_rows, ldx, targets);
}

void CpuBackend::add_bias(float* x, int64_t ld, const float* bias, int n_rows, int dim) {
  for (int r = 0; r < n_rows; ++r)
    for (int i = 0; i < dim; ++i) x[r * ld + i] += bias[i];
}

const float* CpuBackend::rope_table(const RopeConfig& cfg, int max_pos) {
  RopeTable* t = nullptr;
  for (auto& rt : rope_tables_)
    if (same_rope_config(rt.cfg, cfg)) t = &rt;
  if (!t) {
    rope_tables_.push_back({cfg, 0, {}});
    t = &rope_tables_.back();
  }
  if (max_pos > t->n_pos) {
    const int half = cfg.rot_dim / 2;
    const int n_pos = std::max(max_pos, std::max(1024, t->n_pos * 2));
    t->values.resize(static_cast<size_t>(n_pos) * cfg.rot_dim);
    for (int p = t->n_pos; p < n_pos; ++p) {
      float* row = t->values.data() + static_cast<size_t>(p) * cfg.rot_dim;
      for (int i = 0; i < half; ++i) {
        const double theta = p * rope_inv_freq(cfg, i, cfg.freq_factors);
        row[i] = static_cast<float>(std::cos(theta));
        row[half + i] = static_cast<float>(std::sin(theta));
      }
    }
    t->n_pos = n_pos;
  }
  return t->values.data();
}

void CpuBackend::rope(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* positions, const RopeConfig& cfg) {
  int max_pos = 0;
  for (int r = 0; r < n_rows; ++r) {
    TESSERA_CHECK(positions[r] >= 0, "rope: negative position ", positions[r]);
    max_pos = std::max(max_pos, positions[r] + 1);
  }
  const float* table = rope_table(cfg, max_pos);
  rope_rows_.resize(n_rows);
  for (int r = 0; r < n_rows; ++r) rope_rows_[r] = table + static_cast<size_t>(positions[r]) * cfg.rot_dim;
  pool_.parallel_for(n_rows, kRowGrain, [&](int64_t b, int64_t e) {
    ops_.rope_rows(x + b * ld, e - b, ld, n_heads, cfg.head_dim, cfg.rot_dim, cfg.neox, rope_rows_.data() + b);
  });
}

void CpuBackend::kv_store(const KvLayerView& kv, const float* k, int64_t ldk, const float* v, int64_t ldv,
                          const AttentionBatch& batch) {
  const int hd = kv.head_dim, bs = kv.block_size;
  // Runs of consecutive tokens in one block: a page's tokens are written by one task (the
  // per-channel int4 keys re-code a page's earlier tokens when its range widens).
  store_runs_.clear();
  for (int t = 0; t < batch.n_tokens; ++t) {
    const int slot = batch.slot_mapping[t];
    if (!store_runs_.empty()) {
      StoreRun& last = store_runs_.back();
      if (slot / bs == last.block && slot % bs == last.offset + last.n) {
        ++last.n;
        continue;
      }
    }
    store_runs_.push_back({t, slot / bs, slot % bs, 1});
  }
  const KvPageLayout kl = kv_page_layout(kv.k_fmt, bs, hd), vl = kv_page_layout(kv.v_fmt, bs, hd);
  const int64_t n_tasks = static_cast<int64_t>(store_runs_.size()) * kv.n_kv_heads * 2;
  pool_.parallel_for(n_tasks, 4, [&](int64_t b, int64_t e) {
    // Only TurboQuant's encoder needs scratch: no allocation on the f16/int/fp8 decode path.
    const bool turbo = kv.k_fmt.codec == KvCodec::Turbo || kv.v_fmt.codec == KvCodec::Turbo;
    std::vector<float> scratch(turbo ? kv_encode_scratch_floats(hd) : 0);
    for (int64_t i = b; i < e; ++i) {
      const StoreRun& run = store_runs_[i / (2 * kv.n_kv_heads)];
      const int h = static_cast<int>(i / 2 % kv.n_kv_heads);
      const bool is_key = i % 2 == 0;
      const KvFormat& f = is_key ? kv.k_fmt : kv.v_fmt;
      const KvHeadConstants c = kv_head_constants(f, is_key ? kv.k_consts : kv.v_consts, kv.n_kv_heads, hd, h);
      const int64_t page = static_cast<int64_t>(run.block) * kv.n_kv_heads + h;
      uint8_t* dst = static_cast<uint8_t*>(is_key ? kv.k : kv.v) + page * (is_key ? kv.k_page_bytes : kv.v_page_bytes);
      const float* src = (is_key ? k : v) + run.token * (is_key ? ldk : ldv) + static_cast<int64_t>(h) * hd;
      kv_encode_rows(f, is_key ? kl : vl, hd, c, dst, run.offset, run.n, src, is_key ? ldk : ldv, scratch.data(),
                     batch.positions + run.token);
    }
  });
}

void CpuBackend::attention(const float* q, int64_t ldq, const KvLayerView& kv, const AttentionBatch& batch, int n_heads,
                           float scale, float* out, int64_t ldo) {
  TESSERA_CHECK(kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0, "attention: ", n_heads,
                " query heads are not a multiple of ", kv.n_kv_heads, " KV heads");
  if (query_observer_) query_observer_(q, ldq, batch.n_tokens, n_heads, kv);
  const int group = n_heads / kv.n_kv_heads;
  tasks_.clear();
  for (int s = 0; s < batch.n_seqs; ++s)
    for (int b = batch.q_start[s]; b < batch.q_start[s + 1]; b += kAttentionTileRows)
      for (int h = 0; h < kv.n_kv_heads; ++h)
        tasks_.push_back({s, h, b, std::min(b + kAttentionTileRows, batch.q_start[s + 1])});
  const int64_t target = 2 * static_cast<int64_t>(pool_.size());
  // Too few tasks to keep every thread busy (decode of one sequence: one per KV head, e.g. 3
  // over 2 threads, so one thread does twice the work). Long enough contexts split their keys
  // (each task still serves the whole group: a K/V page is decoded once for all its query
  // heads; the splits are merged below). Otherwise each query head of a group gets its own
  // task, reading the K/V blocks once per query head (from cache after the first).
  const int n_split = static_cast<int64_t>(tasks_.size()) < target && kv.v_fmt.codec != KvCodec::Turbo
                          ? attention_key_splits(batch, static_cast<int>(tasks_.size()), target)
                          : 1;
  const int hd = kv.head_dim;
  if (n_split > 1) {
    const size_t n = tasks_.size();
    split_offsets_.assign(n + 1, 0);
    for (size_t i = 0; i < n; ++i)  // each split's partials: [rows * group][hd + 2]
      split_offsets_[i + 1] =
          split_offsets_[i] + int64_t{n_split} * (tasks_[i].q_end - tasks_[i].q_begin) * group * (hd + 2);
    if (static_cast<int64_t>(partials_.size()) < split_offsets_[n]) partials_.resize(split_offsets_[n]);
    for (size_t i = 0; i < n; ++i) {
      const cpu::AttentionTask base = tasks_[i];
      const int blocks = attention_visible_blocks(batch, base, kv.block_size);
      const int64_t stride = int64_t{base.q_end - base.q_begin} * group * (hd + 2);
      for (int sp = 0; sp < n_split; ++sp) {
        cpu::AttentionTask t = base;
        t.blk_begin = static_cast<int>(int64_t{blocks} * sp / n_split);
        t.blk_end = static_cast<int>(int64_t{blocks} * (sp + 1) / n_split);
        t.partial = partials_.data() + split_offsets_[i] + sp * stride;
        if (sp == 0)
          tasks_[i] = t;
        else
          tasks_.push_back(t);
      }
    }
  } else if (group > 1 && static_cast<int64_t>(tasks_.size()) < target) {
    const size_t n = tasks_.size();
    for (size_t i = 0; i < n; ++i) {
      cpu::AttentionTask t = tasks_[i];
      for (int g = 0; g < group; ++g) {
        t.g_begin = g;
        t.g_end = g + 1;
        if (g == 0)
          tasks_[i] = t;
        else
          tasks_.push_back(t);
      }
    }
  }
  const int64_t need = cpu::attention_scratch_floats(kAttentionTileRows, group, kv.block_size, kv.head_dim);
  for (auto& buf : scratch_)
    if (static_cast<int64_t>(buf.size()) < need) buf.resize(need);
  // Later tiles of a sequence see longer contexts: hand out tasks from the end so the
  // heaviest start first.
  std::atomic<int64_t> next{static_cast<int64_t>(tasks_.size()) - 1};
  pool_.run([&](int thread, int) {
    for (int64_t i; (i = next.fetch_sub(1, std::memory_order_relaxed)) >= 0;)
      ops_.attention(q, ldq, kv, batch, n_heads, scale, out, ldo, tasks_[i], scratch_[thread].data());
  });
  if (n_split > 1) {
    const size_t n = split_offsets_.size() - 1;
    pool_.parallel_for(static_cast<int64_t>(n), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        merge_key_splits(tasks_[i], n_split, group, hd, partials_.data() + split_offsets_[i], out, ldo);
    });
  }
}

void CpuBackend::swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) {
  pool_.parallel_for(n_rows, kRowGrain, [&](int64_t b, int64_t e) {
    ops_.swiglu_rows(gate + b * ld_in, up + b * ld_in, ld_in, out + b * dim, e - b, dim);
  });
}

void CpuBackend::add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

void CpuBackend::geglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) {
  pool_.parallel_for(n_rows, kRowGrain, [&](int64_t b, int64_t e) {
    ops_.geglu_rows(gate + b * ld_in, up + b * ld_in, ld_in, out + b * dim, e - b, dim);
  });
}

void CpuBackend::rms_norm_heads(float* x, int64_t ld, int n_rows, int n_heads, int head_dim, const float* w,
                                float eps) {
  // A row's heads are contiguous: each is one "row" of head_dim for the row kernel (in place).
  pool_.parallel_for(n_rows, kRowGrain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) ops_.rms_norm_rows(x + r * ld, w, x + r * ld, n_heads, head_dim, eps);
  });
}

void CpuBackend::scale(float* x, float s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void CpuBackend::gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst) {
  for (int i = 0; i < n; ++i) std::memcpy(dst + static_cast<int64_t>(i) * dim, src + rows[i] * ld, sizeof(float) * dim);
}

void CpuBackend::copy_to_host(void* host, const void* device, size_t bytes) { std::memcpy(host, device, bytes); }

// Host memory is the CPU's device memory: weights are used where they are (mapped file).
std::shared_ptr<const void> CpuBackend::upload(const void* host, size_t) {
  return std::shared_ptr<const void>(host, [](const void*) {});
}

void CpuBackend::copy_to_device(void* device, const void* host, size_t bytes) { std::memcpy(device, host, bytes); }

}  // namespace tessera
