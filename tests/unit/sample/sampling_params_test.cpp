#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "core/error.h"
#include "sample/sampling_params.h"

using namespace tessera;

namespace {

constexpr int32_t kVocab = 1000;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// validate() must throw a tessera::Error whose message names `name`.
void expect_rejected(const std::function<void(SamplingParams&)>& edit, const std::string& name,
                     const std::string& what) {
  SamplingParams p;
  edit(p);
  try {
    p.validate(kVocab);
    ADD_FAILURE() << name << ": " << what << " was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos)
        << what << " → message does not name '" << name << "': " << e.what();
  }
}

void expect_accepted(const std::function<void(SamplingParams&)>& edit, const std::string& what) {
  SamplingParams p;
  edit(p);
  EXPECT_NO_THROW(p.validate(kVocab)) << what;
}

// Each float parameter rejects NaN and both infinities, plus the listed finite values.
void expect_float_param(const std::string& name, float SamplingParams::*field, std::initializer_list<float> bad,
                        std::initializer_list<float> good) {
  for (float v : {kNaN, -kNaN, kInf, -kInf}) {
    expect_rejected([&](SamplingParams& p) { p.*field = v; }, name, std::to_string(v));
  }
  for (float v : bad) expect_rejected([&](SamplingParams& p) { p.*field = v; }, name, std::to_string(v));
  for (float v : good) expect_accepted([&](SamplingParams& p) { p.*field = v; }, name + "=" + std::to_string(v));
}

}  // namespace

TEST(SamplingParams, DefaultsAreValidAndMeanPlainSampling) {
  SamplingParams p;
  EXPECT_NO_THROW(p.validate(kVocab));
  EXPECT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.top_k, 0);
  EXPECT_EQ(p.top_p, 1.0f);
  EXPECT_EQ(p.min_p, 0.0f);
  EXPECT_EQ(p.repetition_penalty, 1.0f);
  EXPECT_FALSE(p.seed.has_value());
  EXPECT_FALSE(p.greedy());
  p.temperature = 0;
  EXPECT_TRUE(p.greedy());
}

TEST(SamplingParams, FloatParametersRejectNonFiniteAndOutOfRange) {
  expect_float_param("temperature", &SamplingParams::temperature, {-0.001f, 100.01f, -1e30f},
                     {0.0f, 1e-30f, 0.7f, 100.0f});
  expect_float_param("top_p", &SamplingParams::top_p, {0.0f, -0.1f, 1.0001f, 2.0f}, {1e-6f, 0.5f, 1.0f});
  expect_float_param("min_p", &SamplingParams::min_p, {-1e-6f, 1.001f}, {0.0f, 0.05f, 1.0f});
  expect_float_param("repetition_penalty", &SamplingParams::repetition_penalty, {0.0f, -1.0f, 10.5f},
                     {0.01f, 1.0f, 1.3f, 10.0f});
  expect_float_param("presence_penalty", &SamplingParams::presence_penalty, {-2.01f, 2.01f}, {-2.0f, 0.0f, 1.5f, 2.0f});
  expect_float_param("frequency_penalty", &SamplingParams::frequency_penalty, {-2.5f, 3.0f}, {-2.0f, 0.0f, 2.0f});
}

TEST(SamplingParams, TopKIsOffOrWithinVocabulary) {
  for (int32_t k : {-2, -100, kVocab + 1, std::numeric_limits<int32_t>::min()})
    expect_rejected([&](SamplingParams& p) { p.top_k = k; }, "top_k", std::to_string(k));
  for (int32_t k : {-1, 0, 1, 40, kVocab})
    expect_accepted([&](SamplingParams& p) { p.top_k = k; }, "top_k=" + std::to_string(k));
}

TEST(SamplingParams, LogitBiasIdsAndValuesAreChecked) {
  for (int32_t id : {-1, kVocab, kVocab + 5})
    expect_rejected([&](SamplingParams& p) { p.logit_bias[id] = 1.0f; }, "logit_bias", "id " + std::to_string(id));
  for (float v : {kNaN, kInf, -kInf, 100.5f, -101.0f})
    expect_rejected([&](SamplingParams& p) { p.logit_bias[3] = v; }, "logit_bias", "value " + std::to_string(v));
  expect_accepted(
      [](SamplingParams& p) {
        p.logit_bias[0] = -100.0f;
        p.logit_bias[kVocab - 1] = 100.0f;
      },
      "logit_bias at the limits");
}

TEST(SamplingParams, CountsAreBounded) {
  for (int32_t v : {0, -1, SamplingParams::kMaxMaxTokens + 1})
    expect_rejected([&](SamplingParams& p) { p.max_tokens = v; }, "max_tokens", std::to_string(v));
  expect_accepted([](SamplingParams& p) { p.max_tokens = 1; }, "max_tokens=1");
  expect_accepted([](SamplingParams& p) { p.max_tokens = SamplingParams::kMaxMaxTokens; }, "max_tokens at the limit");

  for (int32_t v : {-1, 21, 1000})
    expect_rejected([&](SamplingParams& p) { p.n_logprobs = v; }, "n_logprobs", std::to_string(v));
  expect_accepted([](SamplingParams& p) { p.n_logprobs = 20; }, "n_logprobs=20");

  for (int32_t id : {-1, kVocab})
    expect_rejected(
        [&](SamplingParams& p) {
          p.stop_token_ids = {5, id};
        },
        "stop_token_ids", "id " + std::to_string(id));
  expect_rejected([](SamplingParams& p) { p.stop_token_ids.assign(SamplingParams::kMaxStopTokenIds + 1, 1); },
                  "stop_token_ids", "too many");
  expect_accepted([](SamplingParams& p) { p.stop_token_ids = {0, kVocab - 1}; }, "stop ids");
}

TEST(SamplingParams, VocabularySizeMustBePositive) {
  SamplingParams p;
  EXPECT_THROW(p.validate(0), Error);
  EXPECT_THROW(p.validate(-5), Error);
}
