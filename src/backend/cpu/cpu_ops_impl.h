#pragma once
// The CPU row kernels, written once as plain loops that the compiler vectorizes for the ISA
// of the translation unit including this file (cpu_ops_scalar.cpp, cpu_ops_avx2.cpp).
// Include only from those files, inside their own namespace (after including kv_codec.h,
// which this uses, outside it).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend/cpu/cpu_ops.h"
#include "core/fp16.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

// exp(x) for x <= 0 with ~1 ulp relative error: Cody-Waite reduction and a degree-6
// polynomial, branch-free so the loops around it vectorize.
static inline float fast_exp_nonpos(float x) {
  x = x < -87.0f ? -87.0f : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + magic) - magic;
  const float r = (x - n * 0.693145751953125f) - n * 1.428606765330187045e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t e = static_cast<int32_t>(n) + 127;
  uint32_t bits = static_cast<uint32_t>(e) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// dst[0..n) = src[offset .. offset + n) as f32, from F32 or F16 storage.
static inline void load_f32(const void* src, tessera::DType dtype, int64_t offset, int n, float* dst) {
  if (dtype == tessera::DType::F32) {
    std::memcpy(dst, static_cast<const float*>(src) + offset, sizeof(float) * n);
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(src) + offset;
  int i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h + i))));
#endif
  for (; i < n; ++i) dst[i] = tessera::fp16_to_f32(h[i]);
}

static void rms_norm_rows_impl(const float* x, const float* w, float* out, int64_t n_rows, int dim, float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* xr = x + r * dim;
    float* o = out + r * dim;
    float ss = 0.0f;
    for (int i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int i = 0; i < dim; ++i) o[i] = xr[i] * inv * w[i];
  }
}

static void add_rms_norm_rows_impl(float* x, const float* residual, const float* w, float* out, int64_t n_rows, int dim,
                                   float eps) {
  for (int64_t r = 0; r < n_rows; ++r) {
    float* xr = x + r * dim;
    const float* rr = residual + r * dim;
    float ss = 0.0f;
    for (int i = 0; i < dim; ++i) {
      xr[i] += rr[i];
      ss += xr[i] * xr[i];
    }
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    float* o = out + r * dim;
    for (int i = 0; i < dim; ++i) o[i] = xr[i] * inv * w[i];
  }
}

static void swiglu_rows_impl(const float* gate, const float* up, int64_t ld_in, float* out, int64_t n_rows, int dim) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* g = gate + r * ld_in;
    const float* u = up + r * ld_in;
    float* o = out + r * dim;
    for (int i = 0; i < dim; ++i) {
      // silu(g) = g / (1 + e^-g), with e^-|g| from the branch-free exp
      const float e = fast_exp_nonpos(-std::fabs(g[i]));
      const float sig = g[i] >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
      o[i] = g[i] * sig * u[i];
    }
  }
}

// gelu_tanh(g) * u, gelu_tanh(g) = g/2 * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3))), with
// tanh(|a|) = (1 - e^-2|a|) / (1 + e^-2|a|) from the branch-free exp
static void geglu_rows_impl(const float* gate, const float* up, int64_t ld_in, float* out, int64_t n_rows, int dim) {
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* g = gate + r * ld_in;
    const float* u = up + r * ld_in;
    float* o = out + r * dim;
    for (int i = 0; i < dim; ++i) {
      const float x = g[i];
      const float a = 0.7978845608028654f * (x + 0.044715f * x * x * x);
      const float e = fast_exp_nonpos(-2.0f * std::fabs(a));
      const float t = (1.0f - e) / (1.0f + e);
      o[i] = 0.5f * x * (1.0f + (a >= 0 ? t : -t)) * u[i];
    }
  }
}

static void rope_rows_impl(float* x, int64_t n_rows, int64_t ld, int n_heads, int head_dim, int rot_dim, bool neox,
                           const float* const* cos_sin_rows) {
  const int half = rot_dim / 2;
  for (int64_t r = 0; r < n_rows; ++r) {
    const float* c = cos_sin_rows[r];
    const float* s = c + half;
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + r * ld + static_cast<int64_t>(h) * head_dim;
      if (neox) {
        for (int i = 0; i < half; ++i) {
          const float a = v[i], b = v[i + half];
          v[i] = a * c[i] - b * s[i];
          v[i + half] = a * s[i] + b * c[i];
        }
      } else {
        for (int i = 0; i < half; ++i) {
          const float a = v[2 * i], b = v[2 * i + 1];
          v[2 * i] = a * c[i] - b * s[i];
          v[2 * i + 1] = a * s[i] + b * c[i];
        }
      }
    }
  }
}

// Dot product with 8 independent partial sums: the compiler keeps them in one vector
// register, where a single running sum would be a serial chain of scalar FMAs.
// The 8 partial sums of a dot product, added in the one order every attention path uses.
static inline float sum8(const float* a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

static inline float dot_f32(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int d = 0;
  for (; d + 8 <= n; d += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[d + k] * b[d + k];
  float sum = sum8(acc);
  for (; d < n; ++d) sum += a[d] * b[d];
  return sum;
}

#include "backend/cpu/kv_decode_simd.h"

// One page's first n tokens as f32 rows (plain formats through the F16C path, quantized ones
// through the AVX2 decoders where this build has them).
static inline void decode_page(const tessera::KvFormat& f, const tessera::KvPageLayout& l, int hd,
                               const tessera::KvHeadConstants& c, const uint8_t* page, int n, float* out) {
  if (f.is_plain())
    load_f32(page, f.plain_dtype(), 0, n * hd, out);
  else if (!simd_decode_rows(f, l, hd, c, page, n, out))
    tessera::kv_decode_rows(f, l, hd, c, page, n, out);
}

// Position-aware key centering's tables for one call: tab[j * hd + c] = cos / sin of j·θ for the
// block offsets j < bs ([cos half | sin half], kv_rope_angles' layout) and step = e^{i·bs·θ}
// (one block's turn), by products in double from e^{i·θ} (two trigonometric calls per pair).
static inline void rope_block_tables(const tessera::KvHeadConstants& kc, int bs, int hd, float* tab, double* step) {
  const int half = kc.rope_dim / 2;
  for (int i = 0; i < half; ++i) {
    const double a = static_cast<double>(kc.rope_freq[i]), c1 = std::cos(a), s1 = std::sin(a);
    double c = 1.0, s = 0.0;
    for (int j = 0; j < bs; ++j) {
      tab[j * hd + i] = static_cast<float>(c);
      tab[j * hd + half + i] = static_cast<float>(s);
      const double cn = c * c1 - s * s1;
      s = s * c1 + c * s1;
      c = cn;
    }
    step[i] = c;
    step[half + i] = s;
  }
}

// FlashAttention-style: for a tile of query rows of one sequence and one KV head (all the
// query heads of its group at once, so each K/V block is read once), walk the sequence's
// blocks in order keeping a running max m, sum l and unnormalized output O per query vector.
// Each page is decoded into an L1-sized tile right before use (no dequantized cache). Turbo
// keys: queries are rotated once (q' = R q, and S q' for the QJL term); turbo values: O is
// accumulated in V's rotated basis and rotated back once at the end.
static void attention_impl(const float* q, int64_t ldq, const tessera::KvLayerView& kv,
                           const tessera::AttentionBatch& b, int n_heads, float scale, float* out, int64_t ldo,
                           const tessera::cpu::AttentionTask& task, float* scratch) {
  using tessera::KvCodec;
  const int hd = kv.head_dim, bs = kv.block_size;
  const int group = n_heads / kv.n_kv_heads;
  const int g0 = task.g_begin, ng = (task.g_end < 0 ? group : task.g_end) - g0;  // query heads of the task
  const int n_q = (task.q_end - task.q_begin) * ng;                              // query vectors in this tile
  float* kf = scratch;                                                           // [bs, hd]
  float* vf = kf + bs * hd;                                                      // [bs, hd]
  float* sgn = vf + bs * hd;                                                     // [bs, hd] QJL signs
  float* sc = sgn + bs * hd;                                                     // [n_q, bs]
  float* o = sc + n_q * bs;                                                      // [n_q, hd]
  float* m = o + n_q * hd;                                                       // [n_q]
  float* l = m + n_q;                                                            // [n_q]
  float* qs = l + n_q;                                                           // [n_q, hd] queries pre-scaled
  float* sq = qs + n_q * hd;                                                     // [n_q, hd] S·q' (QJL)
  float* coef = sq + n_q * hd;                                                   // [bs]
  float* rot = coef + bs;                                                        // [hd]
  float* qp = rot + hd;                                                          // [n_q, hd] queries, model basis
  float* cm = qp + n_q * hd;                                                     // [bs, hd] R(p)·m per key
  float* tab = cm + bs * hd;                                                     // [bs, hd] cos/sin of j·θ
  float* mb = tab + bs * hd;                                                     // [hd] R(block start)·m
  float* cs = mb + hd;                                                           // [hd] cos/sin
  const tessera::KvPageLayout kl = tessera::kv_page_layout(kv.k_fmt, bs, hd);
  const tessera::KvPageLayout vl = tessera::kv_page_layout(kv.v_fmt, bs, hd);
  const tessera::KvHeadConstants kc =
      tessera::kv_head_constants(kv.k_fmt, kv.k_consts, kv.n_kv_heads, hd, task.kv_head);
  const tessera::KvHeadConstants vc =
      tessera::kv_head_constants(kv.v_fmt, kv.v_consts, kv.n_kv_heads, hd, task.kv_head);
  const bool k_turbo = kv.k_fmt.codec == KvCodec::Turbo, qjl = k_turbo && kv.k_fmt.qjl;
  // Position-aware key centering: keys are stored as k − R(p)·m, so each score gets q·R(p)·m
  // back (it differs between keys: the softmax would not drop it). R(base + j) = R(j)·R(base):
  // the rotations of a block's offsets j are tabulated once.
  const bool rope_center = kc.rope_dim > 0;
  const int rope_half = kc.rope_dim / 2;
  double rope_step[256], rope_at[256];  // e^{i·bs·θ} and e^{i·base·θ}: [cos half | sin half]
  bool rope_started = false;
  // The key at position 0 centered on its own calibrated center: its score gets q·first back
  // (position-aware: in place of q·R(0)·m; static: in place of the dropped q·μ).
  const bool first_center = kc.first != nullptr;
  if (rope_center) rope_block_tables(kc, bs, hd, tab, rope_step);
  for (int r = 0; r < n_q; ++r) {
    const int t = task.q_begin + r / ng, g = g0 + r % ng;
    const float* src = q + t * ldq + static_cast<int64_t>(task.kv_head * group + g) * hd;
    float* qr = qs + r * hd;
    for (int d = 0; d < hd; ++d) qr[d] = src[d] * scale;
    if (rope_center || first_center) std::memcpy(qp + r * hd, qr, sizeof(float) * hd);
    if (k_turbo) {
      tessera::turbo_rotate(qr, kc.signs, hd, rot);
      std::memcpy(qr, rot, sizeof(float) * hd);
      if (qjl)
        for (int i = 0; i < hd; ++i) sq[r * hd + i] = dot_f32(kc.qjl + static_cast<int64_t>(i) * hd, qr, hd);
    }
    m[r] = -std::numeric_limits<float>::infinity();
    l[r] = 0.0f;
  }
  std::memset(o, 0, sizeof(float) * n_q * hd);
  int max_pos = 0, min_pos = std::numeric_limits<int>::max();
  for (int t = task.q_begin; t < task.q_end; ++t) {
    max_pos = std::max(max_pos, b.positions[t]);
    min_pos = std::min(min_pos, b.positions[t]);
  }
  const int kv_len = std::min(b.kv_len[task.seq], max_pos + 1);
  const int n_blocks = (kv_len + bs - 1) / bs;
  // Sliding window: blocks wholly before every row's window are not read.
  const int first_blk = b.window > 0 ? std::max(0, min_pos - b.window + 1) / bs : 0;
  const int32_t* table = b.block_tables + static_cast<int64_t>(task.seq) * b.max_blocks;
  const auto* kbase = static_cast<const uint8_t*>(kv.k);
  const auto* vbase = static_cast<const uint8_t*>(kv.v);
  auto page_of = [&](int blk) { return static_cast<int64_t>(table[blk]) * kv.n_kv_heads + task.kv_head; };
  const int blk_end = std::min(n_blocks, task.blk_end);
  for (int blk = std::max(first_blk, task.blk_begin); blk < blk_end; ++blk) {
    const int base = blk * bs;
    const int nk = std::min(bs, kv_len - base);
    const uint8_t* kpage = kbase + page_of(blk) * kv.k_page_bytes;
    const uint8_t* vpage = vbase + page_of(blk) * kv.v_page_bytes;
    // The KV of a decode step is cold (the weights streamed through the caches since the
    // layer's last step): ask for the next block while this one is computed.
    if (blk + 1 < blk_end) {
      const uint8_t* nk_ptr = kbase + page_of(blk + 1) * kv.k_page_bytes;
      const uint8_t* nv_ptr = vbase + page_of(blk + 1) * kv.v_page_bytes;
      for (int64_t byte = 0; byte < kv.k_page_bytes; byte += 64) __builtin_prefetch(nk_ptr + byte);
      for (int64_t byte = 0; byte < kv.v_page_bytes; byte += 64) __builtin_prefetch(nv_ptr + byte);
    }
    decode_page(kv.k_fmt, kl, hd, kc, kpage, nk, kf);
    decode_page(kv.v_fmt, vl, hd, vc, vpage, nk, vf);
    if (qjl && !simd_decode_qjl(kl, hd, kpage, nk, sgn, coef)) tessera::kv_decode_qjl(kl, hd, kpage, nk, sgn, coef);
    if (rope_center) {
      // e^{i·base·θ} in double: from the angles at the first block read, then one block's step
      // at a time (trigonometry per block was a third of a 2k-context decode step).
      if (!rope_started) {
        for (int i = 0; i < rope_half; ++i) {
          const double a = static_cast<double>(base) * static_cast<double>(kc.rope_freq[i]);
          rope_at[i] = std::cos(a);
          rope_at[rope_half + i] = std::sin(a);
        }
        rope_started = true;
      } else {
        for (int i = 0; i < rope_half; ++i) {
          const double c = rope_at[i], sn = rope_at[rope_half + i];
          rope_at[i] = c * rope_step[i] - sn * rope_step[rope_half + i];
          rope_at[rope_half + i] = sn * rope_step[i] + c * rope_step[rope_half + i];
        }
      }
      for (int i = 0; i < kc.rope_dim; ++i) cs[i] = static_cast<float>(rope_at[i]);
      tessera::kv_rope_apply(kc.mean, cs, kc.rope_dim, kc.rope_neox, hd, mb);
      for (int j = 0; j < nk; ++j) tessera::kv_rope_apply(mb, tab + j * hd, kc.rope_dim, kc.rope_neox, hd, cm + j * hd);
      if (first_center && base == 0) std::memcpy(cm, kc.first, sizeof(float) * hd);
    }
    for (int r = 0; r < n_q; ++r) {
      const int pos = b.positions[task.q_begin + r / ng];
      const int visible = std::min(nk, pos - base + 1);  // causal: keys at positions <= pos
      // Tree verification: bit i of `hidden` hides the key at block offset tree_lo + i (the
      // key of the sequence's row i, not an ancestor of this row).
      const uint32_t hidden = b.tree_mask ? ~b.tree_mask[task.q_begin + r / ng] : 0u;
      const int tree_lo = hidden ? b.positions[b.q_start[task.seq]] - base : 0;
      const auto is_hidden = [&](int j) {
        const int i = j - tree_lo;
        return i >= 0 && i < 32 && ((hidden >> i) & 1u);
      };
      // window: keys at positions >= pos - window + 1
      const int lo = b.window > 0 ? std::max(0, pos - b.window + 1 - base) : 0;
      if (visible <= lo) continue;
      float* s = sc + r * bs;
      const float* qr = qs + r * hd;
      float mx = m[r];
      int j0 = lo;
#if defined(__AVX2__) && defined(__FMA__)
      // Four keys at a time, each its own accumulator: four independent FMA chains instead of
      // one chain of hd / 8 dependent FMAs per key, reduced as dot_f32 reduces.
      if (hd % 8 == 0)
        for (; j0 + 4 <= visible; j0 += 4) {
          __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
          for (int d = 0; d < hd; d += 8) {
            const __m256 qv = _mm256_loadu_ps(qr + d);
            for (int u = 0; u < 4; ++u) acc[u] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kf + (j0 + u) * hd + d), acc[u]);
          }
          for (int u = 0; u < 4; ++u) {
            alignas(32) float a[8];
            _mm256_store_ps(a, acc[u]);
            s[j0 + u] = sum8(a);
          }
        }
#endif
      for (int j = j0; j < visible; ++j) s[j] = dot_f32(qr, kf + j * hd, hd);
      for (int j = lo; j < visible; ++j) {
        float dot = s[j];
        if (qjl) dot += coef[j] * dot_f32(sq + r * hd, sgn + j * hd, hd);
        if (rope_center)
          dot += dot_f32(qp + r * hd, cm + j * hd, hd);
        else if (first_center && base + j == 0)
          dot += dot_f32(qp + r * hd, kc.first, hd) - dot_f32(qp + r * hd, kc.mean, hd);
        s[j] = dot;
        if (!hidden || !is_hidden(j)) mx = std::max(mx, dot);
      }
      const float alpha = fast_exp_nonpos(m[r] - mx);  // m = -inf on the first block: alpha = 0
      float sum = 0.0f;
      for (int j = lo; j < visible; ++j) {
        s[j] = fast_exp_nonpos(s[j] - mx);
        sum += s[j];
      }
      if (hidden) {  // exactly zero, as if the key were not there (the sum again, in key order)
        sum = 0.0f;
        for (int j = lo; j < visible; ++j) {
          if (is_hidden(j)) s[j] = 0.0f;
          sum += s[j];
        }
      }
      l[r] = l[r] * alpha + sum;
      m[r] = mx;
      float* orow = o + r * hd;
      // o = o * alpha + P·V, 8 columns at a time held in a register across the keys (a
      // key-outer loop would load and store the whole output row once per key). Intrinsics in
      // the AVX2 build: written as a loop of 8 scalars, GCC kept it scalar (one FMA per
      // element); the same fused multiply-adds in the same order either way.
      int d0 = 0;
#if defined(__AVX2__) && defined(__FMA__)
      // 64 columns per pass, 8 accumulators: their FMAs per key are independent chains (one
      // column group at a time waited the FMA latency per key). Same FMAs, same order.
      for (; d0 + 64 <= hd; d0 += 64) {
        __m256 acc[8];
        for (int c = 0; c < 8; ++c) acc[c] = _mm256_mul_ps(_mm256_loadu_ps(orow + d0 + 8 * c), _mm256_set1_ps(alpha));
        for (int j = lo; j < visible; ++j) {
          const __m256 p = _mm256_set1_ps(s[j]);
          const float* vr = vf + j * hd + d0;
          for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + 8 * c), acc[c]);
        }
        for (int c = 0; c < 8; ++c) _mm256_storeu_ps(orow + d0 + 8 * c, acc[c]);
      }
      for (; d0 + 8 <= hd; d0 += 8) {
        __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(orow + d0), _mm256_set1_ps(alpha));
        for (int j = lo; j < visible; ++j)
          acc = _mm256_fmadd_ps(_mm256_set1_ps(s[j]), _mm256_loadu_ps(vf + j * hd + d0), acc);
        _mm256_storeu_ps(orow + d0, acc);
      }
#endif
      for (; d0 + 8 <= hd; d0 += 8) {
        float acc[8];
        for (int k = 0; k < 8; ++k) acc[k] = orow[d0 + k] * alpha;
        for (int j = lo; j < visible; ++j) {
          const float p = s[j];
          const float* vr = vf + j * hd + d0;
          for (int k = 0; k < 8; ++k) acc[k] += p * vr[k];
        }
        for (int k = 0; k < 8; ++k) orow[d0 + k] = acc[k];
      }
      for (; d0 < hd; ++d0) {
        float acc = orow[d0] * alpha;
        for (int j = lo; j < visible; ++j) acc += s[j] * vf[j * hd + d0];
        orow[d0] = acc;
      }
    }
  }
  if (task.partial) {  // a split of the keys: CpuBackend merges the splits
    for (int r = 0; r < n_q; ++r) {
      float* p = task.partial + static_cast<int64_t>(r) * (hd + 2);
      std::memcpy(p, o + r * hd, sizeof(float) * hd);
      p[hd] = m[r];
      p[hd + 1] = l[r];
    }
    return;
  }
  for (int r = 0; r < n_q; ++r) {
    const int t = task.q_begin + r / ng, g = g0 + r % ng;
    float* dst = out + t * ldo + static_cast<int64_t>(task.kv_head * group + g) * hd;
    float* orow = o + r * hd;
    if (kv.v_fmt.codec == KvCodec::Turbo) tessera::turbo_unrotate(orow, vc.signs, hd);
    const float inv = l[r] > 0 ? 1.0f / l[r] : 0.0f;
    for (int d = 0; d < hd; ++d) dst[d] = orow[d] * inv;
  }
}

static const tessera::cpu::OpsTable kOpsTable = {
    TESSERA_OPS_ISA, rms_norm_rows_impl, add_rms_norm_rows_impl, swiglu_rows_impl,
    rope_rows_impl,  attention_impl,     geglu_rows_impl,
};
