// The CPU backend's row kernels and paged attention against float64 references, on every
// ISA path this machine has, with awkward sizes and outputs poisoned before each run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_ops.h"
#include "core/error.h"
#include "core/fp16.h"
#include "model/model.h"

using namespace tessera;

namespace {

std::vector<const cpu::OpsTable*> ops_paths() {
  std::vector<const cpu::OpsTable*> v{&cpu::ops_table_scalar()};
  if (auto* t = cpu::ops_table_avx2()) v.push_back(t);
  return v;
}

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace

TEST(CpuOps, RmsNormMatchesFloat64) {
  std::mt19937 rng(1);
  for (auto* ops : ops_paths()) {
    for (int dim : {1, 7, 64, 577}) {
      const int rows = 5;
      auto x = randn(rows * dim, rng), w = randn(dim, rng);
      std::vector<float> out(rows * dim, NAN);
      ops->rms_norm_rows(x.data(), w.data(), out.data(), rows, dim, 1e-5f);
      std::vector<double> ref(rows * dim);
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += double(x[r * dim + i]) * x[r * dim + i];
        const double inv = 1 / std::sqrt(ss / dim + 1e-5);
        for (int i = 0; i < dim; ++i) ref[r * dim + i] = x[r * dim + i] * inv * w[i];
      }
      EXPECT_LT(rel_err(out, ref), 1e-6) << ops->isa << " dim " << dim;
      // fused residual variant: x + res, then norm
      auto res = randn(rows * dim, rng);
      auto x2 = x;
      std::fill(out.begin(), out.end(), NAN);
      ops->add_rms_norm_rows(x2.data(), res.data(), w.data(), out.data(), rows, dim, 1e-5f);
      for (int r = 0; r < rows; ++r) {
        double ss = 0;
        for (int i = 0; i < dim; ++i) {
          const double v = double(x[r * dim + i]) + res[r * dim + i];
          EXPECT_FLOAT_EQ(x2[r * dim + i], float(v));
          ss += v * v;
        }
        const double inv = 1 / std::sqrt(ss / dim + 1e-5);
        for (int i = 0; i < dim; ++i) ref[r * dim + i] = (double(x[r * dim + i]) + res[r * dim + i]) * inv * w[i];
      }
      EXPECT_LT(rel_err(out, ref), 1e-6) << ops->isa;
    }
  }
}

TEST(CpuOps, SwigluMatchesFloat64) {
  std::mt19937 rng(2);
  for (auto* ops : ops_paths()) {
    const int rows = 3, dim = 101, ld = 110;
    auto g = randn(rows * ld, rng, 4.0f), u = randn(rows * ld, rng);
    g[5] = 90.0f;  // saturating inputs stay finite
    g[6] = -90.0f;
    std::vector<float> out(rows * dim, NAN);
    ops->swiglu_rows(g.data(), u.data(), ld, out.data(), rows, dim);
    std::vector<double> ref(rows * dim);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < dim; ++i) {
        const double gv = g[r * ld + i];
        ref[r * dim + i] = gv / (1 + std::exp(-gv)) * u[r * ld + i];
      }
    EXPECT_LT(rel_err(out, ref), 1e-6) << ops->isa;
  }
}

TEST(CpuOps, GegluMatchesFloat64) {
  std::mt19937 rng(21);
  for (auto* ops : ops_paths()) {
    const int rows = 3, dim = 101, ld = 110;
    auto g = randn(rows * ld, rng, 3.0f), u = randn(rows * ld, rng);
    g[5] = 90.0f;  // saturating inputs stay finite
    g[6] = -90.0f;
    std::vector<float> out(rows * dim, NAN);
    ops->geglu_rows(g.data(), u.data(), ld, out.data(), rows, dim);
    std::vector<double> ref(rows * dim);
    for (int r = 0; r < rows; ++r)
      for (int i = 0; i < dim; ++i) {
        const double x = g[r * ld + i];
        const double gelu = 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
        ref[r * dim + i] = gelu * u[r * ld + i];
      }
    EXPECT_LT(rel_err(out, ref), 1e-6) << ops->isa;
  }
}

TEST(CpuBackend, RmsNormHeadsNormsEachHeadOfStridedRowsInPlace) {
  std::mt19937 rng(22);
  CpuBackend be(2);
  const int rows = 5, heads = 3, hd = 24, ld = heads * hd + 40;  // the rest of the row untouched
  auto x = randn(rows * ld, rng, 2.0f);
  const auto w = randn(hd, rng);
  const auto before = x;
  be.rms_norm_heads(x.data(), ld, rows, heads, hd, w.data(), 1e-6f);
  std::vector<float> got;
  std::vector<double> ref;
  for (int r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      double ss = 0;
      for (int i = 0; i < hd; ++i) ss += double(before[r * ld + h * hd + i]) * before[r * ld + h * hd + i];
      const double inv = 1 / std::sqrt(ss / hd + 1e-6);
      for (int i = 0; i < hd; ++i) {
        ref.push_back(before[r * ld + h * hd + i] * inv * w[i]);
        got.push_back(x[r * ld + h * hd + i]);
      }
    }
    for (int i = heads * hd; i < ld; ++i) EXPECT_EQ(x[r * ld + i], before[r * ld + i]);
  }
  EXPECT_LT(rel_err(got, ref), 1e-6);
  be.scale(x.data(), 2.0f, 3);
  EXPECT_EQ(x[2], 2.0f * got[2]);
}

TEST(CpuOps, RopeMatchesFloat64BothLayouts) {
  std::mt19937 rng(3);
  for (auto* ops : ops_paths()) {
    for (bool neox : {false, true}) {
      const int rows = 4, heads = 3, hd = 10, rot = 8, ld = heads * hd + 3;
      const double base = 10000;
      auto x = randn(rows * ld, rng);
      auto y = x;
      std::vector<int> pos = {0, 1, 17, 4000};
      std::vector<std::vector<float>> cs(rows, std::vector<float>(rot));
      std::vector<const float*> rowp(rows);
      for (int r = 0; r < rows; ++r) {
        for (int i = 0; i < rot / 2; ++i) {
          const double th = pos[r] * std::pow(base, -2.0 * i / rot);
          cs[r][i] = float(std::cos(th));
          cs[r][rot / 2 + i] = float(std::sin(th));
        }
        rowp[r] = cs[r].data();
      }
      ops->rope_rows(y.data(), rows, ld, heads, hd, rot, neox, rowp.data());
      for (int r = 0; r < rows; ++r)
        for (int h = 0; h < heads; ++h) {
          const float* a = x.data() + r * ld + h * hd;
          const float* b = y.data() + r * ld + h * hd;
          for (int i = 0; i < rot / 2; ++i) {
            const int i0 = neox ? i : 2 * i, i1 = neox ? i + rot / 2 : 2 * i + 1;
            const double th = pos[r] * std::pow(base, -2.0 * i / rot);
            EXPECT_NEAR(b[i0], a[i0] * std::cos(th) - a[i1] * std::sin(th), 1e-4);
            EXPECT_NEAR(b[i1], a[i0] * std::sin(th) + a[i1] * std::cos(th), 1e-4);
          }
          for (int i = rot; i < hd; ++i) EXPECT_EQ(b[i], a[i]);  // the unrotated tail is untouched
        }
      EXPECT_EQ(y[heads * hd], x[heads * hd]);  // padding between rows untouched
    }
  }
}

namespace {

struct AttnCase {
  int block_size, n_heads, n_kv_heads, head_dim;
  DType dtype;
  // per sequence: tokens already in KV before this step, new tokens this step
  std::vector<std::pair<int, int>> seqs;
  int window = 0;  // sliding window (0: plain causal)
  // A draft tree over the last sequence's new rows (ForwardBatch::set_tree; its new rows =
  // nodes + 1): each row then sees its ancestors among them only.
  std::vector<int16_t> tree = {};
};

// Whether row `row` of a tree (0 = root, 1 + j = node j) has row `other` as ancestor or self.
bool tree_sees(const std::vector<int16_t>& parents, int row, int other) {
  for (int r = row;; r = 1 + parents[r - 1]) {
    if (r == other) return true;
    if (r == 0) return false;
  }
}

// Runs kv_store + attention through the backend over shuffled block tables and compares every
// output row against a float64 softmax over the dense keys (rounded to the KV dtype).
void check_attention(const AttnCase& tc, uint32_t seed) {
  std::mt19937 rng(seed);
  CpuBackend be(2);
  const int hd = tc.head_dim, kvd = tc.n_kv_heads * hd, qd = tc.n_heads * hd;
  int total_blocks = 0;
  for (auto [past, add] : tc.seqs) total_blocks += (past + add + tc.block_size - 1) / tc.block_size;
  total_blocks += 3;  // spare blocks that nobody owns
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  KvCacheSpec spec;
  spec.n_layers = 1;
  spec.n_kv_heads = tc.n_kv_heads;
  spec.head_dim = hd;
  spec.block_size = tc.block_size;
  spec.n_blocks = total_blocks;
  spec.set_plain(tc.dtype);
  KvCache kv(be, spec);
  const KvLayerView layer = kv.layer(0);

  // Dense per-sequence keys/values for the reference; fill the cache with the "past" tokens
  // through kv_store in a first batch, then run this step's batch.
  std::vector<std::vector<float>> K(tc.seqs.size()), V(tc.seqs.size());
  std::vector<SequenceBlocks> seqs(tc.seqs.size());
  size_t next_id = 0;
  auto round = [&](float v) { return tc.dtype == DType::F16 ? fp16_to_f32(f32_to_fp16(v)) : v; };
  for (size_t s = 0; s < tc.seqs.size(); ++s) {
    const int n = tc.seqs[s].first + tc.seqs[s].second;
    K[s] = randn(size_t(n) * kvd, rng);
    V[s] = randn(size_t(n) * kvd, rng);
    const int nb = (n + tc.block_size - 1) / tc.block_size;
    for (int b = 0; b < nb; ++b) seqs[s].blocks.push_back(ids[next_id++]);
  }
  auto store = [&](bool past) {
    ForwardBatch fb;
    std::vector<float> k, v;
    for (size_t s = 0; s < tc.seqs.size(); ++s) {
      const int b = past ? 0 : tc.seqs[s].first, e = past ? tc.seqs[s].first : tc.seqs[s].first + tc.seqs[s].second;
      std::vector<int32_t> toks(e - b, 0);
      SequenceBlocks view = seqs[s];
      view.n_tokens = b;
      fb.add_sequence(view, tc.block_size, toks.data(), e - b, ForwardBatch::Logits::None);
      k.insert(k.end(), K[s].begin() + size_t(b) * kvd, K[s].begin() + size_t(e) * kvd);
      v.insert(v.end(), V[s].begin() + size_t(b) * kvd, V[s].begin() + size_t(e) * kvd);
    }
    if (fb.n_tokens() > 0) be.kv_store(layer, k.data(), kvd, v.data(), kvd, fb.attention_view());
    return fb;
  };
  store(true);
  ForwardBatch fb = store(false);
  if (!tc.tree.empty()) fb.set_tree(tc.tree);
  const int n = fb.n_tokens();
  const int ldq = qd + 5, ldo = qd + 7;
  auto q = randn(size_t(n) * ldq, rng);
  std::vector<float> out(size_t(n) * ldo, NAN);
  const float scale = 1.0f / std::sqrt(float(hd));
  AttentionBatch ab = fb.attention_view();
  ab.window = tc.window;
  be.attention(q.data(), ldq, layer, ab, tc.n_heads, scale, out.data(), ldo);

  const int group = tc.n_heads / tc.n_kv_heads;
  std::vector<float> got;
  std::vector<double> ref;
  for (size_t s = 0; s < tc.seqs.size(); ++s) {
    for (int t = fb.q_start[s]; t < fb.q_start[s + 1]; ++t) {
      const int pos = fb.positions[t];
      const int first = tc.window > 0 ? std::max(0, pos - tc.window + 1) : 0;  // keys first..pos
      const bool tree = !tc.tree.empty() && s + 1 == tc.seqs.size();
      const int past = tc.seqs[s].first, row = t - fb.q_start[s];
      const auto seen = [&](int j) { return !tree || j < past || tree_sees(tc.tree, row, j - past); };
      for (int h = 0; h < tc.n_heads; ++h) {
        const int kh = h / group;
        std::vector<double> sc(pos + 1, -1e300);
        double mx = -1e300;
        for (int j = first; j <= pos; ++j) {
          if (!seen(j)) continue;
          double d = 0;
          for (int i = 0; i < hd; ++i)
            d += double(q[t * ldq + h * hd + i]) * round(K[s][size_t(j) * kvd + kh * hd + i]);
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        double sum = 0;
        for (auto& v : sc) sum += (v = std::exp(v - mx));
        for (int i = 0; i < hd; ++i) {
          double o = 0;
          for (int j = first; j <= pos; ++j)
            if (seen(j)) o += sc[j] * round(V[s][size_t(j) * kvd + kh * hd + i]);
          ref.push_back(o / sum);
          got.push_back(out[t * ldo + h * hd + i]);
        }
      }
    }
  }
  EXPECT_LT(rel_err(got, ref), 2e-6) << "block " << tc.block_size << " heads " << tc.n_heads << "/" << tc.n_kv_heads;
}

}  // namespace

TEST(CpuAttention, PrefillOneSequenceGqa) {
  check_attention({16, 9, 3, 64, DType::F16, {{0, 37}}}, 10);
  check_attention({5, 4, 1, 12, DType::F32, {{0, 21}}}, 11);
}

TEST(CpuAttention, DecodeManySequences) {
  check_attention({16, 6, 2, 32, DType::F16, {{0, 1}, {15, 1}, {16, 1}, {100, 1}, {7, 1}}}, 12);
}

TEST(CpuAttention, DecodeOneSequenceSplitsQueryHeadsAcrossThreads) {
  // One decoding sequence has fewer KV heads than 2 x threads: the backend gives each query
  // head of a group its own task (and head_dim 12 exercises the dot product's tail).
  check_attention({16, 9, 3, 64, DType::F16, {{70, 1}}}, 15);
  check_attention({5, 4, 2, 12, DType::F32, {{30, 1}}}, 16);
  check_attention({4, 8, 1, 20, DType::F16, {{9, 1}, {0, 1}}}, 17);
}

TEST(CpuAttention, LongContextsSplitTheirKeysAcrossThreads) {
  // Few (sequence, KV head) tasks and contexts of at least 512 keys: the backend splits each
  // task's keys (whole blocks) over the threads and merges the splits' softmax states. Decode,
  // a speculative verification's 5 rows, two sequences of different lengths, a window, a
  // block size that does not divide the split.
  check_attention({16, 9, 3, 64, DType::F16, {{1500, 1}}}, 21);
  check_attention({16, 9, 3, 64, DType::F16, {{700, 5}}}, 22);
  check_attention({16, 8, 1, 32, DType::F32, {{1100, 1}, {600, 1}}}, 23);
  check_attention({16, 4, 1, 64, DType::F16, {{900, 3}}, 300}, 24);
  check_attention({5, 4, 2, 16, DType::F16, {{1024, 2}}}, 25);
}

TEST(CpuAttention, MixedChunkedPrefillAndDecode) {
  // A chunk continuing a long prompt, a fresh prompt, and decodes, in one batch.
  check_attention({8, 8, 8, 16, DType::F32, {{40, 19}, {0, 33}, {63, 1}, {64, 1}}}, 13);
  check_attention({3, 2, 1, 8, DType::F16, {{10, 2}, {0, 1}}}, 14);
}

TEST(CpuAttention, SlidingWindowMasksKeysBeforeTheWindow) {
  // Gemma 3's local layers: a chunk crossing the window, decodes far past it and just inside
  // it, a fresh prompt longer than the window, and a window of one (only the key itself).
  check_attention({8, 4, 1, 32, DType::F16, {{40, 19}, {0, 33}, {63, 1}, {9, 1}}, 16}, 18);
  check_attention({16, 8, 2, 64, DType::F32, {{100, 1}, {0, 70}}, 37}, 19);
  check_attention({4, 2, 1, 8, DType::F16, {{10, 3}, {0, 5}}, 1}, 20);
}

TEST(CpuAttention, DraftTreeRowsSeeOnlyTheirAncestors) {
  // Tree verification: the root, a main chain of 3 and two side branches (one of them two
  // deep), after a context that ends mid-block, so the tree's keys cross a block edge; a
  // plain decode and a chain verification share the batch; long contexts split the keys.
  const std::vector<int16_t> tree = {-1, 0, 1, -1, 3, 0};
  check_attention({16, 9, 3, 64, DType::F16, {{5, 1}, {30, 7}}, 0, tree}, 40);
  check_attention({4, 4, 1, 16, DType::F32, {{9, 3}, {2, 7}}, 0, tree}, 41);
  check_attention({16, 8, 2, 64, DType::F16, {{1200, 7}}, 0, tree}, 42);
  // Every node a child of the root (several one-token candidates).
  check_attention({16, 4, 2, 32, DType::F16, {{0, 1}, {17, 5}}, 0, {-1, -1, -1, -1}}, 43);
}

TEST(CpuAttention, AvxAndScalarAgree) {
  if (!cpu::ops_table_avx2()) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937 rng(5);
  const int bs = 16, hd = 64, nkv = 2, nh = 4, n = 40;
  std::vector<float> k = randn(size_t(3) * nkv * bs * hd, rng), v = randn(k.size(), rng);
  KvLayerView kv = plain_kv_view(k.data(), v.data(), DType::F32, 3, bs, nkv, hd);
  SequenceBlocks seq;
  seq.blocks = {2, 0, 1};
  std::vector<int32_t> toks(n, 0);
  ForwardBatch fb;
  fb.add_sequence(seq, bs, toks.data(), n, ForwardBatch::Logits::None);
  auto q = randn(size_t(n) * nh * hd, rng);
  const auto ab = fb.attention_view();
  std::vector<float> a(size_t(n) * nh * hd, NAN), b(a.size(), NAN);
  std::vector<float> scratch(cpu::attention_scratch_floats(n, nh / nkv, bs, hd));
  for (int h = 0; h < nkv; ++h) {
    cpu::AttentionTask task{0, h, 0, n};
    cpu::ops_table_scalar().attention(q.data(), nh * hd, kv, ab, nh, 0.125f, a.data(), nh * hd, task, scratch.data());
    cpu::ops_table_avx2()->attention(q.data(), nh * hd, kv, ab, nh, 0.125f, b.data(), nh * hd, task, scratch.data());
  }
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5f * (1 + std::fabs(a[i])));
}

namespace {

// Row i of the pre-norm in float64, x_out / rms(x_out) * g, after checking that x_out holds
// x + residual exactly; empty when it does not.
std::vector<double> reference_norm_row(const std::vector<float>& x_out, const std::vector<float>& x,
                                       const std::vector<float>& res, const std::vector<float>& g, int i, int dim,
                                       float eps) {
  double ss = 0;
  for (int k = 0; k < dim; ++k) {
    const size_t e = size_t(i) * dim + k;
    EXPECT_EQ(x_out[e], x[e] + res[e]) << i << "," << k;
    if (x_out[e] != x[e] + res[e]) return {};
    ss += double(x_out[e]) * x_out[e];
  }
  const double inv = 1.0 / std::sqrt(ss / dim + eps);
  std::vector<double> xn(dim);
  for (int k = 0; k < dim; ++k) xn[k] = x_out[size_t(i) * dim + k] * inv * g[k];
  return xn;
}

// Backend::add_rms_norm_matmul's default (the CPU's): x_out = x + residual exactly, y = W ·
// rms_norm(x_out) · w against float64, x and residual untouched; an x_out that aliases x or
// residual is refused with an error naming which, before anything is written.
TEST(CpuBackend, AddRmsNormMatmulMatchesFloat64AndRefusesAliasedOutput) {
  auto be = make_backend(BackendOptions{"cpu", 2});
  std::mt19937 rng(31);
  const int n = 3, dim = 72, rows = 10;
  const float eps = 1e-5f;
  const auto x = randn(size_t(n) * dim, rng), res = randn(x.size(), rng), g = randn(dim, rng);
  const auto w = randn(size_t(rows) * dim, rng);
  std::vector<float> x_in = x, res_in = res, x_out(x.size(), NAN), xn(x.size(), NAN), y(size_t(n) * rows, NAN);
  const MatmulTarget target{{w.data(), DType::F32, rows, dim}, y.data(), rows};
  be->add_rms_norm_matmul(x_in.data(), res_in.data(), g.data(), x_out.data(), xn.data(), n, dim, eps,
                          std::span(&target, 1));
  EXPECT_EQ(x_in, x);
  EXPECT_EQ(res_in, res);
  std::vector<double> ref;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> xn_ref = reference_norm_row(x_out, x, res, g, i, dim, eps);
    ASSERT_EQ(xn_ref.size(), size_t(dim));
    for (int r = 0; r < rows; ++r) {
      double acc = 0;
      for (int k = 0; k < dim; ++k) acc += xn_ref[k] * w[r * dim + k];
      ref.push_back(acc);
    }
  }
  EXPECT_LT(rel_err(y, ref), 1e-5);

  for (float* alias : {x_in.data(), res_in.data()}) {
    try {
      be->add_rms_norm_matmul(x_in.data(), res_in.data(), g.data(), alias, xn.data(), n, dim, eps,
                              std::span(&target, 1));
      ADD_FAILURE() << "an aliased x_out was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(alias == x_in.data() ? "aliases x" : "aliases residual"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(x_in, x);
    EXPECT_EQ(res_in, res);
  }
}

// Backend::add_rms_norm_swiglu_ffn's default (the CPU's) against float64: x_out = x +
// residual, gate and up = W · rms_norm(x_out) · w, down's y = W_down · (silu(gate) · up), down
// writing over residual as the Llama runner does; targets whose shapes do not fit together
// are refused with an error naming the op, before anything is written.
TEST(CpuBackend, AddRmsNormSwigluFfnMatchesFloat64AndRefusesMismatchedShapes) {
  auto be = make_backend(BackendOptions{"cpu", 2});
  std::mt19937 rng(37);
  const int n = 2, dim = 40, n_ff = 24;
  const float eps = 1e-5f;
  const auto x = randn(size_t(n) * dim, rng), res = randn(x.size(), rng), g = randn(dim, rng);
  const auto wg = randn(size_t(n_ff) * dim, rng), wu = randn(wg.size(), rng), wd = randn(size_t(dim) * n_ff, rng);
  std::vector<float> x_in = x, res_in = res, x_out(x.size(), NAN), xn(x.size(), NAN), h(size_t(n) * n_ff, NAN);
  std::vector<float> gu(size_t(n) * 2 * n_ff, NAN);
  const MatmulTarget gate{{wg.data(), DType::F32, n_ff, dim}, gu.data(), 2 * n_ff};
  const MatmulTarget up{{wu.data(), DType::F32, n_ff, dim}, gu.data() + n_ff, 2 * n_ff};
  const MatmulTarget down{{wd.data(), DType::F32, dim, n_ff}, res_in.data(), dim};
  be->add_rms_norm_swiglu_ffn(x_in.data(), res_in.data(), g.data(), x_out.data(), xn.data(), n, dim, eps, gate, up,
                              h.data(), down);
  EXPECT_EQ(x_in, x);
  std::vector<double> ref_gu, ref_y;
  for (int i = 0; i < n; ++i) {
    const std::vector<double> xn_ref = reference_norm_row(x_out, x, res, g, i, dim, eps);
    ASSERT_EQ(xn_ref.size(), size_t(dim));
    std::vector<double> act(n_ff), gate_up(2 * n_ff);
    for (int r = 0; r < n_ff; ++r) {
      double a = 0, b = 0;
      for (int k = 0; k < dim; ++k) {
        a += xn_ref[k] * wg[r * dim + k];
        b += xn_ref[k] * wu[r * dim + k];
      }
      gate_up[r] = a;
      gate_up[n_ff + r] = b;
      act[r] = a / (1 + std::exp(-a)) * b;
    }
    ref_gu.insert(ref_gu.end(), gate_up.begin(), gate_up.end());
    for (int d = 0; d < dim; ++d) {
      double acc = 0;
      for (int k = 0; k < n_ff; ++k) acc += act[k] * wd[d * n_ff + k];
      ref_y.push_back(acc);
    }
  }
  EXPECT_LT(rel_err(gu, ref_gu), 1e-5);
  EXPECT_LT(rel_err(res_in, ref_y), 1e-5);

  // down's columns are not gate's rows; then up of another height.
  const MatmulTarget wide_down{{wd.data(), DType::F32, n_ff, dim}, res_in.data(), dim};
  const MatmulTarget short_up{{wu.data(), DType::F32, n_ff - 8, dim}, gu.data() + n_ff, 2 * n_ff};
  const std::vector<float> before = res_in;
  for (const auto& [u, d] : {std::pair{up, wide_down}, std::pair{short_up, down}}) {
    try {
      be->add_rms_norm_swiglu_ffn(x_in.data(), res_in.data(), g.data(), x_out.data(), xn.data(), n, dim, eps, gate, u,
                                  h.data(), d);
      ADD_FAILURE() << "mismatched FFN targets were accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("add_rms_norm_swiglu_ffn"), std::string::npos) << e.what();
    }
    EXPECT_EQ(res_in, before);
  }
}

}  // namespace
