// Decode attention over quantized KV pages on the tensor cores, the pages decoded straight
// into the mma fragments (fp8, int8, int4, turbo without QJL and f16 sides; head_dim 64/128,
// up to 16 query heads per KV head, blocks of 16 tokens). attention_decode_mma.cu's scheme: a block of 4
// warps per (sequence, KV head, split of split_len keys) and chunk of the sequence's query
// rows (decode: one row; a speculative verification: 16 / group rows per chunk, each with its
// own causal length), the query heads of the chunk's rows the 16 rows of mma.sync m16n8k16
// (f16 operands, f32 accumulate, base-2 online softmax, rows past the chunk's zero); warp w takes the 16-key tiles w, w + 4, ...; a tile is one page of K and one
// of V (splits start at multiples of 64 keys), copied as stored by cp.async into the warp's
// ring of kStages raw-page buffers, kStages - 1 tiles ahead. Each lane then reads only the
// raw codes and scales its own B fragments need (kv_quant_frag.cuh: layout, channel orders,
// where each scale goes) and converts them in registers: no f16 operand tile, no ldmatrix,
// no shared-memory store or warp barrier between the copy and the mma. The block merges its
// warps in shared memory (O's columns back in channel order, static V scales applied) and
// writes the split's partials (m in natural-log units) for attention_quant_decode.cu's merge
// (or, with one split and values not turbo, the normalized output). Turbo keys: the query
// heads rotated once in shared memory before their fragments are built.
//
// Numerics: decoded K/V (scaled by their group / token / channel scales), Q (scaled by
// softmax_scale·log2 e and a static K scale) and P are rounded to f16; per-token K scales
// multiply the f32 scores, static V scales the f32 output. Turbo: centroids rounded to f16;
// values are centroid × norm in f16 (norms up to ~16,000), 1/sqrt(hd) on the f32 output.
#include <algorithm>
#include <cfloat>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_quant_frag.cuh"
#include "backend/cuda/mma_common.cuh"

namespace tessera::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = 16;   // keys per tile (one page)
constexpr int kStages = 3;  // raw page buffers per warp (4 and 6 measured no faster)

// Per block: the rings, [kStages][kWarps][K page, V page]; the query staging [16][HD] floats
// lies on the last stage of every warp (not filled before the loop), past it if that is
// smaller; the merge reuses the front.
template <int HD>
size_t smem_bytes(int64_t k_page, int64_t v_page) {
  const size_t stage = kWarps * static_cast<size_t>(k_page + v_page);
  const size_t ring = kStages * stage, merge = sizeof(float) * kWarps * 16 * (HD + 8 + 2);
  const size_t query = (kStages - 1) * stage + sizeof(float) * 16 * HD;
  return std::max({ring, merge, query});
}

// The factor of a side's decoded values that is the same for every token of KV head h:
// static fp8 scales, turbo's 1/sqrt(hd) (its codes decode to centroid · norm / sqrt(hd)).
__device__ __forceinline__ float static_scale(const KvSide& s, int h, int hd) {
  if (s.f.codec == KvCodec::Turbo) return rsqrtf(static_cast<float>(hd));
  const bool fp8 = s.f.codec == KvCodec::Fp8E4M3 || s.f.codec == KvCodec::Fp8E5M2;
  return fp8 && (s.f.scale == KvScale::Tensor || s.f.scale == KvScale::Head) ? s.scales[h] : 1.0f;
}

template <int KC, int VC, int HD>
__global__ void __launch_bounds__(kThreads, KC < 0 ? 2 : 3)
    attention_quant_decode_frag(const float* __restrict__ q, int64_t ldq, KvSide ks, KvSide vs, DeviceBatch b,
                                int n_kv_heads, int group, float scale, int split_len, int max_splits, int n_chunks,
                                bool direct, float* __restrict__ partials, float* __restrict__ out, int64_t ldo) {
  constexpr int KW = HD / 8;   // K words per key row of a lane (two per k-step)
  constexpr int VN = HD / 8;   // V words per key pair of a lane (one per n-block)
  constexpr int OLD = HD + 8;  // merge: shared O row stride in floats
  extern __shared__ __align__(16) unsigned char smem[];
  pdl_wait();  // every thread, first: see cuda_common.cuh
  pdl_trigger();
  const int seq = blockIdx.x, kvh = blockIdx.y / n_chunks, split = blockIdx.z;
  // This block's query rows t .. t + rows - 1 of the sequence (decode: its one row); the
  // block walks the keys of the longest.
  const QueryChunk qc = query_chunk(b, seq, blockIdx.y % n_chunks, group);
  if (qc.rows <= 0) return;  // a chunk past this sequence's rows
  const int t = qc.t, rows = qc.rows, len = qc.len, min_len = qc.min_len;
  const int begin = split * split_len;
  if (begin >= len) {  // the merge reads only the splits that hold keys
    if (direct)        // no keys at all and no merge: zeros, as the merge gives
      for (int i = threadIdx.x; i < rows * group * HD; i += kThreads)
        out[(t + i / (group * HD)) * ldo + static_cast<int64_t>(kvh * group) * HD + i % (group * HD)] = 0.0f;
    return;
  }
  const int end = min(len, begin + split_len);
  // Tiles wholly below every row's length skip the masks.
  const int end_all = min(min_len, begin + split_len);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int fr = lane >> 2, fc = lane & 3;
  // The keys of this split that fragment rows fr and fr + 8 see (their query rows' lengths).
  const int end_a = min(end, qc.row_len(fr / group)), end_b = min(end, qc.row_len((fr + 8) / group));
  const int head0 = kvh * group;
  const KvCodec kc = frag_codec(KC, ks.f), vc = frag_codec(VC, vs.f);
  const int k_row = static_cast<int>(ks.row_bytes), v_row = static_cast<int>(vs.row_bytes);
  const int k_meta = static_cast<int>(ks.meta_offset), v_meta = static_cast<int>(vs.meta_offset);
  const int k_code = kKeys * k_row, v_code = kKeys * v_row;  // swizzled bytes of a page

  const int32_t* table = b.block_tables + static_cast<int64_t>(seq) * b.max_blocks;
  const int n_tiles = (end - begin + kKeys - 1) / kKeys;
  const int my_tiles = warp < n_tiles ? (n_tiles - warp + kWarps - 1) / kWarps : 0;
  const int64_t stage_bytes = ks.page_bytes + vs.page_bytes;
  unsigned char* const ring = smem + warp * stage_bytes;  // stage j at ring + j · kWarps · stage_bytes
  // The block-table entry of local tile i (0 past the warp's last tile). Read kStages tiles
  // before its copy is issued: a dependent load right before the copies would stall the
  // warp for a loaded-memory round trip every tile.
  auto table_entry = [&](int i) { return i < my_tiles ? __ldg(table + (begin / kKeys + warp + i * kWarps)) : 0; };
  // Issues this warp's local tile i (global tile warp + 4i, block-table entry `entry`) into
  // stage i % kStages and commits a group (an empty one past the warp's last tile); codes
  // swizzled (kv_swz).
  auto issue = [&](int i, int entry) {
    if (i < my_tiles) {
      const int64_t page = static_cast<int64_t>(entry) * n_kv_heads + kvh;
      unsigned char* dst = ring + (i % kStages) * kWarps * stage_bytes;
      const unsigned char* kp = ks.base + page * ks.page_bytes;
      const unsigned char* vp = vs.base + page * vs.page_bytes;
      for (int o = 16 * lane; o < ks.page_bytes; o += 16 * 32) cp_async16(dst + (o < k_code ? kv_swz(o) : o), kp + o);
      dst += ks.page_bytes;
      for (int o = 16 * lane; o < vs.page_bytes; o += 16 * 32) cp_async16(dst + (o < v_code ? kv_swz(o) : o), vp + o);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(i, table_entry(i));
  int next_entry[2] = {table_entry(kStages - 1), table_entry(kStages)};  // tiles i + kStages - 1, i + kStages

  // Turbo codebooks: the lane's K slice is in the high-width half iff fc < 2, its V slice iff fr < 4.
  TurboBook kbook{}, vbook{};
  if (kc == KvCodec::Turbo) kbook = turbo_book(fc < 2 ? ks.code_hi : ks.code_lo);
  if (vc == KvCodec::Turbo) vbook = turbo_book(fr < 4 ? vs.code_hi : vs.code_lo);

  // Query heads (static K scale folded in; turbo keys: rotated into K's basis), then as A
  // fragments in K's channel order (base 2).
  float* Qs = reinterpret_cast<float*>(smem + (kStages - 1) * kWarps * stage_bytes);  // [16][HD]
  const float q_scale = scale * static_scale(ks, kvh, HD) * 1.4426950408889634f;
  {
    constexpr int kPer = 16 * HD / kThreads;  // every load first, then the stores (one round trip)
    float v[kPer];
#pragma unroll
    for (int r = 0; r < kPer; ++r) {
      // Tile row `row`: head row % group of query row t + row / group.
      const int i = threadIdx.x + r * kThreads, row = i / HD, d = i % HD;
      v[r] = row < rows * group
                 ? __ldg(q + (t + row / group) * ldq + static_cast<int64_t>(head0 + row % group) * HD + d)
                 : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < kPer; ++r) Qs[threadIdx.x + r * kThreads] = v[r] * q_scale;
  }
  // q' = R (q∘s), once; the score term of a first key stored around its own center (in
  // the scores' units: Qs carries turbo's 1/sqrt(hd), the decoded keys do not).
  __shared__ float first_s[16];
  if (kc == KvCodec::Turbo)
    kv_prepare_queries(ks, kvh, HD, Qs, HD, 16, rows * group, begin == 0 ? first_s : nullptr, sqrtf(HD));
  __syncthreads();
  uint32_t qf[HD / 16][4];
  {
    const float* r0 = Qs + fr * HD + fc * (HD / 4);
    const float* r1 = r0 + 8 * HD;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int a0 = kv_k_channel(kc, 2 * kk, 0, HD), a1 = kv_k_channel(kc, 2 * kk, 1, HD);
      const int b0 = kv_k_channel(kc, 2 * kk + 1, 0, HD), b1 = kv_k_channel(kc, 2 * kk + 1, 1, HD);
      qf[kk][0] = pack_half2(r0[a0], r0[a1]);
      qf[kk][1] = pack_half2(r1[a0], r1[a1]);
      qf[kk][2] = pack_half2(r0[b0], r0[b1]);
      qf[kk][3] = pack_half2(r1[b0], r1[b1]);
    }
  }
  __syncthreads();  // every warp holds its fragments before the staging's stage is filled

  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;
  const int kcb = fc * (HD / 4), vcb = fr * (HD / 8);  // the lane's first K / V channel
  for (int i = 0; i < my_tiles; ++i) {
    issue(i + kStages - 1, next_entry[0]);  // into the stage of tile i - 1, released by the __syncwarp ending i - 1
    next_entry[0] = next_entry[1];
    next_entry[1] = table_entry(i + kStages + 1);
    asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 1) : "memory");
    __syncwarp();
    const int key0 = begin + (warp + i * kWarps) * kKeys;
    const uint8_t* kpage = ring + (i % kStages) * kWarps * stage_bytes;
    const uint8_t* vpage = kpage + ks.page_bytes;
    // The tile's work; Masked: the split's last, partial tile (keys past the end). Full tiles,
    // nearly all of them, skip the masks' instructions.
    auto tile = [&](auto masked) {
      constexpr bool kMasked = decltype(masked)::value;

      // S = Q·Kᵀ: keys fr (n-block 0) and fr + 8 (n-block 1) of this lane; the even and odd
      // k-steps in separate accumulators (two chains of dependent mmas per n-block, not one).
      float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
      {
        float s2[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        uint32_t raw[2][KW], gs[2][HD / 32];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          kfrag_load<KC, HD>(ks.f, kpage, k_row, fr + 8 * r, kcb, raw[r]);
          kfrag_group_scales<KC, HD>(ks.f, kpage, k_meta, fr + 8 * r, kcb, gs[r]);
        }
        const uint8_t* chs = kpage + k_meta + 4 * kcb;  // KIVI: (scale, min) of the slice's channels
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk)
#pragma unroll
          for (int r = 0; r < 2; ++r)
            mma_f16(kk % 2 ? s2[r] : s[r], qf[kk], kfrag_word<KC, HD>(ks.f, raw[r], gs[r], chs, kbook, 2 * kk),
                    kfrag_word<KC, HD>(ks.f, raw[r], gs[r], chs, kbook, 2 * kk + 1));
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
          for (int e = 0; e < 4; ++e) s[r][e] += s2[r][e];
      }
      if (frag_token_scaled(KC, ks.f)) {  // s[n][e] is key n·8 + 2fc + (e & 1)
#pragma unroll
        for (int n = 0; n < 2; ++n) {
          const float2 k2 = __half22float2(u2h(lds32(kpage + k_meta + 2 * (8 * n + 2 * fc))));
          s[n][0] *= k2.x, s[n][1] *= k2.y, s[n][2] *= k2.x, s[n][3] *= k2.y;
        }
      }
      // The first key's term, in the scores' units (after turbo's per-token norm): s[0][0], s[0][2].
      if (kc == KvCodec::Turbo && key0 == 0 && fc == 0) {
        s[0][0] += first_s[fr];
        s[0][2] += first_s[fr + 8];
      }
      if constexpr (kMasked) {
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            if (key0 + n * 8 + 2 * fc + (e & 1) >= (e < 2 ? end_a : end_b)) s[n][e] = -INFINITY;
      }
      float c_a, c_b;
      online_softmax_step<2>(s, m_a, m_b, l_a, l_b, c_a, c_b);
      const uint32_t pa[4] = {pack_half2(s[0][0], s[0][1]), pack_half2(s[0][2], s[0][3]), pack_half2(s[1][0], s[1][1]),
                              pack_half2(s[1][2], s[1][3])};

      // O = O·c + P·V: key pairs (2fc, 2fc + 1) -> b0, (2fc + 8, 2fc + 9) -> b1. Keys past the
      // end are zeroed (P is 0 there, but 0 · NaN would poison O).
      uint32_t ra[2][HD / 16], rb[2][HD / 16], sc[2][HD / 64 > 0 ? HD / 64 : 1], mn[2][HD / 64 > 0 ? HD / 64 : 1],
          mask[2];
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const int a = 2 * fc + 8 * p;
        vfrag_load<VC, HD>(vs.f, vpage, v_row, a, vcb, ra[p], rb[p]);
        vfrag_scales<VC, HD>(vs.f, vpage, v_meta, a, vcb, sc[p], mn[p]);
        mask[p] = (key0 + a < end ? 0x0000ffffu : 0u) | (key0 + a + 1 < end ? 0xffff0000u : 0u);
      }
      const uint8_t* vch = vpage + v_meta + 4 * vcb;  // int4 per-channel V: (scale, min) of the lane's channels
      // Rescaled only when a row's max moved in some lane (rare after the first tiles).
      if (__any_sync(0xffffffffu, c_a != 1.0f || c_b != 1.0f)) {
#pragma unroll
        for (int n = 0; n < VN; ++n) {
          o[n][0] *= c_a;
          o[n][1] *= c_a;
          o[n][2] *= c_b;
          o[n][3] *= c_b;
        }
      }
#pragma unroll
      for (int n = 0; n < VN; ++n) {
        uint32_t b0 = vfrag_word<VC, HD>(vs.f, ra[0], rb[0], sc[0], mn[0], vch, vbook, n);
        uint32_t b1 = vfrag_word<VC, HD>(vs.f, ra[1], rb[1], sc[1], mn[1], vch, vbook, n);
        if constexpr (kMasked) b0 &= mask[0], b1 &= mask[1];
        mma_f16(o[n], pa, b0, b1);
      }
    };
    if (key0 + kKeys <= end_all)
      tile(std::false_type{});
    else
      tile(std::true_type{});
    __syncwarp();  // every lane done with this stage before it is refilled
  }
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");  // only empty groups can be pending here
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);

  // The 4 warps merged in a fixed order (a warp without tiles: m = -inf, adds nothing).
  __syncthreads();                             // the rings become the merge area
  float* so = reinterpret_cast<float*>(smem);  // [kWarps][16][OLD], channels in order
  float* sm = so + kWarps * 16 * OLD;          // [kWarps][16]
  float* sl = sm + kWarps * 16;                // [kWarps][16]
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = fr + 8 * half;
    if (fc == 0) {
      sm[warp * 16 + row] = half ? m_b : m_a;
      sl[warp * 16 + row] = half ? l_b : l_a;
    }
    float* dst = so + (warp * 16 + row) * OLD;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {  // column 2fc + e of n-block n: channel (2fc + e)·hd/8 + kv_v_channel(n)
      const int ch = kv_v_channel(vc, n, HD);
      dst[(2 * fc) * (HD / 8) + ch] = o[n][2 * half];
      dst[(2 * fc + 1) * (HD / 8) + ch] = o[n][2 * half + 1];
    }
  }
  __syncthreads();
  const int n_heads = n_kv_heads * group;
  const float v_scale = static_scale(vs, kvh, HD);
  for (int i = threadIdx.x; i < rows * group * HD; i += kThreads) {
    const int r = i / HD, d = i % HD;  // tile row r: head g of query row t + j
    const int j = r / group, g = r % group;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w * 16 + r]);
    float l = 0.0f, acc = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float mw = sm[w * 16 + r];
      if (mw == -INFINITY) continue;
      const float c = exp2f(mw - mx);
      l += sl[w * 16 + r] * c;
      acc += so[(w * 16 + r) * OLD + d] * c;
    }
    if (direct) {  // the whole context: normalized here, no merge kernel
      out[(t + j) * ldo + static_cast<int64_t>(head0 + g) * HD + d] = l > 0.0f ? acc * v_scale / l : 0.0f;
      continue;
    }
    // Per query row (a decode batch's row t is its sequence).
    float* p = partials + ((static_cast<int64_t>(t + j) * n_heads + head0 + g) * max_splits + split) * (HD + 2);
    p[2 + d] = acc * v_scale;
    if (d == 0) {
      p[0] = mx * 0.6931471805599453f;  // base 2 -> natural log units (the merge uses __expf)
      p[1] = l;
    }
  }
}

// Every instantiation has this type.
using FragKernel = decltype(&attention_quant_decode_frag<-1, -1, 128>);

// The instantiation for the layer's formats: the same-format pairs (and int4's KIVI pair)
// compiled for themselves; any other pair reads its formats at run time.
template <int HD>
FragKernel frag_kernel(const KvLayerView& kv) {
  const int kk = frag_key(kv.k_fmt.codec, kv.k_fmt.scale, kv.k_fmt.bits_hi, kv.k_fmt.bits_lo);
  const int vk = frag_key(kv.v_fmt.codec, kv.v_fmt.scale, kv.v_fmt.bits_hi, kv.v_fmt.bits_lo);
#define TESSERA_QDF(KC, KS, VC, VS)                                                         \
  if (kk == frag_key(KvCodec::KC, KvScale::KS) && vk == frag_key(KvCodec::VC, KvScale::VS)) \
    return &attention_quant_decode_frag<frag_key(KvCodec::KC, KvScale::KS), frag_key(KvCodec::VC, KvScale::VS), HD>;
  TESSERA_QDF(Fp8E4M3, Tensor, Fp8E4M3, Tensor)
  TESSERA_QDF(Fp8E4M3, Token, Fp8E4M3, Token)
  TESSERA_QDF(Fp8E5M2, Tensor, Fp8E5M2, Tensor)
  TESSERA_QDF(Fp8E5M2, Token, Fp8E5M2, Token)
  TESSERA_QDF(Int8, Token, Int8, Token)
  TESSERA_QDF(Int8, Group, Int8, Group)
  TESSERA_QDF(Int4, Channel, Int4, Group)
  TESSERA_QDF(Int4, Group, Int4, Group)
#undef TESSERA_QDF
#define TESSERA_QDT(HI, LO)                                                              \
  if (kk == frag_key(KvCodec::Turbo, KvScale::None, HI, LO) && vk == kk)                 \
    return &attention_quant_decode_frag<frag_key(KvCodec::Turbo, KvScale::None, HI, LO), \
                                        frag_key(KvCodec::Turbo, KvScale::None, HI, LO), HD>;
  TESSERA_QDT(3, 2)  // turbo2.5
  TESSERA_QDT(3, 3)  // turbo3
  TESSERA_QDT(4, 3)  // turbo3.5
  TESSERA_QDT(4, 4)  // turbo4
#undef TESSERA_QDT
  return &attention_quant_decode_frag<-1, -1, HD>;
}

// What the process knows of one instantiation: the largest dynamic shared memory opted into
// (the attribute is per function) and its blocks per SM at each size asked about (occupancy
// depends on the size; the same on every sm_90 device this process drives).
struct FragKernelState {
  FragKernel fn;
  size_t opted_in = 0;
  std::vector<std::pair<size_t, int>> blocks_per_sm;  // (shared memory, blocks)
};

// Guards every FragKernelState (launches and occupancy queries may come from several threads).
std::mutex& frag_state_mutex() {
  static std::mutex mu;
  return mu;
}
// The layer's kernel, its shared memory, and its state with that size opted into; called
// under frag_state_mutex().
std::tuple<FragKernel, size_t, FragKernelState*> frag_kernel_ready(const KvLayerView& kv) {
  const FragKernel fn = kv.head_dim == 64 ? frag_kernel<64>(kv) : frag_kernel<128>(kv);
  const size_t smem = kv.head_dim == 64 ? smem_bytes<64>(kv.k_page_bytes, kv.v_page_bytes)
                                        : smem_bytes<128>(kv.k_page_bytes, kv.v_page_bytes);
  static std::vector<FragKernelState> states;  // a few per process: one per format pair used
  auto it = std::find_if(states.begin(), states.end(), [&](const FragKernelState& st) { return st.fn == fn; });
  if (it == states.end()) it = states.insert(states.end(), FragKernelState{fn, 0, {}});
  if (it->opted_in < smem) {
    TESSERA_CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    it->opted_in = smem;
  }
  return {fn, smem, &*it};
}

// Codes swizzled by kv_swz stay inside the page's codes: a last, partial 128-byte line of
// n 16-byte chunks (turbo at head_dim 64: 320 or 448 bytes) must map chunks [0, n) onto
// themselves.
bool swizzle_fits(int64_t code_bytes) {
  const int n = static_cast<int>(code_bytes % 128 / 16), line = static_cast<int>(code_bytes / 128 % 8);
  if (code_bytes % 16 != 0) return false;
  for (int c = 0; c < n; ++c)
    if ((c ^ line) >= n) return false;
  return true;
}

bool frag_side_ok(const KvFormat& f, const KvLayerView& kv) {
  // f32 pages do not fit the rings; turbo keys with the QJL sketch: attention_quant_decode_mma.cu.
  return f.codec != KvCodec::F32 && !(f.codec == KvCodec::Turbo && f.qjl) &&
         swizzle_fits(kv_page_layout(f, kv.block_size, kv.head_dim).meta_offset);
}

}  // namespace

bool attention_quant_decode_frag_direct(const KvLayerView& kv, int max_splits) {
  return max_splits == 1 && kv.v_fmt.codec != KvCodec::Turbo;  // turbo values: the merge rotates them back
}

bool attention_quant_decode_frag_applies(const KvLayerView& kv, int n_heads) {
  // Blocks of 16 tokens: a tile is one page. Pages small enough for two blocks per SM.
  return (kv.head_dim == 64 || kv.head_dim == 128) && kv.block_size == kKeys && kv.n_kv_heads > 0 &&
         n_heads % kv.n_kv_heads == 0 && n_heads / kv.n_kv_heads <= 16 && frag_side_ok(kv.k_fmt, kv) &&
         frag_side_ok(kv.v_fmt, kv) && smem_bytes<128>(kv.k_page_bytes, kv.v_page_bytes) <= 112 * 1024;
}

void launch_attention_quant_decode_frag(const float* q, int64_t ldq, const KvLayerView& kv, const DeviceBatch& b,
                                        int n_heads, float scale, int split_len, int max_splits, float* partials,
                                        float* out, int64_t ldo, cudaStream_t s, int max_rows) {
  const int group = n_heads / kv.n_kv_heads;
  const int n_chunks = attention_decode_mma_chunks(group, max_rows);
  FragKernel fn;
  size_t smem;
  {
    std::lock_guard lock(frag_state_mutex());
    std::tie(fn, smem, std::ignore) = frag_kernel_ready(kv);
  }
  launch_pdl(fn, dim3(b.n_seqs, kv.n_kv_heads * n_chunks, max_splits), dim3(kThreads), smem, s, q, ldq,
             kv_side(kv, true), kv_side(kv, false), b, kv.n_kv_heads, group, scale, split_len, max_splits, n_chunks,
             attention_quant_decode_frag_direct(kv, max_splits), partials, out, ldo);
  TESSERA_CUDA_CHECK_LAUNCH("attention_quant_decode_frag");
}

int attention_quant_decode_frag_blocks_per_sm(const KvLayerView& kv) {
  std::lock_guard lock(frag_state_mutex());
  const auto [fn, smem, state] = frag_kernel_ready(kv);
  for (const auto& [size, blocks] : state->blocks_per_sm)
    if (size == smem) return blocks;
  int blocks = 0;
  TESSERA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, kThreads, smem));
  blocks = std::max(1, blocks);
  state->blocks_per_sm.emplace_back(smem, blocks);
  return blocks;
}

}  // namespace tessera::cuda
