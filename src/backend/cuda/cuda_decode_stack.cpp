// CudaBackend::decode_stack: batch-1 decode of the whole decoder stack as one persistent
// kernel (decode_stack.cu). This file checks that the stack fits the kernel (16-bit weights
// in the fused Q|K|V and gate|up layouts that make_resident uploads, no biases, an f16 KV
// cache, head sizes 64/128), fills its parameters from the staged batch and launches it;
// anything else returns false and the model runs its blocks op by op.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_factory.h"

namespace tessera {

namespace {

constexpr int kOpDecodeStack = 64;  // graph-signature op id (cuda_backend.cpp numbers its ops from 1)

// Contexts the fused kernel takes: the longest one the block tables can describe (their
// width rounded up to a power of two, as the graph key does), so every forward of one graph
// key makes the same choice. Past it the op-by-op attention, which splits long contexts
// over the whole GPU, runs instead.
constexpr int64_t kMaxStackContext = 8192;

const uint8_t* end_of(const WeightMatrix& m) { return static_cast<const uint8_t*>(m.data) + m.rows * m.row_bytes(); }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

bool same_shape(const cuda::StackShape& a, const cuda::StackShape& b) {
  return a.wtype == b.wtype && a.n_layers == b.n_layers && a.n_embd == b.n_embd && a.n_head == b.n_head &&
         a.n_kv == b.n_kv && a.head_dim == b.head_dim && a.n_ff == b.n_ff && a.rot_dim == b.rot_dim &&
         a.block_size == b.block_size;
}

// Whether every block has the layout and types the kernel reads.
bool blocks_fit(const DecoderStack& st, const cuda::StackShape& sh) {
  const int64_t e = sh.n_embd, q_dim = int64_t{sh.n_head} * sh.head_dim, kv_dim = int64_t{sh.n_kv} * sh.head_dim;
  const KvLayerView& kv0 = st.blocks.front().kv;
  for (const DecoderBlockView& b : st.blocks) {
    if (b.bq || b.bk || b.bv || !b.attn_norm || !b.ffn_norm || !b.kv.k || !b.kv.v) return false;
    for (const WeightMatrix* m : {&b.wq, &b.wk, &b.wv, &b.wo, &b.w_gate, &b.w_up, &b.w_down})
      if (m->dtype != sh.wtype || !m->data) return false;
    if (b.wq.rows != q_dim || b.wk.rows != kv_dim || b.wv.rows != kv_dim || b.wq.cols != e || b.wk.cols != e ||
        b.wv.cols != e || b.wo.rows != e || b.wo.cols != q_dim || b.w_gate.rows != sh.n_ff ||
        b.w_up.rows != sh.n_ff || b.w_gate.cols != e || b.w_up.cols != e || b.w_down.rows != e ||
        b.w_down.cols != sh.n_ff)
      return false;
    // Q|K|V and gate|up back to back (make_resident's layout on a device backend).
    if (b.wk.data != end_of(b.wq) || b.wv.data != end_of(b.wk) || b.w_up.data != end_of(b.w_gate)) return false;
    if (!aligned16(b.wq.data) || !aligned16(b.wo.data) || !aligned16(b.w_gate.data) || !aligned16(b.w_down.data) ||
        !aligned16(b.attn_norm) || !aligned16(b.ffn_norm))
      return false;
    if (b.kv.dtype != DType::F16 || b.kv.n_kv_heads != kv0.n_kv_heads || b.kv.head_dim != kv0.head_dim ||
        b.kv.block_size != kv0.block_size)
      return false;
    if (!aligned16(b.kv.k) || !aligned16(b.kv.v)) return false;  // 16-byte loads of K, 8-byte of V
    // The kernel indexes a layer's cache with 32-bit offsets (halves).
    if (int64_t{b.kv.n_blocks} * b.kv.n_kv_heads * b.kv.block_size * b.kv.head_dim >= (int64_t{1} << 32)) return false;
  }
  return true;
}

}  // namespace

int64_t cuda_fused_decodes(Backend& backend) {
  const auto* cuda = dynamic_cast<const CudaBackend*>(&backend);
  return cuda ? cuda->fused_decodes() : 0;
}

std::string cuda_stack_timing_take(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda ? cuda->take_stack_timing() : std::string();
}

std::string CudaBackend::take_stack_timing() {
  if (stack_timing_n_ == 0 || stack_timing_steps_ == 0 || !stack_plan_) return {};
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const int grid = stack_plan_->launch.grid, layers = stack_plan_->shape.n_layers;
  std::vector<unsigned long long> t(static_cast<size_t>(grid) * layers * cuda::kStackPhases), ns(2 * grid);
  TESSERA_CUDA_CHECK(cudaMemcpy(t.data(), stack_timing_, t.size() * 8, cudaMemcpyDeviceToHost));
  TESSERA_CUDA_CHECK(cudaMemcpy(ns.data(), stack_timing_ns_, ns.size() * 8, cudaMemcpyDeviceToHost));
  double sum_ns = 0, sum_cycles = 0;
  for (int b = 0; b < grid; ++b) {
    sum_ns += static_cast<double>(ns[2 * b]);
    sum_cycles += static_cast<double>(ns[2 * b + 1]);
  }
  const double us_per_cycle = sum_cycles > 0 ? sum_ns / sum_cycles / 1000 : 0;
  static const char* kNames[cuda::kStackPhases] = {
      "norm + Q|K|V",   "rows published", "attention (+ its heads' rows, merge)", "barrier", "O + residual",
      "barrier",        "norm + gate|up", "barrier", "down + residual", "barrier"};
  const double steps = static_cast<double>(stack_timing_steps_);
  std::string out = "| phase | mean us per layer (all blocks) | slowest block, us per layer |\n|---|---|---|\n";
  double total_mean = 0, total_max = 0;
  char line[256];
  for (int ph = 0; ph < cuda::kStackPhases; ++ph) {
    double sum = 0, sum_max = 0;
    for (int l = 0; l < layers; ++l) {
      double mx = 0;
      for (int b = 0; b < grid; ++b) {
        const double v = static_cast<double>(t[(static_cast<size_t>(b) * layers + l) * cuda::kStackPhases + ph]);
        sum += v;
        mx = std::max(mx, v);
      }
      sum_max += mx;
    }
    const double mean = sum / grid / layers / steps * us_per_cycle, worst = sum_max / layers / steps * us_per_cycle;
    total_mean += mean;
    total_max += worst;
    std::snprintf(line, sizeof line, "| %s | %.2f | %.2f |\n", kNames[ph], mean, worst);
    out += line;
  }
  std::snprintf(line, sizeof line, "| all (%d layers, %.0f steps; kernel %.1f us per step) | %.2f | %.2f |\n", layers,
                steps, sum_ns / grid / steps / 1000, total_mean, total_max);
  out += line;
  TESSERA_CUDA_CHECK(cudaMemset(stack_timing_, 0, t.size() * 8));
  TESSERA_CUDA_CHECK(cudaMemset(stack_timing_ns_, 0, ns.size() * 8));
  stack_timing_steps_ = 0;
  return out;
}

bool CudaBackend::decode_stack(const DecoderStack& st, const AttentionBatch& b, float* x) {
  if (!fused_decode_ || b.n_tokens != 1 || b.n_seqs != 1 || st.blocks.empty() || !x || !aligned16(x)) return false;
  const DecoderBlockView& first = st.blocks.front();
  const KvLayerView& kv0 = first.kv;
  if (kv0.dtype != DType::F16 || kv0.block_size < 1 || kv0.n_kv_heads < 1 || st.rope.head_dim != kv0.head_dim)
    return false;
  // The bound a graph key implies (its block tables' width rounded up to a power of two);
  // the kernel keeps the sequence's block table in shared memory.
  const int table_bound = cuda::graph_table_width(b.max_blocks);
  if (int64_t{table_bound} * kv0.block_size > kMaxStackContext || table_bound > cuda::kStackMaxTable) return false;
  cuda::StackShape sh;
  sh.wtype = first.wq.dtype;
  sh.n_layers = static_cast<int>(st.blocks.size());
  sh.n_embd = static_cast<int>(first.wq.cols);
  sh.n_head = st.n_head;
  sh.n_kv = kv0.n_kv_heads;
  sh.head_dim = kv0.head_dim;
  sh.n_ff = static_cast<int>(first.w_gate.rows);
  sh.rot_dim = st.rope.rot_dim;
  sh.block_size = kv0.block_size;
  if (!stack_plan_ || !same_shape(stack_plan_->shape, sh)) {
    auto plan = std::make_unique<StackPlan>();
    plan->shape = sh;
    plan->ok = cuda::plan_decode_stack(sh, sm_count_, plan->params, plan->launch);
    stack_plan_ = std::move(plan);
  }
  if (!stack_plan_->ok || !blocks_fit(st, sh)) return false;

  cuda::OpScope op_scope(profiler_.get(), [&] { return "decode stack (" + std::to_string(sh.n_layers) + " blocks)"; });
  const double* inv_freq = checked_rope_table(b.positions, 1, st.rope);
  const cuda::DeviceBatch db = device_batch(b);
  const cuda::StackLaunch& launch = stack_plan_->launch;
  auto* buf = static_cast<uint8_t*>(
      scratch(stack_scratch_, stack_scratch_cap_, launch.sync_bytes + 256 + launch.scratch_floats * sizeof(float)));
  cuda::StackParams& p = stack_plan_->params;
  p.positions = db.positions;
  p.slots = db.slot_mapping;
  p.kv_len = db.kv_len;
  p.block_table = db.block_tables;
  p.inv_freq = inv_freq;
  p.neox = st.rope.neox ? 1 : 0;
  p.eps = st.rms_eps;
  p.q_scale = st.attn_scale * 1.4426950408889634f;  // scores in base 2
  p.x = x;
  p.sync = reinterpret_cast<unsigned*>(buf);  // the counters, then the activations (256-aligned)
  p.qkv = reinterpret_cast<float*>(buf + (launch.sync_bytes + 255) / 256 * 256);
  p.att = p.qkv + p.q_dim + 2 * p.kv_dim;
  p.act = p.att + p.q_dim;
  p.partials = p.act + p.n_ff;
  // TESSERA_CUDA_STACK_TIMING=1: per-phase clocks (a kernel of its own; take_stack_timing).
  static const bool timing = cuda::env_int("TESSERA_CUDA_STACK_TIMING", 0, 0, 1) == 1;
  const size_t timing_n = static_cast<size_t>(launch.grid) * sh.n_layers * cuda::kStackPhases;
  p.timing = nullptr;
  p.timing_ns = nullptr;
  if (timing) {
    p.timing = static_cast<unsigned long long*>(scratch(stack_timing_, stack_timing_cap_, timing_n * 8));
    p.timing_ns = static_cast<unsigned long long*>(scratch(stack_timing_ns_, stack_timing_ns_cap_, 2 * launch.grid * 8));
    if (stack_timing_n_ != timing_n) {  // a new shape: the clocks start again
      TESSERA_CUDA_CHECK(cudaMemsetAsync(p.timing, 0, timing_n * 8, stream_));
      TESSERA_CUDA_CHECK(cudaMemsetAsync(p.timing_ns, 0, 2 * launch.grid * 8, stream_));
      stack_timing_n_ = timing_n;
      stack_timing_steps_ = 0;
    }
  }
  for (size_t i = 0; i < st.blocks.size(); ++i) {
    const DecoderBlockView& blk = st.blocks[i];
    p.layers[i] = {blk.wq.data, blk.wo.data, blk.w_gate.data, blk.w_down.data, blk.attn_norm, blk.ffn_norm,
                   blk.kv.k, blk.kv.v};
  }
  bool skip = recorded(kOpDecodeStack, x, buf, inv_freq, p.positions, p.slots, p.kv_len, p.block_table, sh.block_size,
                       p.neox, p.eps, p.q_scale, p.timing, static_cast<int>(sh.wtype), sh.n_layers, sh.n_embd,
                       sh.n_head, sh.n_kv, sh.head_dim, sh.n_ff, sh.rot_dim);
  for (int i = 0; i < sh.n_layers; ++i) {
    const cuda::StackLayer& l = p.layers[i];
    for (const void* ptr : {l.wqkv, l.wo, l.wgu, l.wdown, static_cast<const void*>(l.attn_norm),
                            static_cast<const void*>(l.ffn_norm), static_cast<const void*>(l.k),
                            static_cast<const void*>(l.v)})
      skip = recorded(0, ptr);
  }
  ++fused_decodes_;
  if (p.timing) ++stack_timing_steps_;
  if (skip) return true;
  cuda::launch_decode_stack(sh.wtype, p, launch, stream_);
  return true;
}

}  // namespace tessera
