#pragma once
// Private to the CPU matmul (matmul*.cpp): the layout of quantized activations, the unit of
// work handed to a kernel, and the table of kernels each instruction set provides.
// docs/design/cpu-matmul.md explains the choices.
#include <cstdint>

#include "core/dtype.h"

namespace tessera::mm {

// ---- Quantized activations ---------------------------------------------------------------
//
// One row per input row, in one of two formats with GGML's numerics:
//  - Q8 (pairs with Q4_0/Q4_1/Q5_0/Q5_1/Q8_0): per 32 elements d = fp16(amax/127),
//    qs = nearbyint(x * 127/amax), s = fp16(d * sum(qs)), exactly as quantize_row_q8_0/q8_1.
//  - Q8_K (pairs with Q4_K/Q5_K/Q6_K): per 256 elements d = max/-127 (f32),
//    qs = min(127, nearest(x * -127/max)), as quantize_row_q8_K.
// Both store per-group quantities spread to every 32-group (and 16-group for Q8_K), so
// kernels of every block format read them the same way.
struct ActLayout {
  int64_t cols = 0;
  int64_t off_d32 = 0;    // f32 [cols/32]: scale of the group (the super-block's d for Q8_K)
  int64_t off_s32 = 0;    // f32 [cols/32]: Q8: fp16(d*sum) as GGML's Q8_1; Q8_K: d*sum
  int64_t off_sum32 = 0;  // i32 [cols/32]: sum of the group's qs
  int64_t off_sum16 = 0;  // i32 [cols/16]: sums of 16 (Q8_K only; GGML's bsums)
  int64_t row_bytes = 0;  // multiple of 64; qs start every row

  static ActLayout make(int64_t cols, bool with_sum16) {
    auto up64 = [](int64_t n) { return (n + 63) / 64 * 64; };
    ActLayout l;
    l.cols = cols;
    const int64_t g32 = cols / 32, g16 = cols / 16;
    l.off_d32 = up64(cols);
    l.off_s32 = l.off_d32 + up64(g32 * 4);
    l.off_sum32 = l.off_s32 + up64(g32 * 4);
    l.off_sum16 = l.off_sum32 + up64(g32 * 4);
    l.row_bytes = l.off_sum16 + (with_sum16 ? up64(g16 * 4) : 0);
    return l;
  }
};

// A view of one quantized activation row.
struct ActRow {
  const int8_t* qs;
  const float* d32;
  const float* s32;
  const int32_t* sum32;
  const int32_t* sum16;
};

inline ActRow act_row(const uint8_t* base, const ActLayout& l, int64_t t) {
  const uint8_t* r = base + t * l.row_bytes;
  return {reinterpret_cast<const int8_t*>(r), reinterpret_cast<const float*>(r + l.off_d32),
          reinterpret_cast<const float*>(r + l.off_s32),
          reinterpret_cast<const int32_t*>(r + l.off_sum32),
          reinterpret_cast<const int32_t*>(r + l.off_sum16)};
}

// Writes one row of `cols` floats in the given format (row points at row_bytes of storage).
using QuantizeFn = void (*)(const float* x, uint8_t* row, const ActLayout& l);

// ---- Kernels -----------------------------------------------------------------------------

// y[t * ldy + r] = x[t] · W[r] for r < n_w, t < n_x, on rows of one weight.
struct MatmulTask {
  const uint8_t* w = nullptr;   // first weight row
  int64_t w_stride = 0;         // bytes between weight rows
  int64_t n_w = 0;
  int64_t cols = 0;
  const float* x = nullptr;     // f32 activations (F32/F16/BF16 weights)
  int64_t ldx = 0;
  const uint8_t* act = nullptr;  // quantized activations (block formats), first row
  const ActLayout* act_layout = nullptr;
  int64_t n_x = 0;
  float* y = nullptr;            // y of the first weight row and first activation row
  int64_t ldy = 0;
  uint8_t* scratch = nullptr;    // per-thread, at least KernelSet::scratch_bytes(dtype, cols)
};

using MatmulKernel = void (*)(const MatmulTask&);

// Prefill tiling: from this many input rows on, SIMD kernels repack weights into panels in
// their scratch (each weight block is then dotted against many input rows), and the work is
// also split over the input rows (so a panel of x stays in L2 while weight panels go by).
constexpr int64_t kPanelMinRows = 8;

// Weight types the matmul computes with, as a dense index for kernel tables.
enum class WKind : int { F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Count };
constexpr int kNumWKinds = static_cast<int>(WKind::Count);

// -1 when the type has no matmul kernel.
inline int wkind_index(DType t) {
  switch (t) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::BF16: return 2;
    case DType::Q4_0: return 3;
    case DType::Q4_1: return 4;
    case DType::Q5_0: return 5;
    case DType::Q5_1: return 6;
    case DType::Q8_0: return 7;
    case DType::Q4_K: return 8;
    case DType::Q5_K: return 9;
    case DType::Q6_K: return 10;
    default: return -1;
  }
}

enum class ActKind { F32, Q8, Q8K };

inline ActKind act_kind(DType t) {
  switch (t) {
    case DType::Q4_0: case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q8_0:
      return ActKind::Q8;
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return ActKind::Q8K;
    default:
      return ActKind::F32;
  }
}

struct KernelSet {
  const char* name;
  QuantizeFn quantize_q8;
  QuantizeFn quantize_q8k;
  // Direct kernels read weights in place (decode, small batches).
  MatmulKernel direct[kNumWKinds];
  // Panel kernels repack panel_rows weight rows at a time into the task's scratch and dot
  // them against many input rows; used when n_x >= kPanelMinRows. Null: use direct.
  MatmulKernel panel[kNumWKinds];
  int panel_rows;
};

// Scratch a kernel of `set` needs for rows of `cols` elements (a repacked panel of weights).
int64_t panel_scratch_bytes(const KernelSet& set, int64_t cols);

const KernelSet& scalar_kernel_set();
// Defined in the ISA files; call only when the CPU supports the ISA.
const KernelSet& avx2_kernel_set();
const KernelSet& avx512_kernel_set();

// The AVX2 kernels by WKind, also used by the AVX-512 set where it has no kernel of its own.
extern const MatmulKernel avx2_direct_kernels[kNumWKinds];
extern const MatmulKernel avx2_panel_kernels[kNumWKinds];
void avx2_quantize_q8(const float* x, uint8_t* row, const ActLayout& l);
void avx2_quantize_q8k(const float* x, uint8_t* row, const ActLayout& l);
// Rows per repacked panel: one register lane per weight row (AVX2 kernels repack two panels
// at a time, so their scratch holds 16 rows).
constexpr int kAvx2PanelRows = 8;
constexpr int kAvx512PanelRows = 16;

// Scalar decoding of one weight row to f32 (embedding lookup; tests of the kernels use
// their own float64 decoders).
void dequantize_row_scalar(DType t, const uint8_t* src, float* dst, int64_t cols);

// GGML's round-to-nearest-even for |v| < 2^22 (its nearest_int), used by the Q8_K scalar path.
inline int nearest_int_ggml(float v) {
  float f = v + 12582912.f;
  int32_t i;
  __builtin_memcpy(&i, &f, 4);
  return (i & 0x007fffff) - 0x00400000;
}

// ---- x86 helpers shared by the AVX2 and AVX-512 files ------------------------------------
// Internal linkage on purpose: each ISA file compiles its own copy with its own flags, so
// the linker can never hand the AVX2 path a copy that uses AVX-512 instructions.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
}  // namespace tessera::mm

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "quant/blocks.h"

namespace tessera::mm {
namespace {

inline float h2f(uint16_t h) { return _cvtsh_ss(h); }
inline __m256i load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline __m256i nibbles_32(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

inline __m256i bits_to_bytes(const uint8_t* p) {
  uint32_t b;
  std::memcpy(&b, p, 4);
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(b)), shuf);
  bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1));
}

// Transpose of 8 rows of 8 dwords: out[g] holds dword g of rows 0..7.
inline void transpose_8x8(const __m256i r[8], __m256i out[8]) {
  const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
  const __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
  const __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
  const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
  const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
  const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
  const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
  out[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
  out[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
  out[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
  out[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
  out[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
  out[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
  out[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
  out[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

// Float weight rows: 8 consecutive values as f32 (F16 through F16C, BF16 shifted up).
struct F32Src {
  static constexpr int kBytes = 4;
  static __m256 load8(const uint8_t* w) { return _mm256_loadu_ps(reinterpret_cast<const float*>(w)); }
};
struct F16Src {
  static constexpr int kBytes = 2;
  static __m256 load8(const uint8_t* w) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w))); }
};
struct BF16Src {
  static constexpr int kBytes = 2;
  static __m256 load8(const uint8_t* w) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
  }
};
// Values k..cols-1 of a float row (fewer than 8), zero-padded to 8.
template <typename S>
inline __m256 load_tail(const uint8_t* w, int64_t n) {
  uint8_t raw[32] = {};
  std::memcpy(raw, w, n * S::kBytes);
  return S::load8(raw);
}

// A repacked panel in a task's scratch: quants [cols/32][8 groups of 4][rows][4 bytes],
// scales d and mins m [cols/sub][rows] f32.
struct Panel {
  uint8_t* q;
  float* d;
  float* m;
};

inline Panel panel_in(uint8_t* scratch, int64_t cols, int sub, int rows) {
  Panel p;
  p.q = scratch;
  p.d = reinterpret_cast<float*>(scratch + (cols * rows + 63) / 64 * 64);
  p.m = p.d + cols / sub * rows;
  return p;
}

// Decoders: the quants of one chunk of a row as bytes in element order, with the scale (and
// min) of each sub-block. Value = d * (q - kZero) + m, summed exactly as GGML's dots do.
struct DQ4_0 {
  static constexpr int kChunk = 32, kSub = 32, kZero = 8, kSteps = 8;
  static constexpr bool kHasMin = false, kSigned = false;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float*) {
    const auto& b = *reinterpret_cast<const BlockQ4_0*>(src);
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), nibbles_32(b.qs));
    d[0] = h2f(b.d);
  }
};
struct DQ4_1 {
  static constexpr int kChunk = 32, kSub = 32, kZero = 0, kSteps = 8;
  static constexpr bool kHasMin = true, kSigned = false;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float* m) {
    const auto& b = *reinterpret_cast<const BlockQ4_1*>(src);
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), nibbles_32(b.qs));
    d[0] = h2f(b.d);
    m[0] = h2f(b.m);
  }
};
struct DQ5_0 {
  static constexpr int kChunk = 32, kSub = 32, kZero = 16, kSteps = 4;
  static constexpr bool kHasMin = false, kSigned = false;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float*) {
    const auto& b = *reinterpret_cast<const BlockQ5_0*>(src);
    const __m256i v = _mm256_or_si256(nibbles_32(b.qs), _mm256_and_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(0x10)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), v);
    d[0] = h2f(b.d);
  }
};
struct DQ5_1 {
  static constexpr int kChunk = 32, kSub = 32, kZero = 0, kSteps = 4;
  static constexpr bool kHasMin = true, kSigned = false;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float* m) {
    const auto& b = *reinterpret_cast<const BlockQ5_1*>(src);
    const __m256i v = _mm256_or_si256(nibbles_32(b.qs), _mm256_and_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(0x10)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), v);
    d[0] = h2f(b.d);
    m[0] = h2f(b.m);
  }
};
struct DQ8_0 {
  static constexpr int kChunk = 32, kSub = 32, kZero = 0, kSteps = 1;
  static constexpr bool kHasMin = false, kSigned = true;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float*) {
    const auto& b = *reinterpret_cast<const BlockQ8_0*>(src);
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), load256(b.qs));
    d[0] = h2f(b.d);
  }
};

inline void unpack_k4_scales(const uint8_t* scales, uint8_t out[16]) {
  constexpr uint32_t kmask1 = 0x3f3f3f3f, kmask2 = 0x0f0f0f0f, kmask3 = 0x03030303;
  uint32_t u[4];
  std::memcpy(u, scales, 12);
  u[3] = ((u[2] >> 4) & kmask2) | (((u[1] >> 6) & kmask3) << 4);
  const uint32_t mins_lo = u[1] & kmask1;
  u[1] = (u[2] & kmask2) | (((u[0] >> 6) & kmask3) << 4);
  u[2] = mins_lo;
  u[0] &= kmask1;
  std::memcpy(out, u, 16);
}

// Q4_K / Q5_K: sub-block scale d*sc and min -dmin*m (exact in f32); the min meets the
// activation's s = d_x * sum.
template <bool kFive>
struct DQK45 {
  static constexpr int kChunk = 256, kSub = 32, kZero = 0, kSteps = kFive ? 4 : 8;
  static constexpr bool kHasMin = true, kSigned = false;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float* m) {
    using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
    const auto& b = *reinterpret_cast<const Block*>(src);
    uint8_t sm[16];
    unpack_k4_scales(b.scales, sm);
    const float dd = h2f(b.d), dmin = h2f(b.dmin);
    for (int g = 0; g < 8; ++g) d[g] = dd * sm[g], m[g] = -dmin * sm[8 + g];
    const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
    __m256i hbits = _mm256_setzero_si256();
    if constexpr (kFive) hbits = load256(b.qh);
    for (int c = 0; c < 4; ++c) {
      const __m256i bits = load256(b.qs + 32 * c);
      __m256i lo = _mm256_and_si256(bits, m4), hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
      if constexpr (kFive) {
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), m1), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c + 1), m1), 4));
      }
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 64 * c), lo);
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 64 * c + 32), hi);
    }
  }
};

// Q6_K: 16 sub-blocks of 16 with scale d*sc, quants 0..63 with zero point 32.
struct DQ6K {
  static constexpr int kChunk = 256, kSub = 16, kZero = 32, kSteps = 2;
  static constexpr bool kHasMin = false, kSigned = false;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float*) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(src);
    const float dd = h2f(b.d);
    for (int g = 0; g < 16; ++g) d[g] = dd * b.scales[g];
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    for (int half = 0; half < 2; ++half) {
      const __m256i l0 = load256(b.ql + 64 * half), l1 = load256(b.ql + 64 * half + 32);
      const __m256i h = load256(b.qh + 32 * half);
      __m256i* o = reinterpret_cast<__m256i*>(q + 128 * half);
      _mm256_store_si256(o + 0, _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4)));
      _mm256_store_si256(o + 1, _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4)));
      _mm256_store_si256(o + 2, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4)));
      _mm256_store_si256(o + 3, _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4)));
    }
  }
};

}  // namespace
#endif  // __AVX2__ && __FMA__ && __F16C__

}  // namespace tessera::mm
