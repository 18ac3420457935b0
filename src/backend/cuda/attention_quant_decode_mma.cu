// Decode attention over quantized KV pages on the tensor cores (head_dim 64/128, up to 16
// query heads per KV head, blocks of 16 tokens), for the pairs that
// attention_quant_decode_frag.cu does not take (turbo keys with the QJL sketch, f32 on either
// side; every other pair, plain turbo included, decodes straight into the mma fragments there):
// attention_decode_mma.cu's scheme with the tile producer replaced. A block of 4 warps per (sequence, KV head, split of split_len
// keys); the query heads are the 16 rows of mma.sync m16n8k16 (f16 operands, f32
// accumulate, base-2 online softmax, rows past the group zero). Warp w takes 16-key tiles
// w, w + 4, ...; a tile is exactly one page of K and one of V (splits start at multiples of
// 64 keys), copied as stored -- codes and their scales -- by cp.async into the warp's ring
// of 3 raw-page buffers two tiles ahead (the f16 kernel's pipeline, at the cache's own
// size). The lanes decode the landed pages from shared memory (kv_load8/kv_convert8, turbo
// codebooks staged in shared memory), round to f16 into the warp's operand tile, then Q·Kᵀ
// by ldmatrix and P·V by ldmatrix.trans as the f16 kernel. Turbo keys with QJL extend K to
// 2·head_dim ([ŷ, ±coef]) and Q to [q', S q'], so the sketch term is part of the same
// products; turbo values stay in V's rotated basis (the merge kernel rotates back). The block
// merges its warps in shared memory and writes the split's partials (m in natural-log
// units) for attention_quant_decode.cu's merge kernel.
//
// Numerics: decoded K/V, Q (scaled by softmax_scale·log2 e) and P are rounded to f16
// (~1e-3 relative on outlier-heavy keys); decoded values must stay within f16's range.
#include <algorithm>
#include <cfloat>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_quant.cuh"
#include "backend/cuda/mma_common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = 16;  // keys per tile
constexpr int kPad = 8;    // halves of padding per shared K/V row (ldmatrix rows in distinct banks)

constexpr int kStages = 3;  // raw page buffers per warp (two tiles in flight while one is decoded)

template <int HD, bool QJL>
struct Shape {
  static constexpr int KW = QJL ? 2 * HD : HD;  // K row width (QJL: ŷ then the sketch)
  static constexpr int LDK = KW + kPad, LDV = HD + kPad;
  static constexpr size_t operand = sizeof(__half) * kKeys * (LDK + LDV);  // per warp
  static constexpr size_t merge = sizeof(float) * kWarps * 16 * (HD + 8 + 2);
};
// Per block: per warp the operand tile and a ring of kStages (K page, V page), then the
// query staging [16][KW] floats and the turbo codebooks [4][16]; the merge reuses the front.
template <int HD, bool QJL>
size_t smem_bytes(int64_t k_page, int64_t v_page) {
  using S = Shape<HD, QJL>;
  const size_t warps = kWarps * (S::operand + kStages * static_cast<size_t>(k_page + v_page));
  return std::max(warps, S::merge) + sizeof(float) * (16 * S::KW + 64);
}

__device__ __forceinline__ uint4 pack8(const float* f) {
  return make_uint4(pack_half2(f[0], f[1]), pack_half2(f[2], f[3]), pack_half2(f[4], f[5]), pack_half2(f[6], f[7]));
}

// 8 decoded channels as 4 packed f16 pairs, the operands' format.
template <int C>
__device__ __forceinline__ uint4 convert8_f16(const KvSide& s, const Raw8& r, int d0, int hd) {
  float f[8];
  kv_convert8<C>(s, r, d0, hd, f);
  return pack8(f);
}

template <int C, int HD, bool QJL>
__global__ void __launch_bounds__(kThreads)
    attention_quant_decode_mma(const float* __restrict__ q, int64_t ldq, KvSide ks, KvSide vs, DeviceBatch b,
                               int n_kv_heads, int group, float scale, int split_len, int max_splits,
                               float* __restrict__ partials, int area) {
  using S = Shape<HD, QJL>;
  constexpr int KW = S::KW, LDK = S::LDK, LDV = S::LDV;
  constexpr int PPK = HD / 8;           // 8-channel pieces per key
  constexpr int NP = kKeys * PPK / 32;  // pieces per lane per tile: 8 (HD 128) or 4 (HD 64)
  constexpr int OLD = HD + 8;           // merge: shared O row stride in floats
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int seq = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int t = b.q_start[seq];
  const int len = min(b.kv_len[seq], b.positions[t] + 1);  // causal
  const int begin = split * split_len;
  if (begin >= len) return;  // the merge reads only the splits that hold keys
  const int end = min(len, begin + split_len);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int fr = lane >> 2, fc = lane & 3;
  const int head0 = kvh * group;

  // Query heads in K's basis (turbo: rotated, S q' beside), then as A fragments (base 2).
  float* Qs = reinterpret_cast<float*>(smem + area);      // [16][KW]
  float* codes = Qs + 16 * KW;                            // turbo codebooks: K hi, K lo, V hi, V lo [16] each
  if constexpr (C == static_cast<int>(KvCodec::Turbo)) {  // decoded from shared memory below
    if (threadIdx.x < 64) {
      const KvSide& side = threadIdx.x < 32 ? ks : vs;
      codes[threadIdx.x] = ((threadIdx.x / 16) % 2 == 0 ? side.code_hi : side.code_lo)[threadIdx.x % 16];
    }
  }
  for (int i = threadIdx.x; i < 16 * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    Qs[g * KW + d] = g < group ? q[t * ldq + static_cast<int64_t>(head0 + g) * HD + d] * scale : 0.0f;
  }
  constexpr float kLog2e = 1.4426950408889634f;
  __shared__ float first_s[16];  // the first key's score term per row (the split holding it)
  kv_prepare_queries(ks, kvh, HD, Qs, KW, 16, group, begin == 0 ? first_s : nullptr, kLog2e);
  uint32_t qf[KW / 16][4];
#pragma unroll
  for (int kk = 0; kk < KW / 16; ++kk) {
    const float* r0 = Qs + fr * KW + kk * 16 + 2 * fc;
    const float* r1 = r0 + 8 * KW;
    qf[kk][0] = pack_half2(r0[0] * kLog2e, r0[1] * kLog2e);
    qf[kk][1] = pack_half2(r1[0] * kLog2e, r1[1] * kLog2e);
    qf[kk][2] = pack_half2(r0[8] * kLog2e, r0[9] * kLog2e);
    qf[kk][3] = pack_half2(r1[8] * kLog2e, r1[9] * kLog2e);
  }

  unsigned char* const wbase = smem + warp * (S::operand + kStages * (ks.page_bytes + vs.page_bytes));
  __half* const Kt = reinterpret_cast<__half*>(wbase);  // [16][LDK]
  __half* const Vt = Kt + kKeys * LDK;                  // [16][LDV]
  unsigned char* const ring = wbase + S::operand;       // [kStages][K page, V page]
  const int64_t stage_bytes = ks.page_bytes + vs.page_bytes;
  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;
  const int n_tiles = (end - begin + kKeys - 1) / kKeys;
  const int my_tiles = warp < n_tiles ? (n_tiles - warp + kWarps - 1) / kWarps : 0;
  // Issues this warp's local tile i (global tile warp + 4i, page key0 / 16) into stage
  // i % kStages and commits a group (an empty one past the warp's last tile).
  auto issue = [&](int i) {
    if (i < my_tiles) {
      const int key0 = begin + (warp + i * kWarps) * kKeys;
      const int64_t page = static_cast<int64_t>(__ldg(table + key0 / kKeys)) * n_kv_heads + kvh;
      unsigned char* dst = ring + (i % kStages) * stage_bytes;
      const unsigned char* kp = ks.base + page * ks.page_bytes;
      const unsigned char* vp = vs.base + page * vs.page_bytes;
      for (int64_t o = 16 * lane; o < ks.page_bytes; o += 16 * 32) cp_async16(dst + o, kp + o);
      for (int64_t o = 16 * lane; o < vs.page_bytes; o += 16 * 32) cp_async16(dst + ks.page_bytes + o, vp + o);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  KvSide kl = ks, vl = vs;  // the sides as read from shared memory: codebooks staged there too
  if constexpr (C == static_cast<int>(KvCodec::Turbo)) {
    kl.code_hi = codes, kl.code_lo = codes + 16;
    vl.code_hi = codes + 32, vl.code_lo = codes + 48;
  }
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i);
  __syncthreads();  // the staged codebooks
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  for (int i = 0; i < my_tiles; ++i) {
    issue(i + kStages - 1);  // into the stage of tile i - 1, released by the __syncwarp ending i - 1
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
    __syncwarp();
    const int key0 = begin + (warp + i * kWarps) * kKeys;
    const unsigned char* kpage = ring + (i % kStages) * stage_bytes;
    const unsigned char* vpage = kpage + ks.page_bytes;
    // The pages into the operand tile as f16: piece it = lane + 32r is key it / PPK,
    // channels (it % PPK) * 8; keys past the end are zeros (P is 0 there, but 0 · NaN would
    // poison O).
#pragma unroll
    for (int r = 0; r < NP; ++r) {
      const int it = lane + 32 * r, j = it / PPK, d0 = (it % PPK) * 8;
      const bool ok = key0 + j < end;
      Raw8 raw;
      kv_load8<C>(kl, kpage, j, d0, HD, kvh, raw);
      *reinterpret_cast<uint4*>(Kt + j * LDK + d0) = ok ? convert8_f16<C>(kl, raw, d0, HD) : make_uint4(0, 0, 0, 0);
      if constexpr (QJL) {
        float f[8];
        kv_convert_qjl8(raw, f);
        *reinterpret_cast<uint4*>(Kt + j * LDK + HD + d0) = ok ? pack8(f) : make_uint4(0, 0, 0, 0);
      }
      kv_load8<C>(vl, vpage, j, d0, HD, kvh, raw);
      *reinterpret_cast<uint4*>(Vt + j * LDV + d0) = ok ? convert8_f16<C>(vl, raw, d0, HD) : make_uint4(0, 0, 0, 0);
    }
    __syncwarp();
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < KW / 16; ++kk) {
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4(smem_addr(Kt + ((lane & 7) + (lane >> 4) * 8) * LDK + kk * 16 + ((lane >> 3) & 1) * 8), b0, b1, b2,
                  b3);
      mma_f16(s[0], qf[kk], b0, b1);
      mma_f16(s[1], qf[kk], b2, b3);
    }
    if (key0 == 0 && fc == 0) {  // the first key: s[0][0], s[0][2]
      s[0][0] += first_s[fr];
      s[0][2] += first_s[fr + 8];
    }
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (key0 + n * 8 + 2 * fc + (e & 1) >= end) s[n][e] = -INFINITY;
    float c_a, c_b;
    online_softmax_step<2>(s, m_a, m_b, l_a, l_b, c_a, c_b);
    const uint32_t pa[4] = {pack_half2(s[0][0], s[0][1]), pack_half2(s[0][2], s[0][3]), pack_half2(s[1][0], s[1][1]),
                            pack_half2(s[1][2], s[1][3])};
#pragma unroll
    for (int n = 0; n < HD / 8; n += 2) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        o[n + h][0] *= c_a;
        o[n + h][1] *= c_a;
        o[n + h][2] *= c_b;
        o[n + h][3] *= c_b;
      }
      uint32_t b0, b1, b2, b3;
      ldmatrix_x4_trans(smem_addr(Vt + ((lane & 7) + ((lane >> 3) & 1) * 8) * LDV + n * 8 + (lane >> 4) * 8), b0, b1,
                        b2, b3);
      mma_f16(o[n], pa, b0, b1);
      mma_f16(o[n + 1], pa, b2, b3);
    }
    __syncwarp();  // every lane done with this tile's pages and operands before they are refilled
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // only empty groups can be pending here
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);

  // The 4 warps merged in a fixed order (a warp without tiles: m = -inf, adds nothing).
  __syncthreads();                             // the tiles' area becomes the merge area
  float* so = reinterpret_cast<float*>(smem);  // [kWarps][16][OLD]
  float* sm = so + kWarps * 16 * OLD;          // [kWarps][16]
  float* sl = sm + kWarps * 16;                // [kWarps][16]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = fr + 8 * half;
    if (fc == 0) {
      sm[warp * 16 + row] = half ? m_b : m_a;
      sl[warp * 16 + row] = half ? l_b : l_a;
    }
    float* dst = so + (warp * 16 + row) * OLD + 2 * fc;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n)
      *reinterpret_cast<float2*>(dst + n * 8) = make_float2(o[n][2 * half], o[n][2 * half + 1]);
  }
  __syncthreads();
  const int n_heads = n_kv_heads * group;
  for (int i = threadIdx.x; i < group * HD; i += kThreads) {
    const int g = i / HD, d = i % HD;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w * 16 + g]);
    float l = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = sm[w * 16 + g];
      if (mw == -INFINITY) continue;
      const float c = exp2f(mw - mx);
      l += sl[w * 16 + g] * c;
      acc += so[(w * 16 + g) * OLD + d] * c;
    }
    float* p = partials + ((static_cast<int64_t>(seq) * n_heads + head0 + g) * max_splits + split) * (HD + 2);
    p[2 + d] = acc;
    if (d == 0) {
      p[0] = mx * 0.6931471805599453f;  // base 2 -> natural log units (the merge uses __expf)
      p[1] = l;
    }
  }
}

template <int C, int HD, bool QJL>
void launch_as(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
               int split_len, int max_splits, float* partials, cudaStream_t s) {
  const size_t smem = smem_bytes<HD, QJL>(kv.k_page_bytes, kv.v_page_bytes);
  const int area = static_cast<int>(smem - sizeof(float) * (16 * Shape<HD, QJL>::KW + 64));
  static size_t configured = 0;  // per instantiation: the largest opt-in asked for so far
  if (smem > configured) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(attention_quant_decode_mma<C, HD, QJL>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    configured = smem;
  }
  launch_pdl(attention_quant_decode_mma<C, HD, QJL>, dim3(b.n_seqs, kv.n_kv_heads, max_splits), dim3(kThreads), smem, s,
             q, ldq, kv_side(kv, true), kv_side(kv, false), b, kv.n_kv_heads, group, scale, split_len, max_splits,
             partials, area);
  TESSERA_CUDA_CHECK_LAUNCH("attention_quant_decode_mma");
}

template <int HD>
void launch_hd(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b, int group, float scale,
               int split_len, int max_splits, float* partials, cudaStream_t s) {
  // What reaches this kernel (attention_quant_decode_frag_applies declined): turbo:qjl keys
  // with turbo values compiled for themselves, any other pair (f32 on a side, or QJL keys
  // with other values) reads its formats at run time.
  constexpr int kTurbo = static_cast<int>(KvCodec::Turbo);
  if (kv.k_fmt.codec == KvCodec::Turbo && kv.v_fmt.codec == KvCodec::Turbo && kv.k_fmt.qjl)
    return launch_as<kTurbo, HD, true>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s);
  if (kv.k_fmt.qjl) return launch_as<-1, HD, true>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s);
  launch_as<-1, HD, false>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s);
}

}  // namespace

bool attention_quant_decode_mma_applies(const KvLayerView& kv, int n_heads) {
  // Blocks of 16 tokens: a tile is one page. Pages small enough for two blocks per SM.
  return (kv.head_dim == 64 || kv.head_dim == 128) && kv.block_size == kKeys && kv.n_kv_heads > 0 &&
         n_heads % kv.n_kv_heads == 0 && n_heads / kv.n_kv_heads <= 16 &&
         smem_bytes<128, true>(kv.k_page_bytes, kv.v_page_bytes) <= 112 * 1024;
}

void launch_attention_quant_decode_mma(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                       int n_heads, float scale, int split_len, int max_splits, float* partials,
                                       cudaStream_t s) {
  const int group = n_heads / kv.n_kv_heads;
  if (kv.head_dim == 64)
    launch_hd<64>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s);
  else
    launch_hd<128>(q, ldq, kv, b, group, scale, split_len, max_splits, partials, s);
}

}  // namespace tessera::cuda
