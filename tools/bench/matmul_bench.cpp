// Micro-benchmark of CpuMatmul on SmolLM2-135M shapes (not part of ctest).
//
//   tools/bench/build_standalone.sh /tmp/mm && /tmp/mm/matmul_bench [threads] [--quick] [--cpu]
//   TESSERA_ISA=avx2 /tmp/mm/matmul_bench 2
//   /tmp/mm/matmul_bench 1 --cpu --types      (every weight type on one 1536x1536 shape instead)
//   /tmp/mm/matmul_bench 1 --cpu --types=Q6_K (one of them)
//
// --cpu times with the process's CPU time instead of the wall clock: with one thread on a
// machine shared with other work it shows what the kernels cost (with several threads it
// also counts the pool's spinning).
//
// Decode (one input row) is timed twice: "hot" reuses one weight (it stays in L2/L3), "cold"
// cycles through copies totalling more than the L3, so weights stream from DRAM as they do
// in a real decode step. GB/s counts weight bytes; GFLOP/s counts 2 * rows * cols per input
// row. The model lines run every matmul of one SmolLM2-135M step (30 layers: QKV in one call,
// O, gate+up in one call, down; then the Q8_0 output head) with weights laid out as in the
// file, and compare with the time to stream those bytes once.
#include <emmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "core/aligned_buffer.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "quant/blocks.h"

using namespace tessera;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Process CPU time: with one thread on a shared machine, the time the work actually ran
// (wall time there includes waiting for a core).
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
bool g_cpu_time = false;  // --cpu: time with cpu_now() instead of the wall clock

// Random block bytes with sane scales (the kernels' speed does not depend on the values, but
// NaN or infinite scales could slow the float arithmetic down).
void fill_weights(DType t, uint8_t* p, int64_t rows, int64_t cols, std::mt19937& gen) {
  const int64_t bytes = rows * dtype_row_bytes(t, cols);
  const uint16_t d = f32_to_fp16(0.01f), m = f32_to_fp16(-0.05f);
  if (t == DType::F32 || t == DType::F16 || t == DType::BF16) {
    const int64_t n = rows * cols;
    for (int64_t i = 0; i < n; ++i) {
      const float v = std::uniform_real_distribution<float>(-1, 1)(gen);
      if (t == DType::F32)
        std::memcpy(p + 4 * i, &v, 4);
      else {
        const uint16_t h = t == DType::F16 ? f32_to_fp16(v) : f32_to_bf16(v);
        std::memcpy(p + 2 * i, &h, 2);
      }
    }
    return;
  }
  for (int64_t i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(gen());
  const int64_t bb = dtype_traits(t).block_bytes, nblocks = bytes / bb;
  for (int64_t b = 0; b < nblocks; ++b) {
    uint8_t* blk = p + b * bb;
    switch (t) {
      case DType::Q4_1:
      case DType::Q5_1:
        std::memcpy(blk, &d, 2), std::memcpy(blk + 2, &m, 2);
        break;
      case DType::Q4_0:
      case DType::Q5_0:
      case DType::Q8_0:
        std::memcpy(blk, &d, 2);
        break;
      case DType::Q4_K:
      case DType::Q5_K:
        std::memcpy(blk, &d, 2), std::memcpy(blk + 2, &d, 2);
        break;
      case DType::Q6_K:
        std::memcpy(blk + bb - 2, &d, 2);
        break;
      default:
        break;
    }
  }
}

struct Matrix {
  DType type;
  int64_t rows, cols;
  AlignedBuffer<uint8_t> data;
  Matrix(DType t, int64_t r, int64_t c, std::mt19937& gen)
      : type(t), rows(r), cols(c), data(r * dtype_row_bytes(t, c)) {
    fill_weights(t, data.data(), r, c, gen);
  }
  int64_t bytes() const { return rows * dtype_row_bytes(type, cols); }
  WeightMatrix view() const { return {data.data(), type, rows, cols}; }
};

template <typename F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  f();  // warm-up: scratch buffers, page faults
  for (int i = 0; i < reps; ++i) {
    const double t0 = g_cpu_time ? cpu_now() : now();
    f();
    t.push_back((g_cpu_time ? cpu_now() : now()) - t0);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Reads the buffer once with every thread of the pool (SSE2 loads, four independent
// accumulators): the time a decode step cannot beat if it streams all weights from DRAM.
double stream_seconds(ThreadPool& pool, const AlignedBuffer<uint8_t>& buf, int reps) {
  std::atomic<uint64_t> sink{0};
  return median_seconds(reps, [&] {
    pool.parallel_for(static_cast<int64_t>(buf.size() / 4096), 16, [&](int64_t b, int64_t e) {
      __m128i a0 = _mm_setzero_si128(), a1 = a0, a2 = a0, a3 = a0;
      const __m128i* p = reinterpret_cast<const __m128i*>(buf.data());
      for (int64_t i = b * 256; i < e * 256; i += 4) {
        a0 = _mm_xor_si128(a0, _mm_load_si128(p + i));
        a1 = _mm_xor_si128(a1, _mm_load_si128(p + i + 1));
        a2 = _mm_xor_si128(a2, _mm_load_si128(p + i + 2));
        a3 = _mm_xor_si128(a3, _mm_load_si128(p + i + 3));
      }
      sink += static_cast<uint64_t>(_mm_cvtsi128_si64(_mm_xor_si128(_mm_xor_si128(a0, a1), _mm_xor_si128(a2, a3))));
    });
  });
}

void bench_shape(CpuMatmul& mm, const char* name, DType t, int64_t rows, int64_t cols, bool quick, std::mt19937& gen,
                 bool cold_too = true) {
  const int64_t l3_copies = cold_too ? std::max<int64_t>(2, (160ll << 20) / (rows * dtype_row_bytes(t, cols)) + 1) : 1;
  std::vector<Matrix> ws;
  ws.emplace_back(t, rows, cols, gen);
  for (int64_t i = 1; i < l3_copies; ++i) ws.emplace_back(t, rows, cols, gen);
  const int64_t prefill = 512;
  std::vector<float> x(prefill * cols), y(prefill * rows);
  for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(gen);
  const double flop1 = 2.0 * rows * cols;
  const double wbytes = static_cast<double>(ws[0].bytes());

  MatmulTarget tg{ws[0].view(), y.data(), rows};
  const double hot = median_seconds(quick ? 20 : 200, [&] { mm.run(x.data(), 1, cols, std::span(&tg, 1)); });
  size_t next = 0;
  const double cold = !cold_too ? hot : median_seconds(quick ? 20 : 200, [&] {
    MatmulTarget c{ws[next].view(), y.data(), rows};
    next = (next + 1) % ws.size();
    mm.run(x.data(), 1, cols, std::span(&c, 1));
  });
  const double pre = median_seconds(quick ? 3 : 10, [&] { mm.run(x.data(), prefill, cols, std::span(&tg, 1)); });
  std::printf(
      "%-26s decode hot %8.1f us %6.1f GB/s %6.1f GFLOP/s | cold %8.1f us %6.1f GB/s | prefill 512 %8.2f ms %6.1f "
      "GFLOP/s\n",
      name, hot * 1e6, wbytes / hot / 1e9, flop1 / hot / 1e9, cold * 1e6, wbytes / cold / 1e9, pre * 1e3,
      flop1 * prefill / pre / 1e9);
}

// All matmuls of SmolLM2-135M (Q4_1 layers, Q8_0 tied output head) for one decode step or
// one 512-token prefill, weights laid out back to back as in the model file.
void bench_model(ThreadPool& pool, CpuMatmul& mm, bool quick, std::mt19937& gen) {
  constexpr int64_t kLayers = 30, kDim = 576, kKv = 192, kFf = 1536, kVocab = 49152;
  struct Layer {
    Matrix q, k, v, o, gate, up, down;
  };
  std::vector<Layer> layers;
  for (int l = 0; l < kLayers; ++l)
    layers.push_back({Matrix(DType::Q4_1, kDim, kDim, gen), Matrix(DType::Q4_1, kKv, kDim, gen),
                      Matrix(DType::Q4_1, kKv, kDim, gen), Matrix(DType::Q4_1, kDim, kDim, gen),
                      Matrix(DType::Q4_1, kFf, kDim, gen), Matrix(DType::Q4_1, kFf, kDim, gen),
                      Matrix(DType::Q4_1, kDim, kFf, gen)});
  const Matrix head(DType::Q8_0, kVocab, kDim, gen);
  double bytes = static_cast<double>(head.bytes()), flop = 2.0 * kVocab * kDim;
  for (const Layer& L : layers)
    for (const Matrix* m : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
      bytes += static_cast<double>(m->bytes()), flop += 2.0 * m->rows * m->cols;

  for (int64_t n : {int64_t{1}, int64_t{512}}) {
    std::vector<float> x(n * kFf), y1(n * kFf), y2(n * kFf), y3(n * kFf), logits(n == 1 ? kVocab : kVocab * 1);
    for (auto& v : x) v = std::uniform_real_distribution<float>(-1, 1)(gen);
    const double secs = median_seconds(n == 1 ? (quick ? 5 : 30) : (quick ? 1 : 3), [&] {
      for (const Layer& L : layers) {
        const MatmulTarget qkv[3] = {
            {L.q.view(), y1.data(), kDim}, {L.k.view(), y2.data(), kKv}, {L.v.view(), y3.data(), kKv}};
        mm.run(x.data(), n, kDim, qkv);
        const MatmulTarget o{L.o.view(), y1.data(), kDim};
        mm.run(x.data(), n, kDim, std::span(&o, 1));
        const MatmulTarget gu[2] = {{L.gate.view(), y1.data(), kFf}, {L.up.view(), y2.data(), kFf}};
        mm.run(x.data(), n, kDim, gu);
        const MatmulTarget down{L.down.view(), y3.data(), kDim};
        mm.run(x.data(), n, kFf, std::span(&down, 1));
      }
      // The output head only for the last row, as an engine does in prefill.
      const MatmulTarget h{head.view(), logits.data(), kVocab};
      mm.run(x.data() + (n - 1) * kDim, 1, kDim, std::span(&h, 1));
    });
    const double flops = n == 1 ? flop : (flop - 2.0 * kVocab * kDim) * n + 2.0 * kVocab * kDim;
    std::printf("model %-4s  %9.2f ms  %7.1f tok/s  %6.1f GB/s of weights  %6.1f GFLOP/s\n", n == 1 ? "tg1" : "pp512",
                secs * 1e3, n / secs, bytes / secs / 1e9, flops / secs / 1e9);
  }
  AlignedBuffer<uint8_t> buf(static_cast<size_t>(bytes) / 4096 * 4096);
  std::memset(buf.data(), 1, buf.size());
  const double s = stream_seconds(pool, buf, quick ? 5 : 20);
  std::printf(
      "floor: reading the %.1f MB of weights once takes %.2f ms (%.1f GB/s) = %.0f steps/s if nothing else ran\n",
      bytes / 1e6, s * 1e3, bytes / s / 1e9, 1.0 / s);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = ThreadPool::default_threads();
  bool quick = false, types = false;
  std::string only_type;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--quick")
      quick = true;
    else if (std::string(argv[i]) == "--types")
      types = true;
    else if (std::string(argv[i]).rfind("--types=", 0) == 0)
      types = true, only_type = argv[i] + 8;
    else if (std::string(argv[i]) == "--cpu")
      g_cpu_time = true;
    else
      threads = std::atoi(argv[i]);
  }
  ThreadPool pool(threads);
  CpuMatmul mm(pool);
  std::printf("isa %s, %d threads, %s time\n", CpuMatmul::isa(), threads, g_cpu_time ? "process CPU" : "wall");
  std::mt19937 gen(42);
  if (types) {  // every weight type, one shape that every block size divides; no cold pass
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                    DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
      if (!only_type.empty() && only_type != dtype_name(t)) continue;
      const std::string name = std::string(dtype_name(t)) + " 1536->1536";
      bench_shape(mm, name.c_str(), t, 1536, 1536, quick, gen, false);
    }
    return 0;
  }
  bench_shape(mm, "Q4_1 576->1536 (gate)", DType::Q4_1, 1536, 576, quick, gen);
  bench_shape(mm, "Q4_1 1536->576 (down)", DType::Q4_1, 576, 1536, quick, gen);
  bench_shape(mm, "Q4_1 576->576 (q, o)", DType::Q4_1, 576, 576, quick, gen);
  bench_shape(mm, "Q8_0 576->49152 (output)", DType::Q8_0, 49152, 576, quick, gen);
  bench_model(pool, mm, quick, gen);
  return 0;
}
