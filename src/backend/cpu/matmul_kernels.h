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
// kernels of every block format read them the same way. Q8_K rows also carry what the AVX2
// K-quant panels want: the quants + 128 as unsigned bytes, and the sums of 32 as i16 pairs.
struct ActLayout {
  int64_t cols = 0;
  int64_t off_d32 = 0;     // f32 [cols/32]: scale of the group (the super-block's d for Q8_K)
  int64_t off_s32 = 0;     // f32 [cols/32]: Q8: fp16(d*sum) as GGML's Q8_1; Q8_K: d*sum
  int64_t off_sum32 = 0;   // i32 [cols/32]: sum of the group's qs
  int64_t off_sum16 = 0;   // i32 [cols/16]: sums of 16 (Q8_K only; GGML's bsums)
  int64_t off_qsu = 0;     // u8 [cols]: qs + 128 (Q8_K only)
  int64_t off_pair32 = 0;  // i32 [cols/64]: (sum32[2k] & 0xFFFF) | sum32[2k+1] << 16 (Q8_K only)
  int64_t row_bytes = 0;   // multiple of 64; qs start every row

  static ActLayout make(int64_t cols, bool q8k) {
    auto up64 = [](int64_t n) { return (n + 63) / 64 * 64; };
    ActLayout l;
    l.cols = cols;
    const int64_t g32 = cols / 32, g16 = cols / 16;
    l.off_d32 = up64(cols);
    l.off_s32 = l.off_d32 + up64(g32 * 4);
    l.off_sum32 = l.off_s32 + up64(g32 * 4);
    l.off_sum16 = l.off_sum32 + up64(g32 * 4);
    l.off_qsu = l.off_sum16 + (q8k ? up64(g16 * 4) : 0);
    l.off_pair32 = l.off_qsu + (q8k ? up64(cols) : 0);
    l.row_bytes = l.off_pair32 + (q8k ? up64(cols / 64 * 4) : 0);
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
  const uint8_t* qsu;
  const int32_t* pair32;
};

inline ActRow act_row(const uint8_t* base, const ActLayout& l, int64_t t) {
  const uint8_t* r = base + t * l.row_bytes;
  return {reinterpret_cast<const int8_t*>(r),
          reinterpret_cast<const float*>(r + l.off_d32),
          reinterpret_cast<const float*>(r + l.off_s32),
          reinterpret_cast<const int32_t*>(r + l.off_sum32),
          reinterpret_cast<const int32_t*>(r + l.off_sum16),
          r + l.off_qsu,
          reinterpret_cast<const int32_t*>(r + l.off_pair32)};
}

// Free helpers below have internal linkage (anonymous namespaces): each file compiles its
// own copy with its own flags, so a copy vectorized with AVX2 is never linked into the
// baseline path.
namespace {

// Two i16 in one i32 lane, for _mm256_madd_epi16 against pairs of the other operand.
inline int32_t i16_pair(int32_t lo, int32_t hi) {
  return static_cast<int32_t>((static_cast<uint32_t>(static_cast<uint16_t>(lo))) |
                              (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16));
}

// The Q8_K extras, from a row whose qs and sum32 are written.
inline void finish_q8k_row(uint8_t* row, const ActLayout& l) {
  for (int64_t k = 0; k < l.cols; ++k) row[l.off_qsu + k] = static_cast<uint8_t>(row[k] ^ 0x80);
  const int32_t* sum32 = reinterpret_cast<const int32_t*>(row + l.off_sum32);
  int32_t* pair32 = reinterpret_cast<int32_t*>(row + l.off_pair32);
  for (int64_t k = 0; k < l.cols / 64; ++k) pair32[k] = i16_pair(sum32[2 * k], sum32[2 * k + 1]);
}

}  // namespace

// Writes one row of `cols` floats in the given format (row points at row_bytes of storage).
using QuantizeFn = void (*)(const float* x, uint8_t* row, const ActLayout& l);

// ---- The canonical order of the f32 arithmetic --------------------------------------------
//
// Every kernel (scalar, AVX2, AVX-512; direct and panel) computes each output with the same
// f32 operations in the same order, so an output does not depend on how many input rows,
// targets or threads share its call, nor on the instruction set (bitwise):
//  * Float weights: eight partial sums, lane l holding columns k = l (mod 8), each updated
//    in column order with one fused multiply-add acc_l = fma(w_k, x_k, acc_l); the result is
//    sum8_canonical of the lanes (padding past the last column adds exact zeros: lanes start
//    at +0 and never become -0, so that changes nothing).
//  * Block weights: one accumulator, blocks (32 values; 256 for K-quants) in order. Per block
//    an exact integer dot isum_b (zero points, K-quant sub-block scales and mins applied in
//    integers), then acc = fma(d_w * d_x, float(isum_b), acc) with d_w * d_x one rounded f32
//    product; Q4_1/Q5_1 then acc = fma(m_w, s_x, acc); Q4_K/Q5_K then
//    acc = fma(-(dmin_w * d_x), float(msum_b), acc), msum_b = sum of mins times the
//    activation's sums of 32.
// No kernel may write a*b+c unfused: GCC contracts such expressions into FMAs where the file
// is compiled with -mfma (it does not in the baseline scalar file), so every multiply-add is
// an explicit fma and every other product only feeds one.
constexpr int kLanes = 8;

namespace {
inline float sum8_canonical(const float a[kLanes]) {
  return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
}
}  // namespace

// ---- Kernels -----------------------------------------------------------------------------

// y[t * ldy + r] = x[t] · W[r] for r < n_w, t < n_x, on rows of one weight.
struct MatmulTask {
  const uint8_t* w = nullptr;  // first weight row
  int64_t w_stride = 0;        // bytes between weight rows
  int64_t n_w = 0;
  int64_t cols = 0;
  const float* x = nullptr;  // f32 activations (F32/F16/BF16 weights)
  int64_t ldx = 0;
  const uint8_t* act = nullptr;  // quantized activations (block formats), first row
  const ActLayout* act_layout = nullptr;
  int64_t n_x = 0;
  float* y = nullptr;  // y of the first weight row and first activation row
  int64_t ldy = 0;
  uint8_t* scratch = nullptr;  // per-thread, at least KernelSet::scratch_bytes(dtype, cols)
  // Group-quantized weights (W4G/W8G; w and w_stride address their codes): the f16 scales and
  // u8 zero points of the first weight row, group-major ([group][matrix row], stride gq_ld);
  // gq_zeros null means every zero is 2^(bits-1). The activations are Q8 over the permuted,
  // zero-padded input (cols = the padded width).
  const uint16_t* gq_scales = nullptr;
  const uint8_t* gq_zeros = nullptr;
  int64_t gq_ld = 0;
  int64_t gq_group = 0;
  // FP8W weights (w and w_stride address their codes; x is the f32 input): the f32 scales
  // of the first weight row, one per row.
  const float* fp8_scales = nullptr;
};

using MatmulKernel = void (*)(const MatmulTask&);

// Prefill tiling: from this many input rows on, SIMD kernels repack weights into panels in
// their scratch (each weight block is then dotted against many input rows), and the work is
// also split over the input rows (so a panel of x stays in L2 while weight panels go by).
// A speed choice only: panel and direct kernels give bitwise the same outputs.
constexpr int64_t kPanelMinRows = 8;

// Weight types the matmul computes with, as a dense index for kernel tables.
enum class WKind : int { F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, Count };
constexpr int kNumWKinds = static_cast<int>(WKind::Count);

// -1 when the type has no matmul kernel.
inline int wkind_index(DType t) {
  switch (t) {
    case DType::F32:
      return 0;
    case DType::F16:
      return 1;
    case DType::BF16:
      return 2;
    case DType::Q4_0:
      return 3;
    case DType::Q4_1:
      return 4;
    case DType::Q5_0:
      return 5;
    case DType::Q5_1:
      return 6;
    case DType::Q8_0:
      return 7;
    case DType::Q4_K:
      return 8;
    case DType::Q5_K:
      return 9;
    case DType::Q6_K:
      return 10;
    default:
      return -1;
  }
}

enum class ActKind { F32, Q8, Q8K };

inline ActKind act_kind(DType t) {
  switch (t) {
    case DType::Q4_0:
    case DType::Q4_1:
    case DType::Q5_0:
    case DType::Q5_1:
    case DType::Q8_0:
      return ActKind::Q8;
    case DType::Q4_K:
    case DType::Q5_K:
    case DType::Q6_K:
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

// A repacked panel of `rows` weight rows in a task's scratch: quants [cols/32][8 groups of 4]
// [rows][4 bytes]; 32-value blocks: scales d and offsets m [cols/32][rows] f32; K-quants, per
// super-block: d and dmin [rows] f32, sub-block scales sc [16][rows] and pairs of mins mp
// [4][rows] as i32 in the form the ISA's kernels want, and a correction wc [rows] i32 (AVX2
// Q6_K: see matmul_panel_avx2.cpp).
struct Panel {
  uint8_t* q;
  float* d;
  float* m;
  int32_t* sc;
  int32_t* mp;
  int32_t* wc;
};

namespace {
inline Panel panel_in(uint8_t* scratch, int64_t cols, int rows) {
  auto up64 = [](int64_t n) { return (n + 63) / 64 * 64; };
  const int64_t n32 = cols / 32, n256 = cols / 256;
  Panel p;
  p.q = scratch;
  uint8_t* at = scratch + up64(cols * rows);
  p.d = reinterpret_cast<float*>(at);
  at += up64(n32 * rows * 4);
  p.m = reinterpret_cast<float*>(at);
  at += up64(n32 * rows * 4);
  p.sc = reinterpret_cast<int32_t*>(at);
  at += up64(n256 * 16 * rows * 4);
  p.mp = reinterpret_cast<int32_t*>(at);
  at += up64(n256 * 4 * rows * 4);
  p.wc = reinterpret_cast<int32_t*>(at);
  return p;
}
// Bytes panel_in lays out (panel_scratch_bytes makes room for two panels of panel_rows).
inline int64_t panel_bytes(int64_t cols, int rows) {
  auto up64 = [](int64_t n) { return (n + 63) / 64 * 64; };
  return up64(cols * rows) + 2 * up64(cols / 32 * rows * 4) + up64(cols / 256 * 16 * rows * 4) +
         up64(cols / 256 * 4 * rows * 4) + up64(cols / 256 * rows * 4);
}
}  // namespace

// Scratch a kernel of `set` needs for rows of `cols` elements (a repacked panel of weights).
int64_t panel_scratch_bytes(const KernelSet& set, int64_t cols);

const KernelSet& scalar_kernel_set();
// Defined in the ISA files; call only when the CPU supports the ISA.
const KernelSet& avx2_kernel_set();
const KernelSet& avx512_kernel_set();

// The AVX2 panel kernels by WKind and its quantizers (the AVX-512 set uses the quantizers
// too; each set compiles the direct kernels of matmul_direct_impl.h for itself).
extern const MatmulKernel avx2_panel_kernels[kNumWKinds];
void avx2_quantize_q8(const float* x, uint8_t* row, const ActLayout& l);
void avx2_quantize_q8k(const float* x, uint8_t* row, const ActLayout& l);
// Rows per repacked panel: one register lane per weight row (AVX2 kernels repack two panels
// at a time, so their scratch holds 16 rows).
constexpr int kAvx2PanelRows = 8;
constexpr int kAvx512PanelRows = 16;

// Group-quantized weights (matmul_gq_*.cpp), any number of weight and input rows. The
// canonical order: one accumulator per output, 32-column blocks in order, per block the exact
// isum_b = sum (q - zero) * x_q, then acc = fma(scale_g * d_x, float(isum_b), acc).
void gq_matmul_scalar_w4(const MatmulTask& t);
void gq_matmul_scalar_w8(const MatmulTask& t);
void gq_matmul_avx2_w4(const MatmulTask& t);  // call only when the CPU has AVX2, FMA, F16C
void gq_matmul_avx2_w8(const MatmulTask& t);

// FP8W weights (matmul_fp8.cpp), any number of weight and input rows, f32 arithmetic.
void fp8_matmul_scalar(const MatmulTask& t);

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

// The low nibbles of 16 bytes, then their high nibbles: Q4_0/Q4_1/Q5_x element order.
inline __m256i nibbles_32(const uint8_t* p) {
  const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// 32 bits to 32 bytes: 0xFF where the bit is set (the 5th bits of Q5_0/Q5_1).
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
  static __m256 load8(const uint8_t* w) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
  }
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

// ---- canonical reductions (see "The canonical order" above) ----

// sum8_canonical of the eight lanes of v.
inline float hsum8_canonical(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // a_i + a_i+4
  const __m128 t = _mm_add_ps(s, _mm_movehdup_ps(s));                                   // lanes 0, 2: s0 + s1, s2 + s3
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehl_ps(t, t)));
}

// Lane k = sum8_canonical of v[k]'s lanes, for eight vectors at once.
inline __m256 hsum8x8_canonical(const __m256 v[8]) {
  __m256 s[4];  // s[i] = [v[2i] a_j + a_j+4 | v[2i+1] a_j + a_j+4]
  for (int i = 0; i < 4; ++i)
    s[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                         _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
  // hadd: (s0 + s1), (s2 + s3), then their sum; lanes come out as v0 v2 v4 v6 | v1 v3 v5 v7.
  const __m256 r = _mm256_hadd_ps(_mm256_hadd_ps(s[0], s[1]), _mm256_hadd_ps(s[2], s[3]));
  return _mm256_permutevar8x32_ps(r, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Lane k = the sum of v[k]'s eight i32 lanes (exact: any order gives the same).
inline __m256i hsum8x8_i32(const __m256i v[8]) {
  const __m256i a = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
  const __m256i b = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

// Lanes [0, n) of p, zeros above (n <= 8; never reads past p[n-1]).
inline __m256 load_first_ps(const float* p, int n) {
  if (n >= 8) return _mm256_loadu_ps(p);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_maskload_ps(p, mask);
}

// Quants of 64 values of a Q4_K/Q5_K super-block (c = 0..3) as bytes: *lo the 32 low nibbles
// (sub-block 2c), *hi the 32 high ones (2c+1), with Q5_K's 5th bits from `hbits` (its qh).
template <bool kFive>
inline void qk45_quants(const uint8_t* qs, __m256i hbits, int c, __m256i* lo, __m256i* hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m1 = _mm256_set1_epi8(1);
  const __m256i bits = load256(qs + 32 * c);
  *lo = _mm256_and_si256(bits, m4);
  *hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
  if constexpr (kFive) {
    const __m256i b_lo = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), m1);
    const __m256i b_hi = _mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c + 1), m1);
    *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(b_lo, 4));
    *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(b_hi, 4));
  }
}

// Quants (0..63) of one half (128 values) of a Q6_K super-block as four registers of 32.
inline void q6k_quants(const BlockQ6_K& b, int half, __m256i q[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  const __m256i l0 = load256(b.ql + 64 * half), l1 = load256(b.ql + 64 * half + 32);
  const __m256i h = load256(b.qh + 32 * half);
  auto high = [&](int shift) { return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), m3), 4); };
  q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), high(0));
  q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), high(2));
  q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), high(4));
  q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), high(6));
}

// Panel decoders: the quants of one chunk of a row as bytes in element order, with its scales.
// 32-value blocks: value = d * (q - kZero) + m. K-quants (kSuper): SuperScales.
struct DQ4_0 {
  static constexpr int kChunk = 32, kSub = 32, kZero = 8, kSteps = 8;
  static constexpr bool kHasMin = false, kSigned = false, kSuper = false;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float*) {
    const auto& b = *reinterpret_cast<const BlockQ4_0*>(src);
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), nibbles_32(b.qs));
    d[0] = h2f(b.d);
  }
};
struct DQ4_1 {
  static constexpr int kChunk = 32, kSub = 32, kZero = 0, kSteps = 8;
  static constexpr bool kHasMin = true, kSigned = false, kSuper = false;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float* m) {
    const auto& b = *reinterpret_cast<const BlockQ4_1*>(src);
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), nibbles_32(b.qs));
    d[0] = h2f(b.d);
    m[0] = h2f(b.m);
  }
};
struct DQ5_0 {
  static constexpr int kChunk = 32, kSub = 32, kZero = 16, kSteps = 4;
  static constexpr bool kHasMin = false, kSigned = false, kSuper = false;
  static void decode(const uint8_t* src, uint8_t* q, float* d, float*) {
    const auto& b = *reinterpret_cast<const BlockQ5_0*>(src);
    const __m256i v = _mm256_or_si256(nibbles_32(b.qs), _mm256_and_si256(bits_to_bytes(b.qh), _mm256_set1_epi8(0x10)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), v);
    d[0] = h2f(b.d);
  }
};
struct DQ5_1 {
  static constexpr int kChunk = 32, kSub = 32, kZero = 0, kSteps = 4;
  static constexpr bool kHasMin = true, kSigned = false, kSuper = false;
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
  static constexpr bool kHasMin = false, kSigned = true, kSuper = false;
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

// Scales of one K-quant super-block as the panels use them.
struct SuperScales {
  float d, dmin;   // dmin: Q4_K/Q5_K
  int32_t sc[16];  // sub-block scales (8 for Q4_K/Q5_K, 16 for Q6_K)
  int32_t mn[8];   // sub-block mins (Q4_K/Q5_K)
};

// Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
template <bool kFive>
struct DQK45 {
  static constexpr int kChunk = 256, kSub = 32, kSubs = 8, kZero = 0, kSteps = kFive ? 4 : 8;
  static constexpr bool kHasMin = true, kSigned = false, kSuper = true;
  static void decode(const uint8_t* src, uint8_t* q, SuperScales* s) {
    using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
    const auto& b = *reinterpret_cast<const Block*>(src);
    uint8_t sm[16];
    unpack_k4_scales(b.scales, sm);
    s->d = h2f(b.d), s->dmin = h2f(b.dmin);
    for (int g = 0; g < 8; ++g) s->sc[g] = sm[g], s->mn[g] = sm[8 + g];
    __m256i hbits = _mm256_setzero_si256();
    if constexpr (kFive) hbits = load256(b.qh);
    for (int c = 0; c < 4; ++c) {
      __m256i lo, hi;
      qk45_quants<kFive>(b.qs, hbits, c, &lo, &hi);
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 64 * c), lo);
      _mm256_store_si256(reinterpret_cast<__m256i*>(q + 64 * c + 32), hi);
    }
  }
};

// Q6_K: 16 sub-blocks of 16 with int8 scales, quants 0..63 with zero point 32.
struct DQ6K {
  static constexpr int kChunk = 256, kSub = 16, kSubs = 16, kZero = 32, kSteps = 2;
  static constexpr bool kHasMin = false, kSigned = false, kSuper = true;
  static void decode(const uint8_t* src, uint8_t* q, SuperScales* s) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(src);
    s->d = h2f(b.d), s->dmin = 0.0f;
    for (int g = 0; g < 16; ++g) s->sc[g] = b.scales[g];
    for (int half = 0; half < 2; ++half) {
      __m256i v[4];
      q6k_quants(b, half, v);
      for (int k = 0; k < 4; ++k) _mm256_store_si256(reinterpret_cast<__m256i*>(q + 128 * half + 32 * k), v[k]);
    }
  }
  // The quants as signed q - 32, and sum_g sc_g * sum (q - 32) over the super-block (exact).
  static void decode_signed(const uint8_t* src, uint8_t* q, SuperScales* s, int32_t* weighted_sum) {
    const auto& b = *reinterpret_cast<const BlockQ6_K*>(src);
    s->d = h2f(b.d), s->dmin = 0.0f;
    for (int g = 0; g < 16; ++g) s->sc[g] = b.scales[g];
    const __m256i k32 = _mm256_set1_epi8(32), ones = _mm256_set1_epi8(1);
    __m256i acc = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      __m256i v[4];
      q6k_quants(b, half, v);
      for (int k = 0; k < 4; ++k) {
        const __m256i sv = _mm256_sub_epi8(v[k], k32);
        _mm256_store_si256(reinterpret_cast<__m256i*>(q + 128 * half + 32 * k), sv);
        // 32 values = sub-blocks 8 half + 2k (low lane) and 8 half + 2k + 1 (high lane)
        const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(b.scales[8 * half + 2 * k + 1]),
                                            _mm_set1_epi16(b.scales[8 * half + 2 * k]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(ones, sv), sc));
      }
    }
    __m128i r = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256(acc, 1));
    r = _mm_add_epi32(r, _mm_unpackhi_epi64(r, r));
    r = _mm_add_epi32(r, _mm_shuffle_epi32(r, 1));
    *weighted_sum = _mm_cvtsi128_si32(r);
  }
};

}  // namespace
#endif  // __AVX2__ && __FMA__ && __F16C__

}  // namespace tessera::mm
