#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/cuda_diag.h"
#include "backend/cuda/cuda_factory.h"
#include "backend/cuda/cuda_tuning.h"
#include "backend/cuda/decode_split.h"
#include "backend/cuda/gemm_fp8.h"
#include "backend/cuda/gemma_kernels.h"
#include "backend/cuda/gemv_mma16.h"
#include "backend/cuda/q8_producers.h"
#include "core/error.h"

namespace tessera {

namespace cuda {

void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  fail("CUDA error ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ") in ", what, " at ", file, ":", line);
}

void throw_cublas_error(int status, const char* what, const char* file, int line) {
  fail("cuBLASLt error ", status, " in ", what, " at ", file, ":", line);
}

}  // namespace cuda

namespace {

using cuda::round_up;

// Whether a product of n_rows rows runs on a skinny tensor-core kernel that reads each weight
// once (gemv_mma16.cu: 16-bit and FP8W weights; gemv_gq_mma.cu: W4G/W8G), inside the row
// ranges where it measured faster than the alternatives (their limits in gemv_mma16.h;
// docs/benchmarks/weight-quant.md). One row takes the bulk kernel before these.
bool skinny16(int n_rows, const WeightMatrix& w) { return cuda::gemv_mma16_applies(w.dtype, n_rows, w.cols, w.data); }
bool skinny_gq(int n_rows, const WeightMatrix& w) { return cuda::gemv_gq_mma_applies(n_rows, w); }

// Whether a product of n_rows rows runs on the matrix-vector kernels (gemv*.cu) rather than a
// GEMM-shaped path: one row always; 2..kGemvMaxRows rows unless every weight takes a skinny
// tensor-core kernel or is plain f16/bf16 (cuBLASLt). The multi-row GEMV decodes each weight
// once but loads x per element and row from L1, which for 16-bit weights made it slower than
// reading the weights once per row (Llama-3.1-8B bf16 on an H100, docs/benchmarks/gpu.md: 8
// rows 65 ms a forward, 2 rows 19 ms, against 5.2 ms for 1 row and 8.5 ms for 16 rows through
// cuBLASLt).
bool gemv_rows(int n_rows, std::span<const MatmulTarget> targets) {
  if (n_rows == 1) return true;
  if (n_rows > cuda::kGemvMaxRows) return false;
  for (const MatmulTarget& t : targets)
    if (t.w.dtype != DType::F16 && t.w.dtype != DType::BF16 && !skinny16(n_rows, t.w) && !skinny_gq(n_rows, t.w))
      return true;
  return false;
}

// Whether a product's 16-bit activations are f16 rather than bf16: f16 weights, and
// group-quantized weights on the skinny tensor-core kernel (their codes decode exactly to
// f16; FP8W weights never take 16-bit activations from the fused paths).
bool wants_f16(int n_rows, const WeightMatrix& w) { return w.dtype == DType::F16 || skinny_gq(n_rows, w); }

// Whether every run reads x only as Q8 rows (group-quantized weights without an act-order
// permutation, GGUF block formats on the integer kernels): then the kernel in front of the
// product (norm, SwiGLU) can write x in that form itself, and no quantize launch is needed.
bool takes_q8_input(int64_t cols, const MatmulTarget* runs, int n_runs) {
  for (int i = 0; i < n_runs; ++i) {
    const WeightMatrix& w = runs[i].w;
    if (is_group_quant(w.dtype) ? w.gq_perm : !cuda::gemv_blocks_q8_applies(w.dtype, cols)) return false;
  }
  return n_runs > 0;
}

// Profile names: the path taken and the shape, e.g. "gemv bf16 [1 x 4096] -> 6144 (3 targets)".
std::string matmul_op_name(int n_rows, std::span<const MatmulTarget> targets) {
  int64_t rows = 0;
  for (const MatmulTarget& t : targets) rows += t.w.rows;
  const WeightMatrix& w0 = targets[0].w;
  const char* path = gemv_rows(n_rows, targets)                      ? "gemv "
                     : skinny16(n_rows, w0) || skinny_gq(n_rows, w0) ? "mma "
                                                                     : "gemm ";
  return std::string(path) + std::string(dtype_name(targets[0].w.dtype)) + " [" + std::to_string(n_rows) + " x " +
         std::to_string(targets[0].w.cols) + "] -> " + std::to_string(rows) +
         (targets.size() > 1 ? " (" + std::to_string(targets.size()) + " targets)" : "");
}

// The bulk / warp kernels' view of a target (FP8W weights carry their per-row scales).
cuda::GemvTarget gemv_target(const MatmulTarget& t) {
  return {t.w.data, t.y, t.ldy, t.w.rows, is_fp8_weight(t.w.dtype) ? t.w.fp8_scales() : nullptr};
}

// Whether a batch of a few rows per sequence (a speculative verification) takes the split
// decode kernels in chunks of rows: the tensor-core f16 kernel or the quantized pages'
// fragment kernel, while no sequence has more than kDecodeMmaMaxRows rows (as the runner
// counted them: AttentionBatch::max_rows, part of the graph key).
bool verification_kernel(const KvLayerView& kv, const AttentionBatch& b, int n_heads) {
  if (b.one_row_each || b.window != 0 || b.max_rows < 1 || b.max_rows > cuda::CudaTuning::kDecodeMmaMaxRows)
    return false;
  // Draft trees over quantized pages take the prefill kernel: the fragment kernel's largest
  // variants sit at the register limit (a tree mask spilled them).
  if (b.tree_mask && kv.plain_dtype() == DType::Unknown) return false;
  return kv.plain_dtype() == DType::Unknown ? cuda::attention_quant_decode_frag_applies(kv, n_heads)
                                            : cuda::attention_decode_mma_applies(kv, n_heads);
}

std::string attention_op_name(const KvLayerView& kv, const AttentionBatch& b, int n_heads) {
  if (verification_kernel(kv, b, n_heads)) return "attention verify";
  return b.one_row_each ? "attention decode" : "attention prefill";
}

}  // namespace

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error here, just none
    return 0;
  }
  return n;
}

bool cuda_compiled() { return true; }

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  int device = 0;
  if (options.device.size() > 4) {
    const std::string idx = options.device.substr(5);
    TESSERA_CHECK(!idx.empty() && idx.find_first_not_of("0123456789") == std::string::npos && idx.size() < 4,
                  "device '", options.device, "': expected cuda or cuda:N");
    device = std::stoi(idx);
  }
  const int n = cuda_device_count();
  TESSERA_CHECK(n > 0, "device '", options.device, "': no CUDA device is visible (driver missing or no GPU)");
  TESSERA_CHECK(device < n, "device '", options.device, "': only ", n, " CUDA device(s) visible");
  return std::make_unique<CudaBackend>(device, options.cuda_graphs);
}

CudaBackend::CudaBackend(int device, bool graphs) : device_(device) {
  graphs_enabled_ = graphs;
  // A bad TESSERA_CUDA_DIAG (or a probe this build lacks) fails before anything is allocated.
  const cuda::Diagnostics& diag = cuda::diagnostics();
  TESSERA_CUDA_CHECK(cudaSetDevice(device_));
  cuda::probe_open();
  cudaDeviceProp prop{};
  TESSERA_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  sm_count_ = prop.multiProcessorCount;
  std::ostringstream os;
  os << "cuda:" << device_ << " (" << prop.name << ", " << prop.multiProcessorCount << " SMs, "
     << prop.totalGlobalMem / (1u << 30) << " GiB, cc " << prop.major << "." << prop.minor << ")";
  describe_ = os.str();
  TESSERA_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  gemm_ = std::make_unique<cuda::GemmLt>();
  if (diag.profile) {
    profiler_ = std::make_unique<cuda::OpProfiler>(stream_);
    graphs_enabled_ = false;  // ops inside a replayed graph cannot be bracketed one by one
  }
}

std::string CudaBackend::take_profile() {
  if (!profiler_) return {};
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  profiler_->collect();
  std::string r = profiler_->report();
  profiler_ = std::make_unique<cuda::OpProfiler>(stream_);
  return r;
}

std::string cuda_profile_take(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  return cuda ? cuda->take_profile() : std::string();
}

CudaBackend::~CudaBackend() {
  // Destructors do not throw: errors here are dropped (the process may be exiting).
  cudaStreamSynchronize(stream_);
  cuda::probe_close();
  if (profiler_) {
    profiler_->collect();
    if (!profiler_->empty())
      std::fprintf(stderr, "[cuda profile] device time per op:\n%s", profiler_->report().c_str());
    profiler_.reset();
  }
  if (capturing_) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(stream_, &g);
    if (g) cudaGraphDestroy(g);
  }
  cudaFree(argmax_dev_);
  cudaFree(mask_dev_);
  if (mask_rows_uploaded_) cudaEventDestroy(mask_rows_uploaded_);
  gemm_.reset();
  for (auto& t : rope_tables_) cudaFree(t.inv_freq);
  cudaFree(act16_);
  cudaFree(wdeq_);
  cudaFree(xq8_);
  cudaFree(actq_);
  cudaFree(partials_);
  cudaFree(moe_buf_);
  cudaFree(moe_gather_);
  for (auto& t : moe_tables_) cudaFree(t.dev);
  cudaStreamDestroy(stream_);
}

void* CudaBackend::alloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, std::max<size_t>(bytes, 1));
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    fail("cuda backend: out of device memory allocating ", bytes, " bytes (", free_b, " of ", total,
         " free): ", cudaGetErrorString(err));
  }
  return p;
}

void CudaBackend::free(void* p) {
  if (p) TESSERA_CUDA_CHECK(cudaFree(p));
}

void CudaBackend::synchronize() {
  TESSERA_CHECK(!capturing_, "cuda: synchronize() inside a graph capture");
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (profiler_) profiler_->collect();
}

void* CudaBackend::scratch(void*& buf, size_t& cap, size_t bytes) {
  if (bytes > cap) {
    // Captured graphs point into scratch buffers: a buffer that moves invalidates them. A
    // capture never grows one (its eager run, with the same shapes, grew them already).
    TESSERA_CHECK(!capturing_, "cuda graphs: a scratch buffer grows inside a graph capture");
    ++graph_epoch_;
    if (buf) TESSERA_CUDA_CHECK(cudaFree(buf));  // cudaFree waits for the kernels still using it
    buf = nullptr;
    cap = round_up(bytes + bytes / 4, 256);
    buf = alloc(cap);
  }
  return buf;
}

std::shared_ptr<const void> CudaBackend::upload(const void* host, size_t bytes) {
  void* d = alloc(bytes);
  TESSERA_CUDA_CHECK(cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice));
  return std::shared_ptr<const void>(d, [](const void* p) { cudaFree(const_cast<void*>(p)); });
}

void CudaBackend::copy_to_device(void* device, const void* host, size_t bytes) {
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the caller may reuse `host` at once
}

void CudaBackend::copy_to_host(void* host, const void* device, size_t bytes) {
  TESSERA_CHECK(!capturing_, "cuda: copy_to_host inside a graph capture");
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
  TESSERA_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (profiler_) profiler_->collect();
}

void CudaBackend::copy_device(void* dst, const void* src, size_t bytes) {
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

void CudaBackend::copy_to_host_async(void* host, const void* device, size_t bytes) {
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_));
}

void CudaBackend::copy_to_device_async(void* device, const void* host, size_t bytes) {
  TESSERA_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_));
}

std::shared_ptr<void> CudaBackend::alloc_host(size_t bytes) { return cuda_pinned_host(bytes); }

size_t CudaBackend::device_free_bytes() {
  size_t free_b = 0, total = 0;
  TESSERA_CUDA_CHECK(cudaMemGetInfo(&free_b, &total));
  return free_b;
}

void CudaBackend::move_kv_tokens(const KvLayerView& kv, std::span<const KvSlotMove> moves) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("kv token moves"); });
  if (!moves.empty()) cuda::launch_move_kv_tokens(kv, moves, stream_);
}

cuda::DeviceBatch CudaBackend::device_batch(const AttentionBatch& b) {
  cuda::DeviceBatch d;
  d.n_tokens = b.n_tokens;
  d.n_seqs = b.n_seqs;
  d.max_blocks = b.max_blocks;
  d.positions = b.positions;
  d.slot_mapping = b.slot_mapping;
  d.q_start = b.q_start;
  d.kv_len = b.kv_len;
  d.block_tables = b.block_tables;
  d.tree_mask = b.tree_mask;
  return d;
}

// ---- Ops ----

void CudaBackend::embed(const WeightMatrix& table, const int32_t* ids, int n, float* out) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("embed"); });
  cuda::launch_embed(table, ids, n, out, stream_);
}

void CudaBackend::embed_range(const WeightMatrix& table, int64_t first_id, const int32_t* ids, int n, float* out) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("embed_range"); });
  cuda::launch_embed(table, ids, n, out, stream_, first_id);
}

void CudaBackend::rms_norm(const float* x, const float* w, float* out, int n_rows, int dim, float eps) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("rms_norm"); });
  cuda::launch_rms_norm(x, w, out, n_rows, dim, eps, stream_);
}

void CudaBackend::add_rms_norm(float* x, const float* residual, const float* w, float* out, int n_rows, int dim,
                               float eps) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("add_rms_norm"); });
  cuda::launch_add_rms_norm(x, residual, w, out, n_rows, dim, eps, stream_);
}

// Targets that sit back to back — weights in one allocation (make_resident puts Q|K|V and
// gate|up so), outputs side by side in the same rows (the model's layout) — run as one product.
int CudaBackend::coalesce(std::span<const MatmulTarget> targets, MatmulTarget* runs) {
  TESSERA_CHECK(targets.size() <= kMaxTargets, "cuda matmul: ", targets.size(), " targets (at most ", kMaxTargets, ")");
  int n = 0;
  for (const MatmulTarget& t : targets) {
    if (n > 0) {
      MatmulTarget& r = runs[n - 1];
      const auto* end = static_cast<const uint8_t*>(r.w.data) + r.w.rows * r.w.row_bytes();
      // Quantized weights are planes (codes, then scales): never concatenated.
      if (!is_group_quant(t.w.dtype) && !is_fp8_weight(t.w.dtype) && t.w.dtype == r.w.dtype && t.w.cols == r.w.cols &&
          t.w.data == end && t.ldy == r.ldy && t.y == r.y + r.w.rows) {
        r.w.rows += t.w.rows;
        continue;
      }
    }
    runs[n++] = t;
  }
  return n;
}

// Integer kernels read x quantized per 32 columns: the first half of the scratch (slot 0); the
// second (slot 1) holds x quantized through an act-order permutation (gemv).
cuda::Q8Rows CudaBackend::q8_input(int n_rows, int64_t cols, int slot) {
  const size_t q8_bytes = round_up(cuda::q8_rows_bytes(n_rows, cols), 256);
  auto* base = static_cast<uint8_t*>(scratch(xq8_, xq8_cap_, 2 * q8_bytes));
  return cuda::q8_rows_view(base + slot * q8_bytes, n_rows, cols);
}

void CudaBackend::gemv(const cuda::GemvInput& in, int n_rows, int64_t ldx, int64_t cols, const MatmulTarget* runs,
                       int n_runs, bool x_is_q8) {
  // Decode: straight from the stored format, targets of one type grouped into one launch.
  // Integer kernels read x quantized per 32 columns (quantize_q8.cu), once per call, unless the
  // kernel before wrote it so (x_is_q8).
  bool x_quantized = x_is_q8;
  auto quantized_x = [&] {
    const cuda::Q8Rows xq = q8_input(n_rows, cols);
    if (!x_quantized) cuda::launch_quantize_q8_rows(in.x, n_rows, ldx, cols, nullptr, xq, stream_);
    x_quantized = true;
    return xq;
  };
  int i = 0;
  while (i < n_runs) {
    if (is_group_quant(runs[i].w.dtype)) {
      // Straight from the codes (gemv_gq.cu): weights of one type and group size without a
      // permutation in one launch; an act-order weight alone, on x quantized through its permutation.
      TESSERA_CHECK(!in.up && !in.residual, "cuda gemv: a fused input needs the bulk kernel");
      const WeightMatrix& w0 = runs[i].w;
      if (w0.gq_perm) {
        const cuda::Q8Rows xp = q8_input(n_rows, cols, /*slot=*/1);
        const auto* perm =
            reinterpret_cast<const int32_t*>(static_cast<const uint8_t*>(w0.data) + w0.gq_layout().off_perm);
        cuda::launch_quantize_q8_rows(in.x, n_rows, ldx, cols, perm, xp, stream_);
        MatmulTarget t = runs[i++];
        t.w.gq_perm = false;  // the kernel reads codes, scales and zeros; x is already in stored order
        cuda::launch_gemv_gq(xp, n_rows, &t, 1, sm_count_, stream_);
        continue;
      }
      const cuda::Q8Rows xq = quantized_x();
      MatmulTarget g[cuda::kGemvMaxTargets];
      int n = 0;
      while (i < n_runs && n < cuda::kGemvMaxTargets && runs[i].w.dtype == w0.dtype && !runs[i].w.gq_perm &&
             runs[i].w.group_size == w0.group_size)
        g[n++] = runs[i++];
      cuda::launch_gemv_gq(xq, n_rows, g, n, sm_count_, stream_);
      continue;
    }
    cuda::GemvTarget g[cuda::kGemvMaxTargets];
    const int first = i;
    int n = 0;
    const DType type = runs[i].w.dtype;
    while (i < n_runs && n < cuda::kGemvMaxTargets && runs[i].w.dtype == type && !is_group_quant(type)) {
      g[n++] = gemv_target(runs[i]);
      ++i;
    }
    if (n_rows == 1 && cuda::launch_gemv_bulk(type, in, cols, g, n, sm_count_, stream_)) continue;
    TESSERA_CHECK(!in.up && !in.residual, "cuda gemv: a fused input needs the bulk kernel");
    if (cuda::gemv_blocks_q8_applies(type, cols)) {  // GGUF Q4_0/Q4_1/Q8_0/Q4_K (gemv_blocks_q8.cu)
      cuda::launch_gemv_blocks_q8(type, quantized_x(), n_rows, cols, g, n, stream_);
      continue;
    }
    if (is_fp8_weight(type)) {  // any width, 1-8 rows (gemv_fp8.cu)
      cuda::launch_gemv_fp8(in.x, n_rows, ldx, runs + first, n, stream_);
      continue;
    }
    TESSERA_CHECK(cuda::launch_gemv(type, in.x, n_rows, ldx, cols, g, n, stream_), "cuda matmul: weight type ",
                  dtype_name(type), " is not supported");
  }
}

void CudaBackend::gemm(const float* x, int n_rows, int64_t ldx, int64_t cols, const MatmulTarget* runs, int n_runs,
                       const uint16_t* pre16, bool pre_bf16) {
  // Tensor cores through cuBLASLt. Activations are converted once per 16-bit type (or come
  // converted already: pre16, dense [n_rows, cols]).
  const uint16_t* x_bf16 = pre16 && pre_bf16 ? pre16 : nullptr;
  const uint16_t* x_f16 = pre16 && !pre_bf16 ? pre16 : nullptr;
  auto act = [&](bool bf16) {
    const uint16_t*& cached = bf16 ? x_bf16 : x_f16;
    if (!cached) {
      // Both conversions may be needed in one call: the second half of the scratch is the f16 one.
      const size_t half_bytes = round_up(static_cast<size_t>(n_rows) * cols * 2, 256);
      auto* base = static_cast<uint8_t*>(scratch(act16_, act16_cap_, 2 * half_bytes));
      auto* dst = reinterpret_cast<uint16_t*>(base + (bf16 ? 0 : half_bytes));
      TESSERA_CHECK(x, "cuda gemm: no f32 activations to convert");
      cuda::launch_convert_rows(x, n_rows, ldx, cols, dst, bf16, stream_);
      cached = dst;
    }
    return cached;
  };
  // FP8W: the activations quantized per row to E4M3 once per call ([n_rows][ldq] codes, then
  // n_rows f32 scales), for cuBLASLt's FP8 GEMM with K padded to 16 (zero codes on both sides).
  const uint8_t* xq = nullptr;
  const float* sx = nullptr;
  const int64_t ldq = static_cast<int64_t>(round_up(static_cast<size_t>(cols), 16));
  auto act_fp8 = [&] {
    if (!xq) {
      TESSERA_CHECK(x, "cuda gemm: FP8 weights need f32 activations");
      const size_t code_bytes = round_up(static_cast<size_t>(n_rows) * ldq, 256);
      auto* base = static_cast<uint8_t*>(scratch(actq_, actq_cap_, code_bytes + sizeof(float) * n_rows));
      xq = base;
      sx = reinterpret_cast<const float*>(base + code_bytes);
      cuda::launch_quantize_rows_e4m3(x, n_rows, ldx, cols, base, ldq, reinterpret_cast<float*>(base + code_bytes),
                                      stream_);
    }
  };
  for (int i = 0; i < n_runs; ++i) {
    const MatmulTarget& t = runs[i];
    const WeightMatrix& w = t.w;
    // A few rows of 16-bit or FP8W weights: the tensor-core kernel that reads each weight once
    // (gemv_mma16.cu), consecutive runs of one type in one launch.
    if (skinny16(n_rows, w)) {
      const uint16_t* x16 = act(w.dtype == DType::BF16);
      cuda::GemvTarget g[cuda::kGemvMaxTargets];
      int n = 0;
      while (i + n < n_runs && n < cuda::kGemvMaxTargets && runs[i + n].w.dtype == w.dtype &&
             skinny16(n_rows, runs[i + n].w)) {
        g[n] = gemv_target(runs[i + n]);
        ++n;
      }
      cuda::launch_gemv_mma16(w.dtype, x16, n_rows, cols, g, n, stream_);
      i += n - 1;
      continue;
    }
    // The same for group-quantized codes, decoded in registers (gemv_gq_mma.cu), f16 x.
    if (skinny_gq(n_rows, w)) {
      const uint16_t* x16 = act(false);
      int n = 1;
      while (i + n < n_runs && n < cuda::kGemvMaxTargets && runs[i + n].w.dtype == w.dtype &&
             runs[i + n].w.group_size == w.group_size && skinny_gq(n_rows, runs[i + n].w))
        ++n;
      cuda::launch_gemv_gq_mma(x16, n_rows, runs + i, n, stream_);
      i += n - 1;
      continue;
    }
    // cuBLASLt's FP8 kernels want output rows in multiples of 16 and a 16-byte aligned output
    // (measured on cuBLAS 13.1: 37 rows, or an output at an 8-byte offset, find no algorithm);
    // other shapes take the weights decoded to bf16 and the bf16 GEMM.
    if (is_fp8_weight(w.dtype) && (w.rows % 16 != 0 || t.ldy % 4 != 0 || reinterpret_cast<uintptr_t>(t.y) % 16 != 0)) {
      auto* wb = static_cast<uint16_t*>(scratch(wdeq_, wdeq_cap_, static_cast<size_t>(w.rows) * cols * 2));
      cuda::launch_dequant_fp8_bf16(w, wb, stream_);
      gemm_->run(CUDA_R_16BF, wb, cols, act(true), cols, t.y, t.ldy, w.rows, n_rows, cols, stream_);
      continue;
    }
    if (is_fp8_weight(w.dtype)) {
      act_fp8();
      TESSERA_CHECK(w.row_bytes() == ldq, "cuda gemm: FP8 weight row stride ", w.row_bytes(), " vs ", ldq);
      gemm_->run(CUDA_R_8F_E4M3, w.data, ldq, xq, ldq, t.y, t.ldy, w.rows, n_rows, ldq, stream_);
      cuda::launch_scale_outer(t.y, t.ldy, n_rows, w.rows, w.fp8_scales(), sx, stream_);
      continue;
    }
    switch (w.dtype) {
      case DType::BF16:
        gemm_->run(CUDA_R_16BF, w.data, cols, act(true), cols, t.y, t.ldy, w.rows, n_rows, cols, stream_);
        break;
      case DType::F16:
        gemm_->run(CUDA_R_16F, w.data, cols, act(false), cols, t.y, t.ldy, w.rows, n_rows, cols, stream_);
        break;
      case DType::F32:
        TESSERA_CHECK(x, "cuda gemm: f32 weights need f32 activations");
        gemm_->run(CUDA_R_32F, w.data, cols, x, ldx, t.y, t.ldy, w.rows, n_rows, cols, stream_);
        break;
      default: {
        auto* wb = static_cast<uint16_t*>(scratch(wdeq_, wdeq_cap_, static_cast<size_t>(w.rows) * cols * 2));
        if (is_group_quant(w.dtype)) {
          cuda::launch_dequant_gq_bf16(w, wb, stream_);
          gemm_->run(CUDA_R_16BF, wb, cols, act(true), cols, t.y, t.ldy, w.rows, n_rows, cols, stream_);
          break;
        }
        TESSERA_CHECK(cuda::launch_dequant_bf16(w.dtype, w.data, w.rows, cols, wb, stream_),
                      "cuda matmul: weight type ", dtype_name(w.dtype), " is not supported");
        gemm_->run(CUDA_R_16BF, wb, cols, act(true), cols, t.y, t.ldy, w.rows, n_rows, cols, stream_);
      }
    }
  }
}

void CudaBackend::matmul(const float* x, int n_rows, int64_t ldx, std::span<const MatmulTarget> targets) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return matmul_op_name(n_rows, targets); });
  if (n_rows <= 0 || targets.empty()) return;
  const int64_t cols = targets[0].w.cols;
  for (const MatmulTarget& t : targets)
    TESSERA_CHECK(t.w.cols == cols, "cuda matmul: targets of different widths (", t.w.cols, " vs ", cols, ")");
  MatmulTarget runs[kMaxTargets];
  const int n_runs = coalesce(targets, runs);
  if (gemv_rows(n_rows, targets)) {
    cuda::GemvInput in;
    in.x = x;
    gemv(in, n_rows, ldx, cols, runs, n_runs);
  } else {
    gemm(x, n_rows, ldx, cols, runs, n_runs, nullptr, false);
  }
}

void CudaBackend::swiglu_matmul(const float* gate, const float* up, int64_t ld_in, float* h, int n_rows, int dim,
                                std::span<const MatmulTarget> targets) {
  if (n_rows <= 0 || targets.empty()) return;
  bool all16 = true, any_f16 = false, any_bf16 = false;
  for (const MatmulTarget& t : targets) {
    TESSERA_CHECK(t.w.cols == dim, "cuda swiglu_matmul: target width ", t.w.cols, " is not ", dim);
    all16 = all16 && t.w.dtype != DType::F32 && !is_fp8_weight(t.w.dtype);  // FP8: quantized from f32
    (wants_f16(n_rows, t.w) ? any_f16 : any_bf16) = true;
  }
  // One row with 16-bit weights: SwiGLU computed while the bulk matrix-vector kernel loads
  // its input (when that kernel applies to every run).
  cuda::GemvInput in;
  in.x = gate;
  in.up = up;
  bool bulk = n_rows == 1;
  for (const MatmulTarget& t : targets) bulk = bulk && cuda::gemv_bulk_applies(t.w.dtype, dim, in);
  if (bulk) {
    cuda::OpScope op_scope(profiler_.get(), [&] { return "swiglu + " + matmul_op_name(n_rows, targets); });
    MatmulTarget runs[kMaxTargets];
    const int n_runs = coalesce(targets, runs);
    gemv(in, 1, ld_in, dim, runs, n_runs);
    return;
  }
  if (gemv_rows(n_rows, targets)) {
    // Integer decode kernels: SwiGLU written as their Q8 input (no f32 h, no quantize launch).
    MatmulTarget runs[kMaxTargets];
    const int n_runs = coalesce(targets, runs);
    if (takes_q8_input(dim, runs, n_runs)) {
      cuda::OpScope op_scope(profiler_.get(), [&] { return "swiglu + " + matmul_op_name(n_rows, targets); });
      cuda::launch_swiglu_q8(gate, up, ld_in, n_rows, dim, q8_input(n_rows, dim), stream_);
      gemv(cuda::GemvInput{}, n_rows, dim, dim, runs, n_runs, /*x_is_q8=*/true);
      return;
    }
  }
  // Batches of 16-bit (or quantized, decoded to bf16) weights: the activation goes straight
  // into the GEMM's 16-bit input. Elsewhere the two ops run as they are.
  if (gemv_rows(n_rows, targets) || !all16 || (any_f16 && any_bf16)) {
    Backend::swiglu_matmul(gate, up, ld_in, h, n_rows, dim, targets);
    return;
  }
  cuda::OpScope op_scope(profiler_.get(), [&] { return "swiglu + " + matmul_op_name(n_rows, targets); });
  auto* x16 = static_cast<uint16_t*>(scratch(act16_, act16_cap_, static_cast<size_t>(n_rows) * dim * 2));
  cuda::launch_swiglu_to16(gate, up, ld_in, x16, n_rows, dim, any_bf16, stream_);
  MatmulTarget runs[kMaxTargets];
  const int n_runs = coalesce(targets, runs);
  gemm(nullptr, n_rows, dim, dim, runs, n_runs, x16, any_bf16);
}

// The bulk matrix-vector kernel's input when it forms rms_norm(x + residual) * w itself
// (block 0 writing x_out).
static cuda::GemvInput norm_gemv_input(const float* x, const float* residual, const float* w, float* x_out, float eps) {
  cuda::GemvInput in;
  in.x = x;
  in.residual = residual;
  in.norm_w = w;
  in.x_out = x_out;
  in.eps = eps;
  return in;
}

void CudaBackend::add_rms_norm_matmul(const float* x, const float* residual, const float* w, float* x_out, float* xn,
                                      int n_rows, int dim, float eps, std::span<const MatmulTarget> targets) {
  if (n_rows <= 0 || targets.empty()) return;
  check_add_rms_norm_matmul_buffers(x, residual, x_out);
  bool all16 = true, any_f16 = false, any_bf16 = false;
  for (const MatmulTarget& t : targets) {
    TESSERA_CHECK(t.w.cols == dim, "cuda add_rms_norm_matmul: target width ", t.w.cols, " is not ", dim);
    all16 = all16 && t.w.dtype != DType::F32 && !is_fp8_weight(t.w.dtype);  // FP8: quantized from f32
    (wants_f16(n_rows, t.w) ? any_f16 : any_bf16) = true;
  }
  MatmulTarget runs[kMaxTargets];
  // One row with 16-bit weights: every block of the bulk matrix-vector kernel forms the norm
  // itself, block 0 writes x_out; no kernel in front of the product.
  const cuda::GemvInput in = norm_gemv_input(x, residual, w, x_out, eps);
  bool bulk = n_rows == 1;
  for (const MatmulTarget& t : targets) bulk = bulk && cuda::gemv_bulk_applies(t.w.dtype, dim, in);
  cuda::OpScope op_scope(profiler_.get(), [&] { return "add_rms_norm + " + matmul_op_name(n_rows, targets); });
  const int n_runs = coalesce(targets, runs);
  if (bulk) {
    gemv(in, 1, dim, dim, runs, n_runs);
    return;
  }
  // Batches of 16-bit (or quantized) weights: the norm straight into the GEMM's 16-bit input.
  const bool gemm16 = !gemv_rows(n_rows, targets) && all16 && !(any_f16 && any_bf16);
  if (gemm16) {
    auto* x16 = static_cast<uint16_t*>(scratch(act16_, act16_cap_, static_cast<size_t>(n_rows) * dim * 2));
    cuda::launch_add_rms_norm_into(x, residual, w, x_out, nullptr, x16, any_bf16, n_rows, dim, eps, stream_);
    gemm(nullptr, n_rows, dim, dim, runs, n_runs, x16, any_bf16);
    return;
  }
  if (gemv_rows(n_rows, targets) && takes_q8_input(dim, runs, n_runs)) {
    // Integer decode kernels: the norm kernel writes their Q8 input itself (no f32 xn, no
    // quantize launch between).
    cuda::launch_add_rms_norm_q8(x, residual, w, x_out, n_rows, dim, eps, q8_input(n_rows, dim), stream_);
    gemv(cuda::GemvInput{}, n_rows, dim, dim, runs, n_runs, /*x_is_q8=*/true);
    return;
  }
  cuda::launch_add_rms_norm_into(x, residual, w, x_out, xn, nullptr, false, n_rows, dim, eps, stream_);
  cuda::GemvInput plain;
  plain.x = xn;
  if (gemv_rows(n_rows, targets))
    gemv(plain, n_rows, dim, dim, runs, n_runs);
  else
    gemm(xn, n_rows, dim, dim, runs, n_runs, nullptr, false);
}

void CudaBackend::add_rms_norm_swiglu_ffn(const float* x, const float* residual, const float* w, float* x_out,
                                          float* xn, int n_rows, int dim, float eps, const MatmulTarget& gate,
                                          const MatmulTarget& up, float* h, const MatmulTarget& down) {
  check_swiglu_ffn_targets(dim, gate, up, down);
  check_add_rms_norm_matmul_buffers(x, residual, x_out);
  // One row with 16-bit weights: the gate|up product takes a row of each in every chunk and
  // writes h = silu(gate) * up itself, so the down product reads one f32 vector, not two.
  const cuda::GemvInput in = norm_gemv_input(x, residual, w, x_out, eps);
  cuda::GemvInput plain;
  plain.x = h;
  const int n_ff = static_cast<int>(gate.w.rows);
  if (n_rows != 1 || gate.w.dtype != up.w.dtype || !cuda::gemv_bulk_applies(gate.w.dtype, dim, in) ||
      !cuda::gemv_bulk_applies(down.w.dtype, n_ff, plain))
    return Backend::add_rms_norm_swiglu_ffn(x, residual, w, x_out, xn, n_rows, dim, eps, gate, up, h, down);
  const MatmulTarget gate_up[] = {gate, up};
  cuda::OpScope op_scope(profiler_.get(),
                         [&] { return "add_rms_norm + " + matmul_op_name(n_rows, gate_up) + " + swiglu"; });
  const cuda::GemvTarget g[] = {gemv_target(gate), gemv_target(up)};
  if (!cuda::launch_gemv_bulk(gate.w.dtype, in, dim, g, 2, sm_count_, stream_, h)) {
    MatmulTarget runs[2];  // the rows do not pair into chunks: the product as it is, then swiglu
    gemv(in, 1, dim, dim, runs, coalesce(gate_up, runs));
    cuda::launch_swiglu(gate.y, up.y, gate.ldy, h, 1, n_ff, stream_);
  }
  const cuda::GemvTarget d = gemv_target(down);
  TESSERA_CHECK(cuda::launch_gemv_bulk(down.w.dtype, plain, n_ff, &d, 1, sm_count_, stream_),
                "cuda add_rms_norm_swiglu_ffn: the down product did not launch");
}

void CudaBackend::add_bias(float* x, int64_t ld, const float* bias, int n_rows, int dim) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("add_bias"); });
  cuda::launch_add_bias(x, ld, bias, n_rows, dim, stream_);
}

const double* CudaBackend::rope_inv_freq_table(const RopeConfig& cfg) {
  for (auto& t : rope_tables_)
    if (same_rope_config(t.cfg, cfg)) return t.inv_freq;
  TESSERA_CHECK(cfg.rot_dim >= 2 && cfg.rot_dim <= cfg.head_dim && cfg.rot_dim % 2 == 0, "rope: rotated width ",
                cfg.rot_dim, " of head ", cfg.head_dim);
  const int half = cfg.rot_dim / 2;
  RopeTable t;
  t.cfg = cfg;
  if (cfg.freq_factors) {  // a device pointer (uploaded with the weights)
    t.freq_factors.resize(half);
    TESSERA_CUDA_CHECK(
        cudaMemcpy(t.freq_factors.data(), cfg.freq_factors, sizeof(float) * half, cudaMemcpyDeviceToHost));
  }
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) inv[i] = rope_inv_freq(cfg, i, cfg.freq_factors ? t.freq_factors.data() : nullptr);
  t.inv_freq = static_cast<double*>(alloc(sizeof(double) * half));
  TESSERA_CUDA_CHECK(cudaMemcpy(t.inv_freq, inv.data(), sizeof(double) * half, cudaMemcpyHostToDevice));
  rope_tables_.push_back(std::move(t));
  return rope_tables_.back().inv_freq;
}

void CudaBackend::rope(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* positions, const RopeConfig& cfg) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("rope"); });
  const double* inv = rope_inv_freq_table(cfg);
  cuda::launch_rope(x, n_rows, ld, n_heads, positions, cfg.head_dim, cfg.rot_dim, cfg.neox, inv, stream_);
}

void CudaBackend::kv_store(const KvLayerView& kv, const float* k, int64_t ldk, const float* v, int64_t ldv,
                           const AttentionBatch& batch) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("kv_store"); });
  if (kv.plain_dtype() == DType::Unknown)  // a quantized format on either side
    cuda::launch_kv_store_quant(kv, k, ldk, v, ldv, batch.slot_mapping, batch.positions, batch.n_tokens, stream_);
  else
    cuda::launch_kv_store(kv, k, ldk, v, ldv, batch.slot_mapping, batch.n_tokens, stream_);
}

void CudaBackend::rope_kv_store(float* q, int64_t ldq, int n_q_heads, float* k, int64_t ldk, const float* v,
                                int64_t ldv, const KvLayerView& kv, const AttentionBatch& batch,
                                const RopeConfig& cfg) {
  // Quantized formats: RoPE, then the encoding store (which needs a whole head per block).
  if (cfg.head_dim != kv.head_dim || kv.plain_dtype() == DType::Unknown) {
    Backend::rope_kv_store(q, ldq, n_q_heads, k, ldk, v, ldv, kv, batch, cfg);
    return;
  }
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("rope+kv_store"); });
  const int n = batch.n_tokens;
  const double* inv = rope_inv_freq_table(cfg);
  cuda::launch_rope_kv_store(q, ldq, n_q_heads, k, ldk, v, ldv, kv, batch.rotation_positions(), batch.slot_mapping, n,
                             cfg.rot_dim, cfg.neox, inv, stream_);
}

// Split each sequence's keys so that the launch fills the GPU a few times over. The split is
// chosen for the longest context the block tables can describe (their width rounded up to a
// power of two), not the actual one: a graph replayed at any context up to that bound
// launches the same grid (splits past a sequence's end exit at once), and graph and eager
// forwards split alike, so they give the same bits.
CudaBackend::DecodeSplit CudaBackend::decode_split(const KvLayerView& kv, const AttentionBatch& batch,
                                                   int n_heads) const {
  const int max_len = cuda::graph_table_width(batch.max_blocks) * kv.block_size;
  const int group = n_heads / kv.n_kv_heads;
  // The tensor-core kernels take every query head of a KV head in one block and aim at two
  // blocks per SM; their splits are at least 256 keys (shorter ones measured slower: the four
  // warps' pipelines never fill). The SIMT kernels take up to 4 query heads per block and aim
  // at 4. The quantized pages' fragment-decoding kernel (attention_quant_decode_frag.cu) holds
  // three blocks per SM for its compiled format pairs, and where the two-per-SM grid is more
  // than one wave of those, its splits are chosen by waves (decode_split.h).
  const bool frag = kv.plain_dtype() == DType::Unknown && cuda::attention_quant_decode_frag_applies(kv, n_heads);
  const bool mma = frag || cuda::attention_decode_mma_applies(kv, n_heads);
  // A verification batch's blocks hold chunks of its rows too.
  const int chunks =
      verification_kernel(kv, batch, n_heads) ? cuda::attention_decode_mma_chunks(group, batch.max_rows) : 1;
  const int base_blocks = batch.n_seqs * kv.n_kv_heads * (mma ? chunks : (group + 3) / 4);
  const int per_sm = mma ? cuda::CudaTuning::kDecodeMmaBlocksPerSm : cuda::CudaTuning::kDecodeBlocksPerSm;
  // Multiples of 64 keys: the tensor-core kernels' 4 warps take 16-key tiles.
  const int min_split = mma ? cuda::CudaTuning::kDecodeMmaMinSplitKeys : 64;
  const cuda::DecodeSplitChoice c =
      frag ? cuda::choose_decode_split(base_blocks, sm_count_, per_sm,
                                       cuda::attention_quant_decode_frag_blocks_per_sm(kv), max_len, min_split, 64,
                                       cuda::CudaTuning::kDecodeSplitFixedKeys)
           : cuda::split_to_target(base_blocks, sm_count_, per_sm, max_len, min_split, 64);
  return {max_len, c.split_len, c.splits};
}

void CudaBackend::rope_kv_store_attention(float* q, int64_t ldq, int n_heads, float* k, int64_t ldk, const float* v,
                                          int64_t ldv, const KvLayerView& kv, const AttentionBatch& batch,
                                          const RopeConfig& cfg, float scale, float* out, int64_t ldo) {
  // Decode only (every sequence one query row), where RoPE and the store fold into the
  // tensor-core kernel and its splits (one cluster) merge on chip. Only when the separate
  // kernel would split at all (few sequences: the step's attention is a chain of short
  // launches the GPU waits on); with one block per (sequence, KV head) already filling the
  // GPU, the separate launches measured faster (128 sequences: 14,636 against 14,213 tok/s,
  // each fused block computing its own RoPE angles).
  // A sliding window (Gemma 3's local layers) takes the separate kernels: the fused one has no mask.
  const bool fits = batch.n_tokens > 0 && batch.one_row_each && batch.window == 0 && cfg.head_dim == kv.head_dim &&
                    kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0 &&
                    cuda::attention_decode_mma_applies(kv, n_heads);
  DecodeSplit split = fits ? decode_split(kv, batch, n_heads) : DecodeSplit{};
  const bool would_split = split.max_splits >= 2;
  if (would_split) {
    // A cluster of one block per 128 keys of the table's width, at most 8 (tables up to 2,048
    // keys). The kernel shares each step's actual keys evenly among the cluster's blocks, so
    // split_len here only sizes the cluster and bounds the table it takes.
    split.split_len = std::max(
        128, static_cast<int>(round_up((split.max_len + cuda::kMaxFusedSplits - 1) / cuda::kMaxFusedSplits, 64)));
    split.max_splits = (split.max_len + split.split_len - 1) / split.split_len;
  }
  // Longer splits (tables wider than 2,048 keys) would leave most SMs idle at few sequences:
  // the separate kernels' 256-key splits and merge take those (not measured fused).
  if (!fits || !would_split || split.split_len > 256 ||
      !cuda::rope_kv_store_attention_decode_applies(q, ldq, out, ldo, kv, n_heads, cfg.rot_dim, split.split_len,
                                                    split.max_splits)) {
    Backend::rope_kv_store_attention(q, ldq, n_heads, k, ldk, v, ldv, kv, batch, cfg, scale, out, ldo);
    return;
  }
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("rope+kv_store+attention decode"); });
  const double* inv = rope_inv_freq_table(cfg);
  cuda::launch_rope_kv_store_attention_decode(q, ldq, k, ldk, v, ldv, kv, device_batch(batch), n_heads, scale,
                                              cfg.rot_dim, cfg.neox, inv, out, ldo, split.split_len, split.max_splits,
                                              stream_);
}

void CudaBackend::attention(const float* q, int64_t ldq, const KvLayerView& kv, const AttentionBatch& batch,
                            int n_heads, float scale, float* out, int64_t ldo) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return attention_op_name(kv, batch, n_heads); });
  TESSERA_CHECK(kv.n_kv_heads > 0 && n_heads % kv.n_kv_heads == 0, "attention: ", n_heads,
                " query heads are not a multiple of ", kv.n_kv_heads, " KV heads");
  if (batch.n_tokens == 0) return;
  TESSERA_CHECK(batch.window == 0 || kv.plain_dtype() != DType::Unknown, "cuda attention: a sliding window (",
                batch.window, ") takes an f16 or f32 KV cache; KV format ", kv_format_name(kv.k_fmt), "/",
                kv_format_name(kv.v_fmt), " has no windowed kernel yet");
  if (kv.plain_dtype() == DType::Unknown) {  // quantized pages (attention_quant_*.cu)
    // A verification batch takes the fragment kernel's split keys, as f16 pages do below.
    const bool verify = verification_kernel(kv, batch, n_heads);
    if (!batch.one_row_each && !verify) {
      cuda::launch_attention_quant_prefill(q, ldq, kv, device_batch(batch), n_heads, scale, out, ldo, stream_);
      return;
    }
    const auto [max_len, split_len, max_splits] = decode_split(kv, batch, n_heads);
    const size_t floats = static_cast<size_t>(batch.n_tokens) * n_heads * max_splits * (kv.head_dim + 2);
    auto* partials = static_cast<float*>(scratch(partials_, partials_cap_, floats * sizeof(float)));
    cuda::launch_attention_quant_decode(q, ldq, kv, device_batch(batch), n_heads, scale, out, ldo, split_len,
                                        max_splits, partials, stream_, verify ? batch.max_rows : 1);
    return;
  }
  // A verification batch (a few rows per sequence): the tensor-core decode kernel with its
  // keys split over the SMs, each row with its own causal length.
  if (verification_kernel(kv, batch, n_heads)) {
    const auto [max_len, split_len, max_splits] = decode_split(kv, batch, n_heads);
    const size_t floats = static_cast<size_t>(batch.n_tokens) * n_heads * max_splits * (kv.head_dim + 2);
    auto* partials = static_cast<float*>(scratch(partials_, partials_cap_, floats * sizeof(float)));
    if (cuda::launch_attention_decode_mma(q, ldq, kv, device_batch(batch), n_heads, scale, out, ldo, split_len,
                                          max_splits, partials, stream_, batch.max_rows))
      return;
  }
  if (!batch.one_row_each || !cuda::attention_decode_supported(kv)) {
    const cuda::DeviceBatch db = device_batch(batch);
    if (!cuda::launch_attention_prefill_mma_window(q, ldq, kv, db, n_heads, scale, out, ldo, batch.window, stream_))
      cuda::launch_attention_prefill_window(q, ldq, kv, db, n_heads, scale, out, ldo, batch.window, stream_);
    return;
  }
  const auto [max_len, split_len, max_splits] = decode_split(kv, batch, n_heads);
  const size_t floats = static_cast<size_t>(batch.n_seqs) * n_heads * max_splits * (kv.head_dim + 2);
  auto* partials = static_cast<float*>(scratch(partials_, partials_cap_, floats * sizeof(float)));
  cuda::launch_attention_decode_window(q, ldq, kv, device_batch(batch), n_heads, scale, out, ldo, split_len, max_splits,
                                       partials, batch.window, stream_);
}

void CudaBackend::swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("swiglu"); });
  cuda::launch_swiglu(gate, up, ld_in, out, n_rows, dim, stream_);
}

void CudaBackend::add(float* x, const float* y, int64_t n) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("add"); });
  cuda::launch_add(x, y, n, stream_);
}

void CudaBackend::geglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("geglu"); });
  cuda::launch_geglu(gate, up, ld_in, out, n_rows, dim, stream_);
}

void CudaBackend::rms_norm_heads(float* x, int64_t ld, int n_rows, int n_heads, int head_dim, const float* w,
                                 float eps) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("rms_norm_heads"); });
  cuda::launch_rms_norm_heads(x, ld, n_rows, n_heads, head_dim, w, eps, stream_);
}

void CudaBackend::scale(float* x, float s, int64_t n) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("scale"); });
  cuda::launch_scale(x, s, n, stream_);
}

void CudaBackend::gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst) {
  cuda::OpScope op_scope(profiler_.get(), [&] { return std::string("gather_rows"); });
  cuda::launch_gather_rows(src, ld, rows, n, dim, dst, stream_);
}

}  // namespace tessera
