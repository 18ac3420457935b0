// Static KV scales from a calibration pass: the scales are amax / 448, and a cache using them
// stores the largest value at (nearly) the largest fp8 code without ever saturating.
#include <gtest/gtest.h>

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
  const KvAbsMax amax = measure_kv_absmax(exact, tokens, 64, 0);
  const ModelConfig& c = exact.config();
  ASSERT_EQ(amax.k.size(), static_cast<size_t>(c.n_layer));
  EXPECT_EQ(amax.tokens, 128);
  const KvFormat head = parse_kv_format("fp8_e4m3:head", true), tensor = parse_kv_format("fp8_e4m3", true);
  const KvScales per_head = kv_scales_from_absmax(amax, head, head);
  const KvScales per_tensor = kv_scales_from_absmax(amax, tensor, tensor);
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
  EXPECT_TRUE(kv_scales_from_absmax(amax, parse_kv_format("int8", true), parse_kv_format("int8", false)).k.empty());

  // The same windows through a cache with the per-head scales: the largest key lands on a
  // code of magnitude 448 (the amax token itself), none beyond (no saturation).
  const std::string path = ::testing::TempDir() + "/kv_scales_test.json";
  write_kv_scales(path, per_head, "fp8_e4m3:head", "fp8_e4m3:head", c.n_head_kv);
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
  std::remove(path.c_str());
}
