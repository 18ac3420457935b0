// Quantized KV formats on CUDA against the CPU backend (the reference encoder of
// kv_codec.cpp and the fused CPU attention): every format's kv_store bytes, written in two
// steps (a prefill with partial blocks, then a chunk or one decode row per sequence, so the
// per-channel int4 keys re-code pages), and the CUDA attention (prefill, chunked prefill,
// decode batches, GQA) over the CPU's own pages against the CPU's attention over them.
// The store is meant to be bit-exact (the same operations in the same order; measured: every
// format equal on these cases); the check allows rare single codes (0.2% of the bytes) where
// an f32 rounding could land the other way (fp8's hardware conversion against the host's, a
// QJL sign of a dot product near zero). TESSERA_CUDA_BENCH_KVQ=1 adds the decode-attention benchmark of
// docs/benchmarks/kv-quant-gpu.md. Skipped in builds without CUDA.
#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <sstream>
#include <string>

#include "backend/kv_codec.h"
#include "cuda_test_util.h"
#include "kv/kv_cache.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

const char* const kFormats[] = {"fp8_e4m3",   "fp8_e5m2",     "fp8_e4m3:head", "fp8_e5m2:token", "int8",
                                "int8:g16",   "int4",         "int4:g16",      "int4:g32",       "turbo2.5:qjl",
                                "turbo3:qjl", "turbo3.5:qjl", "turbo4:qjl",    "turbo2.5",       "turbo3",
                                "turbo3.5",   "turbo4"};

struct Seq {
  int past, add;  // tokens stored in step 1, tokens (query rows) of step 2
};

struct Case {
  std::string k_fmt, v_fmt;
  int block_size, n_kv_heads, group, head_dim;
  std::vector<Seq> seqs;
  std::vector<int16_t> tree = {};  // a draft tree over the last sequence's rows (HostBatch::set_tree)
};

// Rows with a few large channels (as keys have) and an occasional huge token.
std::vector<float> outlier_rows(size_t n_rows, int width, std::mt19937& rng) {
  std::vector<float> v = randn(n_rows * width, rng);
  for (size_t j = 0; j < n_rows; ++j) {
    for (int c = 0; c < width; c += 17) v[j * width + c] *= 12.0f;
    if (j % 11 == 3) v[j * width + (j % width)] = 80.0f;
  }
  return v;
}

KvCacheSpec spec_of(const Case& c, int n_blocks) {
  KvCacheSpec spec = KvCacheSpec::plain(1, c.n_kv_heads, c.head_dim, c.block_size, n_blocks, DType::F16);
  spec.k_format = parse_kv_format(c.k_fmt, true);
  spec.v_format = parse_kv_format(c.v_fmt, false);
  if (spec.k_format.static_scale()) spec.k_scales = {std::vector<float>(c.n_kv_heads, 0.05f)};
  if (spec.v_format.static_scale()) spec.v_scales = {std::vector<float>(c.n_kv_heads, 0.01f)};
  if (spec.k_format.centers_keys()) {  // calibrated key means and equalization: (k − μ)/s stored, q∘s read
    std::vector<float> mean(static_cast<size_t>(c.n_kv_heads) * c.head_dim), equal(mean.size(), 1.0f);
    for (size_t i = 0; i < mean.size(); ++i) {
      mean[i] = 0.75f * static_cast<float>(static_cast<int>(i * 7 % 13) - 6);
      if ((i % c.head_dim) % 17 == 0) equal[i] = std::sqrt(12.0f);  // outlier_rows' wide channels
    }
    spec.k_mean = {mean};
    spec.k_equal = {equal};
    // The key at position 0 around its own center, far from μ (an attention sink's offset).
    std::vector<float> first(mean);
    for (size_t i = 0; i < first.size(); ++i) first[i] += 4.0f * std::sin(0.37f * static_cast<float>(i));
    spec.k_first = {first};
  }
  return spec;
}

// In place, in float64: x <- H x / sqrt(n), H the Walsh–Hadamard matrix as its entries
// H[i][j] = (-1)^popcount(i & j) (not the butterflies of kv_codec.h: an independent check).
void hadamard_f64(std::vector<double>& x) {
  const size_t n = x.size();
  std::vector<double> y(n, 0.0);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) y[i] += (std::popcount(i & j) % 2 ? -x[j] : x[j]);
  for (size_t i = 0; i < n; ++i) x[i] = y[i] / std::sqrt(static_cast<double>(n));
}

// Decode attention (one query row per sequence) in float64 over the pages as the host codec
// decodes them (kv_decode_rows: the exact stored values). Turbo keys meet the query rotated
// in float64, q' = H (q∘signs)/sqrt(hd) (signs = D∘s, equalized keys included); turbo values
// are accumulated in V's rotated basis and rotated back, x = signs∘(H o)/sqrt(hd). Keys with
// the QJL sketch are left to the CPU backend's reference (kv_decode_rows has no sketch term):
// empty then.
std::vector<double> decode_reference_f64(const KvLayerView& l, const HostBatch& hb, const std::vector<float>& q,
                                         int64_t ldq, int n_heads, float scale, int64_t ldo) {
  if (l.k_fmt.qjl) return {};
  const int hd = l.head_dim, bs = l.block_size, group = n_heads / l.n_kv_heads;
  const KvPageLayout kl = kv_page_layout(l.k_fmt, bs, hd), vl = kv_page_layout(l.v_fmt, bs, hd);
  std::vector<double> ref(static_cast<size_t>(hb.positions.size()) * ldo, 0.0);
  std::vector<float> kr, vr;
  for (size_t s = 0; s < hb.kv_len.size(); ++s) {
    const int t = hb.q_start[s], len = std::min(hb.kv_len[s], hb.positions[t] + 1);
    kr.assign(static_cast<size_t>(len) * hd, 0.0f);
    vr.assign(kr.size(), 0.0f);
    for (int h = 0; h < l.n_kv_heads; ++h) {
      const KvHeadConstants kc = kv_head_constants(l.k_fmt, l.k_consts, l.n_kv_heads, hd, h);
      const KvHeadConstants vc = kv_head_constants(l.v_fmt, l.v_consts, l.n_kv_heads, hd, h);
      for (int b = 0; b * bs < len; ++b) {  // [len, hd] rows of K and V
        const int64_t page = static_cast<int64_t>(hb.tables[s * hb.max_blocks + b]) * l.n_kv_heads + h;
        const int n = std::min(bs, len - b * bs);
        kv_decode_rows(l.k_fmt, kl, hd, kc, static_cast<const uint8_t*>(l.k) + page * l.k_page_bytes, n,
                       kr.data() + static_cast<size_t>(b) * bs * hd);
        kv_decode_rows(l.v_fmt, vl, hd, vc, static_cast<const uint8_t*>(l.v) + page * l.v_page_bytes, n,
                       vr.data() + static_cast<size_t>(b) * bs * hd);
      }
      for (int g = 0; g < group; ++g) {
        const int head = h * group + g;
        std::vector<double> qv(hd), o(hd, 0.0), sc(len);
        for (int d = 0; d < hd; ++d) qv[d] = q[t * ldq + static_cast<int64_t>(head) * hd + d];
        if (l.k_fmt.codec == KvCodec::Turbo) {
          for (int d = 0; d < hd; ++d) qv[d] *= kc.signs[d];
          hadamard_f64(qv);
        }
        // The first key stored as k − first: q·(first − μ) back (q·μ is common to every key).
        double first_term = 0.0;
        if (kc.first)
          for (int d = 0; d < hd; ++d)
            first_term += static_cast<double>(q[t * ldq + static_cast<int64_t>(head) * hd + d]) *
                          (static_cast<double>(kc.first[d]) - kc.mean[d]);
        double mx = -1e300, sum = 0.0;
        for (int j = 0; j < len; ++j) {
          double dot = j == 0 ? first_term : 0.0;
          for (int d = 0; d < hd; ++d) dot += qv[d] * kr[static_cast<size_t>(j) * hd + d];
          sc[j] = dot * scale;
          mx = std::max(mx, sc[j]);
        }
        for (int j = 0; j < len; ++j) {
          const double p = std::exp(sc[j] - mx);
          sum += p;
          for (int d = 0; d < hd; ++d) o[d] += p * vr[static_cast<size_t>(j) * hd + d];
        }
        for (double& v : o) v /= sum;
        if (l.v_fmt.codec == KvCodec::Turbo) {
          hadamard_f64(o);
          for (int d = 0; d < hd; ++d) o[d] *= vc.signs[d];
        }
        for (int d = 0; d < hd; ++d) ref[t * ldo + static_cast<int64_t>(head) * hd + d] = o[d];
      }
    }
  }
  return ref;
}

// Differing bytes between two buffers.
size_t count_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
  return n;
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(c.k_fmt + "/" + c.v_fmt + " hd " + std::to_string(c.head_dim) + " bs " + std::to_string(c.block_size));
  std::mt19937 rng(seed);
  auto gpu = make_cuda();
  auto cpu = make_cpu();
  const int hd = c.head_dim, bs = c.block_size, n_heads = c.n_kv_heads * c.group;
  const int64_t kvd = static_cast<int64_t>(c.n_kv_heads) * hd, qd = static_cast<int64_t>(n_heads) * hd;
  std::vector<std::vector<int32_t>> tables;
  int n_blocks = 3, max_blocks = 0;
  for (const Seq& s : c.seqs) {
    tables.emplace_back((s.past + s.add + bs - 1) / bs);
    n_blocks += static_cast<int>(tables.back().size());
    max_blocks = std::max(max_blocks, static_cast<int>(tables.back().size()));
  }
  std::vector<int32_t> perm(n_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  for (auto& t : tables)
    for (auto& b : t) b = perm[next++];
  const KvCacheSpec spec = spec_of(c, n_blocks);
  KvCache ccache(*cpu, spec), gcache(*gpu, spec);
  const KvLayerView cl = ccache.layer(0), gl = gcache.layer(0);
  const size_t kbytes = static_cast<size_t>(n_blocks) * c.n_kv_heads * cl.k_page_bytes;
  const size_t vbytes = static_cast<size_t>(n_blocks) * c.n_kv_heads * cl.v_page_bytes;
  std::vector<uint8_t> zeros(std::max(kbytes, vbytes), 0);
  std::memset(cl.k, 0, kbytes);
  std::memset(cl.v, 0, vbytes);
  gpu->copy_to_device(gl.k, zeros.data(), kbytes);
  gpu->copy_to_device(gl.v, zeros.data(), vbytes);

  // Step 1 stores [0, past), step 2 [past, past + add) and attends with those rows.
  auto batch = [&](bool step2) {
    HostBatch hb;
    hb.max_blocks = max_blocks;
    hb.q_start.push_back(0);
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      const int b = step2 ? c.seqs[s].past : 0, e = step2 ? c.seqs[s].past + c.seqs[s].add : c.seqs[s].past;
      for (int i = b; i < e; ++i) {
        hb.positions.push_back(i);
        hb.slots.push_back(tables[s][i / bs] * bs + i % bs);
      }
      hb.q_start.push_back(static_cast<int32_t>(hb.positions.size()));
      hb.kv_len.push_back(e);
      std::vector<int32_t> row(tables[s]);
      row.resize(max_blocks, 0);
      hb.tables.insert(hb.tables.end(), row.begin(), row.end());
    }
    return hb;
  };
  std::vector<uint8_t> gk(kbytes), gv(vbytes);
  for (int step = 0; step < 2; ++step) {
    const HostBatch hb = batch(step == 1);
    const int n = static_cast<int>(hb.positions.size());
    if (n == 0) continue;
    const auto k = outlier_rows(n, static_cast<int>(kvd), rng);
    const auto v = randn(static_cast<size_t>(n) * kvd, rng);
    cpu->kv_store(cl, k.data(), kvd, v.data(), kvd, hb.view());
    DeviceVec<float> dk(*gpu, k), dv(*gpu, v);
    gpu->kv_store(gl, dk.get(), kvd, dv.get(), kvd, hb.device_view(*gpu));
    gpu->copy_to_host(gk.data(), gl.k, kbytes);
    gpu->copy_to_host(gv.data(), gl.v, vbytes);
    const std::vector<uint8_t> ck(static_cast<uint8_t*>(cl.k), static_cast<uint8_t*>(cl.k) + kbytes);
    const std::vector<uint8_t> cv(static_cast<uint8_t*>(cl.v), static_cast<uint8_t*>(cl.v) + vbytes);
    size_t written = 0;
    for (const Seq& s : c.seqs) written += static_cast<size_t>(s.past + s.add) * kvd;  // ~bytes at 8 bits
    const size_t dk_n = count_diff(gk, ck), dv_n = count_diff(gv, cv);
    EXPECT_LE(dk_n, 2 + written / 500) << "K bytes differing after step " << step + 1;
    EXPECT_LE(dv_n, 2 + written / 500) << "V bytes differing after step " << step + 1;
    if (dk_n + dv_n > 0)
      std::printf("  %s/%s step %d: %zu K, %zu V bytes differ\n", c.k_fmt.c_str(), c.v_fmt.c_str(), step + 1, dk_n,
                  dv_n);
  }
  // Attention over the same pages: the CPU's bytes into the GPU cache.
  gpu->copy_to_device(gl.k, cl.k, kbytes);
  gpu->copy_to_device(gl.v, cl.v, vbytes);
  HostBatch hb = batch(true);
  if (!c.tree.empty()) hb.set_tree(c.tree);
  const int n = static_cast<int>(hb.positions.size());
  const int64_t ldq = qd + 4, ldo = qd + 8;
  const auto q = randn(static_cast<size_t>(n) * ldq, rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::vector<float> ref(static_cast<size_t>(n) * ldo, 0.0f);
  cpu->attention(q.data(), ldq, cl, hb.view(), n_heads, scale, ref.data(), ldo);
  DeviceVec<float> dq(*gpu, q), dout(*gpu, std::vector<float>(ref.size(), 0.0f));
  gpu->attention(dq.get(), ldq, gl, hb.device_view(*gpu), n_heads, scale, dout.get(), ldo);
  const std::vector<float> got = dout.read();
  // Prefill, and decode at head_dim 64/128, up to 16 query heads per KV head and blocks of 16,
  // run on the tensor cores (decoded K/V, Q and P rounded to f16: measured up to 1.1e-3 on
  // these outlier-heavy keys, against ~2e-4 for the f16 kernel on unit-normal ones); the rest
  // of decode in f32.
  const bool decode = hb.view().one_row_each;
  const bool tensor_core = !decode || ((hd == 64 || hd == 128) && c.group <= 16 && bs == 16);
  const double err = rel_err(got, ref);
  EXPECT_LT(err, tensor_core ? 2e-3 : 1e-4) << (decode ? "decode" : "prefill");
  // Decode also against float64 over the same pages (the CPU backend's f32 is within ~1e-6 of it).
  const std::vector<double> ref64 =
      decode ? decode_reference_f64(cl, hb, q, ldq, n_heads, scale, ldo) : std::vector<double>();
  const double err64 = ref64.empty() ? -1.0 : rel_err(got, ref64);
  if (!ref64.empty()) {
    EXPECT_LT(err64, tensor_core ? 2e-3 : 1e-4) << "decode against float64";
  }
  std::printf("  %-14s/%-14s hd %3d group %2d %s: rel err %.2e (float64: %.2e)\n", c.k_fmt.c_str(), c.v_fmt.c_str(), hd,
              c.group, decode ? "decode " : "prefill", err, err64);
}

}  // namespace

TEST(CudaKvQuant, EveryFormatStoresTheCpuBytesAndAttendsLikeTheCpu) {
  TESSERA_REQUIRE_CUDA();
  uint32_t seed = 1;
  for (const char* name : kFormats) {
    // Prefill with partial blocks (GQA 3), chunked prefill continuing a stored past, then
    // decode batches (one row each: block boundaries, long enough to split).
    run_case({name, name, 16, 2, 3, 64, {{0, 37}, {0, 5}}}, seed++);
    run_case({name, name, 16, 2, 4, 128, {{19, 30}, {40, 17}}}, seed++);
    run_case({name, name, 16, 2, 4, 128, {{15, 1}, {16, 1}, {700, 1}, {1, 1}}}, seed++);
    run_case({name, name, 8, 1, 5, 64, {{300, 1}, {33, 1}}}, seed++);
    // The tensor-core decode at head_dim 64 with a full group of 16 query heads per KV head.
    run_case({name, name, 16, 2, 16, 64, {{63, 1}, {64, 1}, {65, 1}, {333, 1}}}, seed++);
  }
}

// The float64 reference itself, on the host (no GPU needed): the CPU backend's decode over
// the same pages agrees with it, for every format it covers, GQA, equalized turbo keys and
// mixed formats.
TEST(CudaKvQuant, Float64DecodeReferenceAgreesWithTheCpuBackend) {
  auto cpu = make_cpu();
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {"turbo2.5", "turbo2.5"}, {"turbo3", "turbo3"},   {"turbo3.5", "turbo3.5"}, {"turbo4", "turbo4"},
      {"turbo4", "int8"},       {"fp8_e4m3", "turbo3"}, {"int4", "int4"},         {"fp8_e4m3:head", "int8:g16"}};
  uint32_t seed = 200;
  for (const auto& [kf, vf] : pairs) {
    for (const int hd : {64, 128}) {
      SCOPED_TRACE(kf + "/" + vf + " hd " + std::to_string(hd));
      const Case c{kf, vf, 16, 2, 3, hd, {{40, 1}, {16, 1}, {3, 1}}};
      std::mt19937 rng(seed++);
      const int n_blocks = 8, max_blocks = 3, n_heads = c.n_kv_heads * c.group;
      const int64_t kvd = static_cast<int64_t>(c.n_kv_heads) * hd, qd = static_cast<int64_t>(n_heads) * hd;
      KvCache cache(*cpu, spec_of(c, n_blocks));
      const KvLayerView l = cache.layer(0);
      const std::vector<int32_t> tables = {5, 0, 7, 2, 0, 0, 6, 0, 0};  // [3 seqs][max_blocks]
      HostBatch store, dec;
      store.max_blocks = dec.max_blocks = max_blocks;
      store.tables = dec.tables = tables;
      store.q_start.push_back(0);
      dec.q_start.push_back(0);
      for (size_t s = 0; s < c.seqs.size(); ++s) {
        const int len = c.seqs[s].past + 1;
        for (int i = 0; i < len; ++i) {
          store.positions.push_back(i);
          store.slots.push_back(tables[s * max_blocks + i / 16] * 16 + i % 16);
        }
        store.q_start.push_back(static_cast<int32_t>(store.positions.size()));
        store.kv_len.push_back(len);
        dec.positions.push_back(len - 1);
        dec.slots.push_back(store.slots.back());
        dec.q_start.push_back(static_cast<int32_t>(s + 1));
        dec.kv_len.push_back(len);
      }
      const int n = static_cast<int>(store.positions.size());
      const auto k = outlier_rows(n, static_cast<int>(kvd), rng);
      const auto v = randn(static_cast<size_t>(n) * kvd, rng);
      cpu->kv_store(l, k.data(), kvd, v.data(), kvd, store.view());
      const int64_t ldq = qd + 4, ldo = qd + 8;
      const auto q = randn(static_cast<size_t>(c.seqs.size()) * ldq, rng);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      std::vector<float> got(c.seqs.size() * ldo, 0.0f);
      cpu->attention(q.data(), ldq, l, dec.view(), n_heads, scale, got.data(), ldo);
      const std::vector<double> ref = decode_reference_f64(l, dec, q, ldq, n_heads, scale, ldo);
      ASSERT_FALSE(ref.empty());
      EXPECT_LT(rel_err(got, ref), 1e-5);
    }
  }
}

// Many sequences of short contexts: one split each, where the fragment kernel normalizes
// the output itself (fp8) or, for turbo values, still writes partials so that the merge
// kernel rotates them back; and a batch long enough for many splits.
TEST(CudaKvQuant, DecodeOneSplitAndManySplits) {
  TESSERA_REQUIRE_CUDA();
  std::vector<Seq> many;
  for (int i = 0; i < 80; ++i) many.push_back({(i * 37) % 250, 1});
  uint32_t seed = 70;
  for (const char* name : {"fp8_e4m3", "turbo3", "turbo3.5", "int8"}) {
    run_case({name, name, 16, 4, 2, 64, many}, seed++);
    run_case({name, name, 16, 1, 8, 128, {{3000, 1}, {1, 1}}}, seed++);
  }
  run_case({"int4", "turbo4", 16, 4, 3, 128, many}, seed++);
}

// Speculative verification batches (a few query rows per sequence, each seeing the keys up to
// its own position) over quantized pages: the fragment kernel's split keys in chunks of
// 16 / group rows (formats it takes), the prefill kernel for the others (QJL keys).
TEST(CudaKvQuant, VerificationRowsAttendLikeTheCpu) {
  TESSERA_REQUIRE_CUDA();
  uint32_t seed = 300;
  for (const char* name : kFormats) {
    run_case({name, name, 16, 2, 4, 128, {{700, 5}, {16, 1}, {40, 3}}}, seed++);
    run_case({name, name, 16, 2, 16, 64, {{300, 4}, {63, 2}}}, seed++);
  }
  run_case({"turbo3.5", "turbo3.5", 16, 2, 4, 128, {{1000, 17}}}, seed++);
  run_case({"int4", "fp8_e4m3:token", 16, 1, 3, 64, {{255, 6}, {256, 9}}}, seed++);
}

TEST(CudaKvQuant, DraftTreesAttendLikeTheCpu) {
  // Tree verification over quantized pages: the fragment kernel (<= 17 rows) and the
  // prefill kernel (more rows), every format family.
  TESSERA_REQUIRE_CUDA();
  uint32_t seed = 500;
  const std::vector<int16_t> small = {-1, 0, 1, -1, 3, 0, 5, -1};
  const std::vector<int16_t> big = {-1, 0,  1,  2,  3, -1, 0,  1,  5,  6, 8, 9,
                                    2,  11, 12, 13, 4, 15, 16, 17, 18, 3, 20};  // a chain, then branches
  for (const char* name : {"fp8_e4m3", "int8", "int4:g32", "turbo3.5", "turbo3.5:qjl"}) {
    run_case({name, name, 16, 2, 4, 128, {{40, 1}, {700, 9}}, small}, seed++);
    run_case({name, name, 16, 2, 4, 64, {{300, 24}}, big}, seed++);
  }
}

TEST(CudaKvQuant, TokenMovesGiveTheCpuBytes) {
  // Backend::move_kv_tokens (tree verification's kept path): the CUDA kernel moves the same
  // bytes as the CPU's copies in order, codes and per-token scales, K and V.
  TESSERA_REQUIRE_CUDA();
  auto gpu = make_cuda();
  auto cpu = make_cpu();
  std::mt19937 rng(17);
  for (const char* name : {"f16", "fp8_e4m3:token", "int8:g32", "int4:g32", "turbo3.5:qjl"}) {
    const KvCacheSpec spec = spec_of(Case{name, name, 16, 2, 4, 64, {}}, 6);
    KvCache ckv(*cpu, spec), gkv(*gpu, spec);
    const KvLayerView cl = ckv.layer(0), gl = gkv.layer(0);
    for (int part = 0; part < 2; ++part) {
      const size_t bytes = static_cast<size_t>(part == 0 ? spec.k_layer_block_bytes() : spec.v_layer_block_bytes()) * 6;
      std::vector<uint8_t> fill(bytes);
      for (auto& b : fill) b = static_cast<uint8_t>(rng());
      std::memcpy(part == 0 ? cl.k : cl.v, fill.data(), bytes);
      gpu->copy_to_device(part == 0 ? gl.k : gl.v, fill.data(), bytes);
    }
    // In order, chained (each reads the slot the one before wrote), across pages and within one.
    const KvSlotMove moves[] = {{18, 17}, {19, 18}, {40, 19}, {90, 40}, {30, 20}};
    cpu->move_kv_tokens(cl, moves);
    gpu->move_kv_tokens(gl, moves);
    for (int part = 0; part < 2; ++part) {
      const size_t bytes = static_cast<size_t>(part == 0 ? spec.k_layer_block_bytes() : spec.v_layer_block_bytes()) * 6;
      std::vector<uint8_t> got(bytes);
      gpu->copy_to_host(got.data(), part == 0 ? gl.k : gl.v, bytes);
      EXPECT_EQ(std::memcmp(got.data(), part == 0 ? cl.k : cl.v, bytes), 0) << name << (part == 0 ? " K" : " V");
    }
  }
}

TEST(CudaKvQuant, MixedFormatsBlockSizesAndHeadSizes) {
  TESSERA_REQUIRE_CUDA();
  // Turbo beside other formats and at another width on the tensor-core decode (formats
  // read at run time: every turbo width through one code path).
  run_case({"turbo3.5", "int8", 16, 2, 4, 128, {{20, 1}, {300, 1}, {33, 1}}}, 80);
  run_case({"fp8_e4m3:token", "turbo2.5", 16, 2, 16, 64, {{47, 1}, {129, 1}}}, 81);
  run_case({"turbo4", "turbo2.5", 16, 1, 7, 64, {{5, 1}, {257, 1}, {16, 1}}}, 82);
  run_case({"turbo3", "int4", 16, 2, 3, 128, {{100, 1}, {17, 1}}}, 83);
  run_case({"int4", "int8", 16, 2, 2, 64, {{33, 1}, {7, 9}}}, 90);
  run_case({"turbo3.5:qjl", "fp8_e4m3:token", 16, 2, 4, 128, {{20, 1}, {3, 40}}}, 91);
  run_case({"f16", "int4:g32", 16, 2, 4, 128, {{50, 1}, {0, 20}}}, 92);
  run_case({"int4", "turbo3:qjl", 7, 3, 2, 64, {{29, 6}, {13, 1}}}, 93);
  run_case({"turbo3", "turbo3:qjl", 16, 1, 8, 256, {{70, 1}, {0, 18}}}, 94);
  run_case({"turbo3:qjl", "turbo3", 16, 1, 4, 256, {{0, 70}, {37, 21}}}, 96);  // prefill over 2·256 channels
  run_case({"int8:g32", "fp8_e5m2", 32, 2, 16, 256, {{100, 1}, {31, 2}}}, 95);
}

// Decode attention time per layer at the Llama-3.1-8B shape (32 query heads, 8 KV heads,
// head_dim 128, blocks of 16), graph-replayed: 64 sequences at 8k context and 1 at 32k, f16
// (the tensor-core kernel) against each format; the bytes each step must read (every page
// of the context, K and V, scales included) over the time, and that floor at 4.8 TB/s.
TEST(CudaKvQuant, DecodeAttentionBenchmark) {
  TESSERA_REQUIRE_CUDA();
  if (!std::getenv("TESSERA_CUDA_BENCH_KVQ")) GTEST_SKIP() << "set TESSERA_CUDA_BENCH_KVQ=1";
  auto gpu = make_cuda();
  const int hd = 128, n_kv = 8, n_heads = 32, bs = 16;
  std::vector<std::string> formats = {"f16",      "fp8_e4m3", "fp8_e4m3:token", "int8",   "int8:g32", "int4",
                                      "int4:g32", "turbo4",   "turbo3.5",       "turbo3", "turbo2.5", "turbo3.5:qjl"};
  // TESSERA_CUDA_BENCH_KVQ_FORMATS=f16,int4,...: a subset (f16 first, for the "x f16" column).
  if (const char* only = std::getenv("TESSERA_CUDA_BENCH_KVQ_FORMATS")) {
    formats.clear();
    std::stringstream list(only);
    for (std::string name; std::getline(list, name, ',');)
      if (!name.empty()) formats.push_back(name);
  }
  std::printf("%-16s %-10s %10s %10s %10s %10s %8s %9s\n", "format", "shape", "us/layer", "MB/layer", "GB/s",
              "floor us", "x f16", "of floor");
  for (const auto& [n_seqs, ctx] : std::vector<std::pair<int, int>>{{64, 8192}, {1, 32768}}) {
    const int per_seq = ctx / bs, n_blocks = n_seqs * per_seq;
    double f16_time = 0;
    for (const std::string& name : formats) {
      Case c{name, name, bs, n_kv, n_heads / n_kv, hd, {}};
      const KvCacheSpec spec = spec_of(c, n_blocks);
      KvCache cache(*gpu, spec);
      const KvLayerView l = cache.layer(0);
      std::mt19937 rng(5);
      const int chunk = 8192;
      DeviceVec<float> dk(*gpu, randn(static_cast<size_t>(chunk) * n_kv * hd, rng));
      DeviceVec<float> dv(*gpu, randn(static_cast<size_t>(chunk) * n_kv * hd, rng));
      for (int t0 = 0; t0 < n_blocks * bs; t0 += chunk) {  // every slot, in order
        HostBatch hb;
        for (int i = 0; i < chunk; ++i) {
          hb.positions.push_back(i);
          hb.slots.push_back(t0 + i);
        }
        hb.q_start = {0, chunk};
        hb.kv_len = {chunk};
        hb.tables = {0};
        hb.max_blocks = 1;
        gpu->kv_store(l, dk.get(), n_kv * hd, dv.get(), n_kv * hd, hb.device_view(*gpu));
      }
      HostBatch hb;
      hb.max_blocks = per_seq;
      hb.q_start.push_back(0);
      for (int s = 0; s < n_seqs; ++s) {
        hb.positions.push_back(ctx - 1);
        hb.slots.push_back((s * per_seq + per_seq - 1) * bs + bs - 1);
        hb.q_start.push_back(s + 1);
        hb.kv_len.push_back(ctx);
        for (int b = 0; b < per_seq; ++b) hb.tables.push_back(s * per_seq + b);
      }
      const AttentionBatch ab = hb.device_view(*gpu);
      DeviceVec<float> q(*gpu, randn(static_cast<size_t>(n_seqs) * n_heads * hd, rng));
      DeviceVec<float> out(*gpu, static_cast<size_t>(n_seqs) * n_heads * hd);
      const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
      const int reps = 20;
      gpu->attention(q.get(), n_heads * hd, l, ab, n_heads, scale, out.get(), n_heads * hd);  // grows scratch
      gpu->synchronize();
      gpu->begin_capture();
      for (int r = 0; r < reps; ++r)
        gpu->attention(q.get(), n_heads * hd, l, ab, n_heads, scale, out.get(), n_heads * hd);
      auto graph = gpu->end_capture();
      graph->launch();
      gpu->synchronize();
      double best = 1e30;
      for (int trial = 0; trial < 5; ++trial) {
        const auto t0 = std::chrono::steady_clock::now();
        graph->launch();
        gpu->synchronize();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
      }
      const double bytes = static_cast<double>(n_blocks) * n_kv * (l.k_page_bytes + l.v_page_bytes);
      if (name == "f16") f16_time = best;
      const double floor = bytes / 4.8e12;
      std::printf("%-16s %3dx%-6d %10.1f %10.1f %10.0f %10.1f %8.2f %8.0f%%\n", name.c_str(), n_seqs, ctx, best * 1e6,
                  bytes / 1e6, bytes / best / 1e9, floor * 1e6, f16_time / best, 100 * floor / best);
      std::fflush(stdout);
    }
  }
}
