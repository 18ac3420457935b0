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
  // Equalization: s_c = σ_c^(1/4) (σ_c the channel's deviation around μ), mean(s²) = 1 per head.
  ASSERT_EQ(means.k_equal.size(), size_t(c.n_layer));
  for (int l = 0; l < c.n_layer; ++l) {
    ASSERT_EQ(means.k_equal[l].size(), row);
    for (int h = 0; h < c.n_head_kv; ++h) {
      std::vector<double> want(c.head_dim);
      double ms = 0;
      for (int d = 0; d < c.head_dim; ++d) {
        const size_t i = size_t(h) * c.head_dim + d;
        const double m = stats.k_sum[l][i] / 128;
        want[d] = std::pow(stats.k_sq[l][i] / 128 - m * m, 0.125);  // (σ²)^(1/8)
        ms += want[d] * want[d] / c.head_dim;
      }
      for (int d = 0; d < c.head_dim; ++d)
        EXPECT_NEAR(means.k_equal[l][size_t(h) * c.head_dim + d], want[d] / std::sqrt(ms), 1e-5);
    }
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

TEST(KvCalibration, BadScaleFilesSayWhatIsWrong) {
  const std::string path = ::testing::TempDir() + "/kv_scales_bad.json";
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    FILE* f = std::fopen(path.c_str(), "w");
    std::fputs(text.c_str(), f);
    std::fclose(f);
    try {
      read_kv_scales(path);
      ADD_FAILURE() << "accepted " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
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
