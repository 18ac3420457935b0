// tessera eval kv (eval/kv_eval.h): the comparison itself (KL, top-1, buckets, bits) on the
// real SmolLM2-135M with one short window, so it runs in seconds on 2 cores.
#include "eval/kv_eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/kv_format.h"
#include "engine/session.h"
#include "test_model.h"
#include "tokenizer/tokenizer.h"

using namespace tessera;

TEST(KvEvalMath, KlDivergenceOfKnownDistributions) {
  // p = (1/2, 1/2), q = (1/4, 3/4): KL = 1/2 ln 2 + 1/2 ln(2/3).
  std::vector<float> p = {0.0f, 0.0f}, q = {0.0f, std::log(3.0f)};
  log_softmax_inplace(p);
  log_softmax_inplace(q);
  EXPECT_NEAR(std::exp(q[0]), 0.25, 1e-6);
  EXPECT_NEAR(kl_divergence(p, q), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-6);
  EXPECT_EQ(kl_divergence(p, p), 0.0);
  EXPECT_GT(kl_divergence(q, p), 0.0);
}

namespace {

KvEvalCase make_case(const SessionOptions& base, const std::string& k, const std::string& v = "") {
  auto o = std::make_shared<SessionOptions>(base);
  o->k_format = parse_kv_format(k, true);
  o->v_format = parse_kv_format(v.empty() ? k : v, false);
  return KvEvalCase{v.empty() ? k : k + "/" + v, std::move(o)};
}

}  // namespace

TEST(KvEval, FormatsAgainstF16OnSmolLM2) {
  SessionOptions so;
  so.model = test_model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
  so.backend.threads = 2;
  so.ctx = 96;
  std::ifstream tf(std::string(TESSERA_FIXTURES_DIR) + "/text/licenses_gpl3_apache2.txt", std::ios::binary);
  ASSERT_TRUE(tf);
  std::string text((std::istreambuf_iterator<char>(tf)), std::istreambuf_iterator<char>());
  text.resize(4000);  // enough for one window
  std::vector<int32_t> tokens;
  {
    Session s(so);
    tokens = s.tokenizer().encode(text, false, false);
  }
  ASSERT_GE(tokens.size(), 96u);
  tokens.resize(96);

  const KvEvalCase ref = make_case(so, "f16");
  const std::vector<KvEvalCase> cases = {make_case(so, "f16"), make_case(so, "f32"), make_case(so, "int8"),
                                         make_case(so, "int4:g32"), make_case(so, "turbo3", "f16")};
  KvEvalConfig cfg;
  cfg.window = 96;
  cfg.n_buckets = 4;
  int progress_calls = 0;
  const KvEvalReport rep =
      evaluate_kv_formats(ref, cases, tokens, cfg, [&](const std::string&, int, int) { ++progress_calls; });
  EXPECT_EQ(progress_calls, 6);  // one window per session
  ASSERT_EQ(rep.rows.size(), 6u);
  EXPECT_EQ(rep.n_chunks, 1);
  EXPECT_EQ(rep.n_scored, 96 - 1 - 48);
  EXPECT_EQ(rep.n_positions, 95);
  std::map<std::string, const KvEvalRow*> row;
  for (const auto& r : rep.rows) row[r.label] = &r;  // the second f16 (the case) wins
  const KvEvalRow& f16 = rep.rows[0];
  const KvEvalRow& f16b = rep.rows[1];

  // The reference against itself: the same forward, bit for bit.
  EXPECT_GT(f16.ppl, 1.0);
  EXPECT_EQ(f16b.ppl, f16.ppl);
  EXPECT_EQ(f16b.mean_kl, 0.0);
  EXPECT_EQ(f16b.max_kl, 0.0);
  EXPECT_EQ(f16b.top1, 1.0);
  for (double b : f16b.bucket_kl) EXPECT_EQ(b, 0.0);

  // Bits from the page layout (docs/design/kv-quant.md's table at head_dim 64, block 16).
  EXPECT_DOUBLE_EQ(f16.bits_per_element, 16.0);
  EXPECT_DOUBLE_EQ(row["f32"]->bits_per_element, 32.0);
  EXPECT_DOUBLE_EQ(row["int8"]->k_bits, 8.25);
  EXPECT_DOUBLE_EQ(row["int4:g32"]->v_bits, 5.0);
  EXPECT_DOUBLE_EQ(row["turbo3/f16"]->k_bits, 3.25);  // 3-bit codes + an f16 norm (no QJL)
  EXPECT_DOUBLE_EQ(row["turbo3/f16"]->v_bits, 16.0);

  // f32 is a change of rounding only: small KL. 4-bit per-token keys lose much more than int8.
  const double kl32 = row["f32"]->mean_kl, kl8 = row["int8"]->mean_kl, kl4 = row["int4:g32"]->mean_kl;
  EXPECT_GT(kl32, 0.0);
  EXPECT_LT(kl32, 0.05);
  EXPECT_GT(kl8, 0.0);
  EXPECT_GT(kl4, 2 * kl8);
  EXPECT_GT(kl4, 2 * kl32);
  EXPECT_LE(row["int4:g32"]->top1, row["f32"]->top1);
  for (const auto& r : rep.rows) {
    EXPECT_LE(r.mean_kl, r.max_kl + 1e-12);
    ASSERT_EQ(r.bucket_kl.size(), 4u);
    EXPECT_TRUE(std::isfinite(r.ppl));
  }
  // ppl is exp(mean NLL) over the same scored positions for every row.
  EXPECT_NEAR(std::log(row["int8"]->ppl), row["int8"]->mean_nll, 1e-9);

  // The reports: every row in the markdown, JSON that parses back to the same numbers.
  const std::string md = kv_eval_markdown(rep);
  EXPECT_NE(md.find("| int4:g32 |"), std::string::npos);
  EXPECT_NE(md.find("| turbo3/f16 |"), std::string::npos);
  const auto j = nlohmann::json::parse(kv_eval_json(rep));
  ASSERT_EQ(j.at("rows").size(), 6u);
  EXPECT_EQ(j.at("rows")[4].at("label"), "int4:g32");
  EXPECT_NEAR(j.at("rows")[4].at("mean_kl").get<double>(), kl4, 1e-6 * kl4);
  EXPECT_EQ(j.at("buckets")[0][0], 0);
  EXPECT_EQ(j.at("buckets")[3][1], 95);
}
