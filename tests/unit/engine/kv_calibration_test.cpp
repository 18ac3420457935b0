// Static KV scales from a calibration pass: the scales are amax / 448, and a cache using them
// stores the largest value at (nearly) the largest fp8 code without ever saturating.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "backend/kv_codec.h"
#include "core/error.h"
#include "engine/kv_calibration.h"
#include "engine/kv_scales.h"
#include "engine/session.h"

using namespace tessera;

namespace {

SessionOptions tiny(const KvFormat& f) {
  SessionOptions o;
  o.model = "dummy:llama3-tiny";
  o.backend.threads = 2;
  o.ctx = 64;
  o.max_batch_tokens = 32;
  o.k_format = o.v_format = f;
  return o;
}

std::vector<int32_t> some_tokens(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + 11) % 200;
  return t;
}

// Writes text to path and expects read_kv_scales to reject it with a message holding needle.
void expect_bad_file(const std::string& path, const std::string& text, const std::string& needle) {
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(text.c_str(), f);
  std::fclose(f);
  try {
    read_kv_scales(path);
    ADD_FAILURE() << "accepted " << text;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(KvCalibration, ScalesMapTheLargestValueToTheLargestCode) {
  Session exact(tiny(kv_format_of(DType::F32)));
  const std::vector<int32_t> tokens = some_tokens(128);
  const KvStats amax = measure_kv_stats(exact, tokens, 64, 0);
  const ModelConfig& c = exact.config();
  ASSERT_EQ(amax.k.size(), static_cast<size_t>(c.n_layer));
  EXPECT_EQ(amax.tokens, 128);
  const KvFormat head = parse_kv_format("fp8_e4m3:head", true), tensor = parse_kv_format("fp8_e4m3", true);
  const KvScales per_head = kv_scales_from_stats(amax, head, head);
  const KvScales per_tensor = kv_scales_from_stats(amax, tensor, tensor);
  for (int l = 0; l < c.n_layer; ++l) {
    ASSERT_EQ(per_head.k[l].size(), static_cast<size_t>(c.n_head_kv));
    ASSERT_EQ(per_tensor.v[l].size(), 1u);
    float vmax = 0;
    for (int h = 0; h < c.n_head_kv; ++h) {
      EXPECT_GT(amax.k[l][h], 0.0f);
      EXPECT_FLOAT_EQ(per_head.k[l][h], amax.k[l][h] / 448.0f);
      vmax = std::max(vmax, amax.v[l][h]);
    }
    EXPECT_FLOAT_EQ(per_tensor.v[l][0], vmax / 448.0f);
  }
  // Per-token formats take no static scales.
  EXPECT_TRUE(kv_scales_from_stats(amax, parse_kv_format("int8", true), parse_kv_format("int8", false)).k.empty());

  // The same windows through a cache with the per-head scales: the largest key lands on a
  // code of magnitude 448 (the amax token itself), none beyond (no saturation).
  const std::string path = ::testing::TempDir() + "/kv_scales_test.json";
  write_kv_scales(path, per_head, "fp8_e4m3:head", "fp8_e4m3:head", c.n_head_kv, c.head_dim);
  const KvScales back = read_kv_scales(path);
  EXPECT_EQ(back.k, per_head.k);
  SessionOptions o = tiny(head);
  o.k_scales = back.k;
  o.v_scales = back.v;
  Session q(o);
  std::vector<float> top(c.n_layer * c.n_head_kv, 0.0f);
  for (int w = 0; w < 2; ++w) {
    SequenceBlocks seq;
    ASSERT_TRUE(seq.reserve(q.pool(), q.block_size(), 64));
    ForwardBatch b;
    for (int done = 0; done < 64; done += 32) {
      b.clear();
      SequenceBlocks view = seq;
      view.n_tokens = done;
      b.add_sequence(view, q.block_size(), tokens.data() + w * 64 + done, 32, ForwardBatch::Logits::None);
      q.runner().forward(b, nullptr);
    }
    for (int l = 0; l < c.n_layer; ++l) {
      const KvLayerView v = q.kv().layer(l);
      for (int32_t blk : seq.blocks)
        for (int h = 0; h < c.n_head_kv; ++h) {
          const auto* page = static_cast<const uint8_t*>(v.k) + (int64_t(blk) * c.n_head_kv + h) * v.k_page_bytes;
          for (int i = 0; i < q.block_size() * c.head_dim; ++i)
            top[l * c.n_head_kv + h] =
                std::max(top[l * c.n_head_kv + h], std::fabs(fp8_to_f32(page[i], KvCodec::Fp8E4M3)));
        }
    }
    seq.release_all(q.pool());
  }
  // Layer 0's keys are exactly the calibration run's; later layers see the fp8 cache's
  // small perturbation upstream, so their largest key may round one code lower (416).
  for (int h = 0; h < c.n_head_kv; ++h) EXPECT_EQ(top[h], 448.0f) << h;
  for (float t : top) {
    EXPECT_GE(t, 416.0f);
    EXPECT_LE(t, 448.0f);
  }
  std::remove(path.c_str());
}

TEST(KvCalibration, KeyMeansAreWrittenReadAndCenterTurboKeys) {
  Session exact(tiny(kv_format_of(DType::F32)));
  const std::vector<int32_t> tokens = some_tokens(128);
  const KvStats stats = measure_kv_stats(exact, tokens, 64, 0);
  const ModelConfig& c = exact.config();
  const size_t row = size_t(c.n_head_kv) * c.head_dim;
  const KvFormat turbo_k = parse_kv_format("turbo3.5", true), turbo_v = parse_kv_format("turbo3.5", false);
  const KvScales means = kv_scales_from_stats(stats, turbo_k, turbo_v);
  EXPECT_TRUE(means.k.empty());
  ASSERT_EQ(means.k_mean.size(), size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    ASSERT_EQ(means.k_mean[l].size(), row);
    double spread = 0;
    for (size_t i = 0; i < row; ++i) {
      EXPECT_FLOAT_EQ(means.k_mean[l][i], float(stats.k_sum[l][i] / 128));
      // A mean of stored keys lies within them: |μ| <= max |k| of its head.
      EXPECT_LE(std::fabs(means.k_mean[l][i]), stats.k[l][i / c.head_dim]);
      spread += stats.k_sq[l][i] / 128 - double(means.k_mean[l][i]) * means.k_mean[l][i];
    }
    EXPECT_GT(spread, 0);
  }
  // The queries were seen: every (token, query head) pair of every layer, summed per KV head.
  ASSERT_EQ(stats.q_rows.size(), size_t(c.n_layer));
  ASSERT_EQ(stats.q_sq.size(), size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    EXPECT_EQ(stats.q_rows[l], 128 * (c.n_head / c.n_head_kv)) << "layer " << l;
    for (double x : stats.q_sq[l]) EXPECT_GT(x, 0);
  }
  // Equalization: s_c = sqrt(σ_c / ρ_c) (σ_c the key channel's deviation around μ, ρ_c the
  // queries' RMS in it), mean(s²) = 1 per head.
  ASSERT_EQ(means.k_equal.size(), size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    ASSERT_EQ(means.k_equal[l].size(), row);
    for (int h = 0; h < c.n_head_kv; ++h) {
      std::vector<double> want(c.head_dim);
      double ms = 0;
      for (int d = 0; d < c.head_dim; ++d) {
        const size_t i = size_t(h) * c.head_dim + d;
        const double m = stats.k_sum[l][i] / 128;
        const double rho2 = stats.q_sq[l][i] / double(stats.q_rows[l]);
        want[d] = std::pow((stats.k_sq[l][i] / 128 - m * m) / rho2, 0.25);  // (σ²/ρ²)^(1/4)
        ms += want[d] * want[d] / c.head_dim;
      }
      for (int d = 0; d < c.head_dim; ++d)
        EXPECT_NEAR(means.k_equal[l][size_t(h) * c.head_dim + d], want[d] / std::sqrt(ms), 1e-5);
    }
  }
  // The first key of each window: its mean is the first-key center.
  ASSERT_EQ(means.k_first.size(), size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    ASSERT_EQ(means.k_first[l].size(), row);
    for (size_t i = 0; i < row; ++i) EXPECT_FLOAT_EQ(means.k_first[l][i], float(stats.k_first_sum[l][i] / 2));
  }
  // fp8 takes scales, no means; the stats table has a line per layer.
  EXPECT_TRUE(kv_scales_from_stats(stats, parse_kv_format("fp8_e4m3:head", true), turbo_v).k_mean.empty());
  const std::string table = kv_key_stats_table(stats);
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), c.n_layer + 1);

  const std::string path = ::testing::TempDir() + "/kv_means_test.json";
  write_kv_scales(path, means, "turbo3.5", "turbo3.5", c.n_head_kv, c.head_dim);
  KvScales back = read_kv_scales(path);
  EXPECT_EQ(back.k_mean, means.k_mean);
  EXPECT_EQ(back.k_equal, means.k_equal);
  EXPECT_EQ(back.k_first, means.k_first);
  EXPECT_TRUE(back.k.empty() && back.v.empty());
  std::remove(path.c_str());

  // A turbo cache with key means stores k − μ (with equalization (k − μ)/s): layer 0's keys
  // (the same in every cache: no earlier layer reads it), rotated back with the query side's
  // diagonal (D, or D∘s, which also undoes the 1/s), decode to about the exact keys minus μ.
  // μ is shifted by 5 so the check does not depend on how large this random model's key
  // means are.
  for (auto& r : back.k_mean)
    for (float& m : r) m += 5.0f;
  const auto layer0_keys = [&](Session& sess, const KvFormat& f, bool rotate_back) {
    SequenceBlocks seq;
    EXPECT_TRUE(seq.reserve(sess.pool(), sess.block_size(), 32));
    ForwardBatch b;
    b.add_sequence(seq, sess.block_size(), tokens.data(), 32, ForwardBatch::Logits::None);
    sess.runner().forward(b, nullptr);
    const KvLayerView v = sess.kv().layer(0);
    const KvPageLayout kl = kv_page_layout(f, sess.block_size(), c.head_dim);
    std::vector<float> keys;  // [h][token][d]
    std::vector<float> dec(size_t(sess.block_size()) * c.head_dim);
    for (int h = 0; h < c.n_head_kv; ++h) {
      const KvHeadConstants kc = kv_head_constants(f, v.k_consts, c.n_head_kv, c.head_dim, h);
      for (int blk = 0; blk < 2; ++blk) {
        const auto* page =
            static_cast<const uint8_t*>(v.k) + (int64_t(seq.blocks[blk]) * c.n_head_kv + h) * v.k_page_bytes;
        kv_decode_rows(f, kl, c.head_dim, kc, page, sess.block_size(), dec.data());
        for (int j = 0; rotate_back && j < sess.block_size(); ++j)
          turbo_unrotate(dec.data() + size_t(j) * c.head_dim, kc.signs, c.head_dim);
        keys.insert(keys.end(), dec.begin(), dec.end());
      }
    }
    seq.release_all(sess.pool());
    return keys;
  };
  const std::vector<float> k0 = layer0_keys(exact, kv_format_of(DType::F32), false);
  for (bool equalize : {false, true}) {
    SessionOptions o = tiny(turbo_k);
    o.v_format = turbo_v;
    o.k_mean = back.k_mean;
    if (equalize) o.k_equal = back.k_equal;
    Session q(o);
    const std::vector<float> kq = layer0_keys(q, turbo_k, true);
    double num = 0, den = 0;
    for (size_t i = 0; i < k0.size(); ++i) {
      const int h = int(i / (32 * c.head_dim)), d = int(i % c.head_dim);
      const double want = double(k0[i]) - back.k_mean[0][h * c.head_dim + d];
      num += (kq[i] - want) * (kq[i] - want);
      den += want * want;
    }
    EXPECT_LT(std::sqrt(num / den), 0.25) << "equalized " << equalize;
  }
}

// The score error of a TurboQuant key code is ∝ (Σ σ_c²/s_c²)(Σ ρ_c² s_c²) (near-isotropic
// coding error of (k − μ)/s, read by q∘s). Its minimum over s is (Σ σ_c ρ_c)² (Cauchy–Schwarz);
// the calibration's s must reach it, and every other s (σ^¼, none, perturbations) must not.
TEST(KvCalibration, KeyEqualizationMinimisesTheScoreError) {
  constexpr int kHd = 8, kHeads = 2;
  const double n = 1000, rows = 3000;
  KvStats st;
  st.head_dim = kHd;
  st.tokens = int64_t(n);
  st.windows = 1;
  st.k.assign(1, std::vector<float>(kHeads, 1.0f));
  st.v = st.k;
  st.k_sum.assign(1, std::vector<double>(kHd * kHeads));
  st.k_sq = st.k_within = st.k_first_sum = st.k_first_sq = st.q_sq = st.k_sum;
  st.q_rows = {int64_t(rows)};
  std::vector<double> sigma(kHd * kHeads), rho(kHd * kHeads);
  for (int i = 0; i < kHd * kHeads; ++i) {
    sigma[i] = 0.2 + 0.7 * ((i * 5) % 11);          // key deviations
    rho[i] = 0.1 + 0.9 * ((i * 3) % 7);             // query RMS, unrelated to σ
    if (i % kHd == 2) sigma[i] = 12, rho[i] = 0.3;  // a loud key channel the queries barely read
    const double mu = 0.5 * i - 3;
    st.k_sum[0][i] = n * mu;
    st.k_sq[0][i] = n * (sigma[i] * sigma[i] + mu * mu);
    st.q_sq[0][i] = rows * rho[i] * rho[i];
  }
  const KvScales sc = kv_scales_from_stats(st, parse_kv_format("turbo3.5", true), parse_kv_format("turbo3.5", false));
  ASSERT_EQ(sc.k_equal.size(), 1u);
  const auto error = [&](int h, const std::vector<double>& s) {  // (Σ σ²/s²)(Σ ρ² s²)
    double a = 0, b = 0;
    for (int c = 0; c < kHd; ++c) {
      const int i = h * kHd + c;
      a += sigma[i] * sigma[i] / (s[c] * s[c]);
      b += rho[i] * rho[i] * s[c] * s[c];
    }
    return a * b;
  };
  for (int h = 0; h < kHeads; ++h) {
    std::vector<double> s(kHd), none(kHd, 1.0), quarter(kHd);
    double bound = 0, ms = 0;
    for (int c = 0; c < kHd; ++c) {
      const int i = h * kHd + c;
      s[c] = sc.k_equal[0][i];
      ms += s[c] * s[c] / kHd;
      EXPECT_NEAR(sc.k_mean[0][i], 0.5 * i - 3, 1e-5);
      bound += sigma[i] * rho[i];
      quarter[c] = std::pow(sigma[i], 0.25);
    }
    EXPECT_NEAR(ms, 1.0, 1e-6);
    EXPECT_NEAR(error(h, s), bound * bound, 1e-4 * bound * bound);
    EXPECT_GT(error(h, none), 1.5 * error(h, s));
    EXPECT_GT(error(h, quarter), 1.5 * error(h, s));
    for (int c = 0; c < kHd; ++c)
      for (double f : {0.9, 1.1}) {
        std::vector<double> t = s;
        t[c] *= f;
        EXPECT_GT(error(h, t), error(h, s)) << "head " << h << " channel " << c << " x" << f;
      }
  }
  // Without the queries (a backend that does not show them) there is no equalization to write.
  st.q_sq.clear();
  st.q_rows.clear();
  try {
    kv_scales_from_stats(st, parse_kv_format("turbo3.5", true), parse_kv_format("turbo3.5", false));
    ADD_FAILURE() << "stats without queries were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("queries"), std::string::npos) << e.what();
  }
}

TEST(KvCalibration, BadScaleFilesSayWhatIsWrong) {
  const std::string path = ::testing::TempDir() + "/kv_scales_bad.json";
  auto expect_error = [&](const std::string& text, const std::string& needle) { expect_bad_file(path, text, needle); };
  expect_error("not json", "not JSON");
  expect_error(R"({"k_scales": [[1.0]]})", "no array \"v_scales\"");
  expect_error(R"({"k_scales": [[1.0]], "v_scales": [[-2.0]]})", "scale -2");
  expect_error(R"({"k_scales": [[1.0], [1.0]], "v_scales": [[1.0]]})", "2 K rows and 1 V rows");
  expect_error(R"({"k_scales": [], "v_scales": []})", "no scales and no \"k_mean\"");
  expect_error(R"({"k_scales": [], "v_scales": [], "k_mean": [[1.0, "x"]]})", "\"k_mean\" row 0 holds a non-number");
  expect_error(R"({"k_scales": [], "v_scales": [], "k_mean": [[1.0, 2.0], [1.0]]})", "\"k_mean\" rows of different");
  expect_error(R"({"k_scales": [[1.0]], "v_scales": [[1.0]], "k_mean": [[1.0], [1.0]]})", "1 scale rows and 2");
  expect_error(R"({"n_kv_heads": 2, "head_dim": 4, "k_scales": [], "v_scales": [], "k_mean": [[1.0, 2.0]]})",
               "rows of 2 values, n_kv_heads x head_dim is 8");
  expect_error(R"({"k_scales": [[1.0]], "v_scales": [[1.0]], "k_equal": [[1.0]]})", "\"k_equal\" without \"k_mean\"");
  expect_error(R"({"k_scales": [], "v_scales": [], "k_mean": [[1.0, 2.0]], "k_equal": [[1.0, 0.0]]})",
               "\"k_equal\" row 0 has scale 0");
  expect_error(R"({"k_scales": [], "v_scales": [], "k_mean": [[1.0, 2.0]], "k_equal": [[1.0, 2.0], [1.0, 2.0]]})",
               "2 \"k_equal\" rows and 1 \"k_mean\" rows");
  expect_error(
      R"({"k_scales": [], "v_scales": [], "k_mean": [[1.0, 2.0], [3.0, 4.0]], "k_equal": [[1.0, 2.0], [1.0]]})",
      "\"k_equal\" row 1 has 1 values, \"k_mean\" row 2");
  std::remove(path.c_str());
}

TEST(KvCalibration, PositionAwareCenteringRoundTripsAndOldFilesLoadStatic) {
  // Version 2's "k_rope" (pre-RoPE mean, its equalization, the RoPE) survives a write and read;
  // the static k_mean / k_equal beside it are untouched, and a file without it reads as before.
  const std::string path = ::testing::TempDir() + "/kv_scales_rope.json";
  KvScales s;
  s.k_mean = {{1.0f, 2.0f, 3.0f, 4.0f}, {5.0f, 6.0f, 7.0f, 8.0f}};
  s.k_equal = {{1.0f, 1.0f, 1.0f, 1.0f}, {0.5f, 2.0f, 1.0f, 1.0f}};
  s.rope_dim = 4;
  s.rope_neox = true;
  s.rope_inv_freq = {{1.0f, 0.01f}, {1.0f, 0.001f}};
  s.rope_mean = {{-1.0f, 0.5f, 0.25f, 2.0f}, {3.0f, -3.0f, 0.0f, 1.0f}};
  s.rope_equal = {{2.0f, 0.5f, 1.0f, 1.0f}, {1.0f, 1.0f, 1.5f, 0.5f}};
  write_kv_scales(path, s, "turbo3.5", "turbo3.5", 1, 4);
  KvScales back = read_kv_scales(path);
  EXPECT_EQ(back.k_mean, s.k_mean);
  EXPECT_EQ(back.k_equal, s.k_equal);
  EXPECT_EQ(back.rope_dim, 4);
  EXPECT_TRUE(back.rope_neox);
  EXPECT_EQ(back.rope_inv_freq, s.rope_inv_freq);
  EXPECT_EQ(back.rope_mean, s.rope_mean);
  EXPECT_EQ(back.rope_equal, s.rope_equal);
  s.rope_dim = 0;  // version 1: no "k_rope"
  write_kv_scales(path, s, "turbo3.5", "turbo3.5", 1, 4);
  back = read_kv_scales(path);
  EXPECT_EQ(back.rope_dim, 0);
  EXPECT_TRUE(back.rope_mean.empty());
  EXPECT_EQ(back.k_mean, s.k_mean);
  auto expect_error = [&](const std::string& text, const std::string& needle) { expect_bad_file(path, text, needle); };
  const std::string head = R"({"k_scales": [], "v_scales": [], "k_mean": [[1.0, 2.0]], )";
  expect_error(head + R"("k_rope": {"rot_dim": 2}})", "integer \"rot_dim\" and boolean \"neox\"");
  expect_error(head + R"("k_rope": {"rot_dim": 3, "neox": false}})", "rot_dim 3");
  expect_error(head + R"("k_rope": {"rot_dim": 2, "neox": false, "inv_freq": [[1.0]], "mean": [[1.0]],
                   "equal": [[1.0]]}})",
               "one \"mean\" and \"inv_freq\" row");
  expect_error(head + R"("k_rope": {"rot_dim": 2, "neox": false, "inv_freq": [[1.0, 2.0]], "mean": [[1.0, 2.0]],
                   "equal": [[1.0, 1.0]]}})",
               "inv_freq row of 2 values for rot_dim 2");
  expect_error(head + R"("k_first": [[1.0, 2.0], [3.0, 4.0]]})", "\"k_first\" needs \"k_mean\" beside it");
  expect_error(head + R"("k_first": [[1.0]]})", "\"k_first\" needs \"k_mean\" beside it");
  expect_error(R"({"k_scales": [[1.0]], "v_scales": [[1.0]], "k_first": [[1.0, 2.0]]})", "\"k_first\" needs");
  std::remove(path.c_str());
}
