#include "sample/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"

namespace tessera {

namespace {

// Rows are processed in chunks: a vectorizable loop fills small arrays, then a scalar loop
// does the part that cannot vectorize (histograms, appends).
constexpr int64_t kChunk = 256;

// Top-p without top-k avoids sorting the vocabulary by bucketing tokens on their scaled
// logit t = (logit - max) / T <= 0. Bucket b holds t in (-(b+1)/kBucketsPerUnit,
// -b/kBucketsPerUnit]; the last bucket also holds everything below (weights < e^-64).
constexpr int kTopPBuckets = 1024;
constexpr float kBucketsPerUnit = kTopPBuckets / 64.0f;
// The bucket where the mass target is crossed is sorted once it holds at most this many
// tokens; a larger one is split again into kRefineBuckets buckets by logit.
constexpr size_t kSortBoundaryAt = 2048;
constexpr int kRefineBuckets = 1024;
constexpr int kMaxRefineRounds = 8;

// Dense draws (no filter) find the block first, then the token inside it.
constexpr int64_t kDrawBlock = 4096;

inline int top_p_bucket(float t) {
  const float key = -t * kBucketsPerUnit;
  return key < static_cast<float>(kTopPBuckets - 1) ? static_cast<int>(key) : kTopPBuckets - 1;
}

uint64_t nondeterministic_seed() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ static_cast<uint64_t>(device());
}

// log_softmax of a raw row, summarized: the max, log of the max-subtracted partition sum,
// and the n most likely tokens.
struct LogSoftmaxSummary {
  float max = 0;
  double log_z = 0;
  std::vector<TokenLogprob> top;
  double logprob(float logit) const { return (static_cast<double>(logit) - max) - log_z; }
};

LogSoftmaxSummary summarize_log_softmax(std::span<const float> logits, int32_t n_top) {
  LogSoftmaxSummary s;
  s.max = checked_max_logit(logits);
  const int64_t n = static_cast<int64_t>(logits.size());
  std::array<float, kChunk> weight;
  double z = 0;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    for (int64_t j = 0; j < len; ++j) weight[j] = exp_nonpositive(logits[i0 + j] - s.max);
    z += sum_f64(std::span<const float>(weight.data(), static_cast<size_t>(len)));
  }
  s.log_z = std::log(z);  // z >= 1: the max contributes exp(0)
  std::vector<ScoredToken> best;
  select_top_k(logits, n_top, best);
  s.top.reserve(best.size());
  for (const ScoredToken& b : best) s.top.push_back({b.id, s.logprob(b.logit)});
  return s;
}

}  // namespace

Logprobs compute_logprobs(std::span<const float> logits, int32_t token, int32_t n_top) {
  const int64_t n = static_cast<int64_t>(logits.size());
  TESSERA_CHECK(token >= 0 && token < n, "logprobs: token ", token, " outside the row of ", n,
                " logits");
  TESSERA_CHECK(n_top >= 0 && n_top <= n, "logprobs: n_top ", n_top, " outside [0, ", n, "]");
  LogSoftmaxSummary s = summarize_log_softmax(logits, n_top);
  Logprobs out;
  out.chosen = {token, s.logprob(logits[token])};
  out.top = std::move(s.top);
  return out;
}

Sampler::Sampler(SamplingParams params, int32_t vocab_size, std::span<const int32_t> prompt_tokens)
    : params_(std::move(params)), vocab_size_(vocab_size) {
  params_.validate(vocab_size);
  seed_ = params_.seed ? *params_.seed : nondeterministic_seed();
  rng_.seed(seed_);
  penalties_on_ = params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f ||
                  params_.frequency_penalty != 0.0f;
  for (int32_t token : prompt_tokens) {
    TESSERA_CHECK(token >= 0 && token < vocab_size_, "sampling: prompt token ", token,
                  " outside the vocabulary [0, ", vocab_size_, ")");
    if (penalties_on_) history_entry(token);
  }
}

Sampler::HistoryEntry& Sampler::history_entry(int32_t token) {
  const auto [it, inserted] =
      history_slot_.try_emplace(token, static_cast<int32_t>(history_.size()));
  if (inserted) history_.push_back({token, 0});
  return history_[static_cast<size_t>(it->second)];
}

void Sampler::accept(int32_t token) {
  TESSERA_CHECK(token >= 0 && token < vocab_size_, "sampling: accepted token ", token,
                " outside the vocabulary [0, ", vocab_size_, ")");
  ++n_accepted_;
  if (penalties_on_) ++history_entry(token).output_count;
}

void Sampler::check_row(std::span<const float> logits) const {
  TESSERA_CHECK(static_cast<int64_t>(logits.size()) == vocab_size_, "sampling: logit row has ",
                logits.size(), " entries but the vocabulary has ", vocab_size_);
}

void Sampler::remember_original(std::span<const float> logits, int32_t token) {
  if (remember_originals_) originals_.push_back({logits[token], token});
}

void Sampler::apply_bias_and_penalties(std::span<float> logits) {
  originals_.clear();
  for (const auto& [token, bias] : params_.logit_bias) {
    remember_original(logits, token);
    logits[token] += bias;
  }
  if (!penalties_on_) return;
  const float repetition = params_.repetition_penalty;
  for (const HistoryEntry& h : history_) {
    remember_original(logits, h.token);
    float l = logits[h.token];
    // Dividing a positive logit and multiplying a negative one both make the token less
    // likely (llama.cpp and Hugging Face semantics).
    if (repetition != 1.0f) l = l > 0.0f ? l / repetition : l * repetition;
    if (h.output_count > 0) {
      l -= params_.frequency_penalty * static_cast<float>(h.output_count);
      l -= params_.presence_penalty;
    }
    logits[h.token] = l;
  }
}

int32_t Sampler::argmax(std::span<const float> logits) const {
  const float max = checked_max_logit(logits);
  return static_cast<int32_t>(std::find(logits.begin(), logits.end(), max) - logits.begin());
}

int32_t Sampler::sample(std::span<float> logits) {
  check_row(logits);
  apply_bias_and_penalties(logits);
  if (params_.greedy()) return argmax(logits);
  return draw(select_candidates(logits));
}

SampleResult Sampler::sample_with_logprobs(std::span<float> logits) {
  check_row(logits);
  // The raw distribution is summarized before bias and penalties touch the row; the chosen
  // token's raw logit is recovered from the originals remembered while they are applied.
  LogSoftmaxSummary raw = summarize_log_softmax(logits, params_.n_logprobs);
  remember_originals_ = true;
  SampleResult result;
  try {
    result.token = sample(logits);
  } catch (...) {
    remember_originals_ = false;
    throw;
  }
  remember_originals_ = false;
  float raw_logit = logits[result.token];
  for (const ScoredToken& o : originals_) {
    if (o.id == result.token) {
      raw_logit = o.logit;  // the first record is the value before any change
      break;
    }
  }
  result.logprobs.chosen = {result.token, raw.logprob(raw_logit)};
  result.logprobs.top = std::move(raw.top);
  return result;
}

std::vector<TokenProb> Sampler::distribution(std::span<float> logits) {
  check_row(logits);
  apply_bias_and_penalties(logits);
  if (params_.greedy()) return {{argmax(logits), 1.0}};
  const Candidates c = select_candidates(logits);
  std::vector<TokenProb> out;
  if (c.dense) {
    out.resize(weights_.size());
    for (size_t i = 0; i < weights_.size(); ++i)
      out[i] = {static_cast<int32_t>(i), weights_[i] / c.total};
  } else {
    out.resize(ids_.size());
    for (size_t i = 0; i < ids_.size(); ++i) out[i] = {ids_[i], weights_[i] / c.total};
    std::sort(out.begin(), out.end(),
              [](const TokenProb& a, const TokenProb& b) { return a.token < b.token; });
  }
  return out;
}

// --- candidate selection -------------------------------------------------------------------

Sampler::Candidates Sampler::select_candidates(std::span<const float> logits) {
  const float max = checked_max_logit(logits);
  const float temperature = params_.temperature;
  const int64_t n = static_cast<int64_t>(logits.size());
  const bool use_top_k = params_.top_k > 0 && params_.top_k < n;
  const bool use_top_p = params_.top_p < 1.0f;
  const bool use_min_p = params_.min_p > 0.0f;
  // Division, not multiplication by 1/T: with a tiny T, 1/T overflows and 0 * inf is NaN,
  // while (logit - max) / T is 0 for the max and -inf or very negative for the rest.
  auto weight_of = [&](float logit) { return exp_nonpositive((logit - max) / temperature); };
  ids_.clear();
  weights_.clear();
  Candidates c;

  if (use_top_k) {
    select_top_k(logits, params_.top_k, ranked_);  // sorted in candidate order
    size_t keep = ranked_.size();
    weights_.resize(keep);
    for (size_t i = 0; i < keep; ++i) weights_[i] = weight_of(ranked_[i].logit);
    if (use_top_p) {
      // The shortest prefix whose share of the top-k mass reaches top_p.
      const double target = static_cast<double>(params_.top_p) * sum_f64(weights_);
      double cum = 0;
      for (size_t i = 0; i < keep; ++i) {
        cum += weights_[i];
        if (cum >= target) {
          keep = i + 1;
          break;
        }
      }
    }
    if (use_min_p) {
      // The candidates are in logit order, so min-p keeps a prefix too.
      const double log_min_p = std::log(static_cast<double>(params_.min_p));
      size_t n_pass = 0;
      while (n_pass < keep && (static_cast<double>(ranked_[n_pass].logit) - max) / temperature >=
                                  log_min_p)
        ++n_pass;
      keep = n_pass;
    }
    weights_.resize(keep);
    ids_.resize(keep);
    for (size_t i = 0; i < keep; ++i) ids_[i] = ranked_[i].id;
  } else if (use_top_p) {
    select_top_p_over_vocabulary(logits, max);
    if (use_min_p) keep_min_p(logits, max);
  } else if (use_min_p) {
    const double log_min_p = std::log(static_cast<double>(params_.min_p));
    for (int64_t i = 0; i < n; ++i) {
      if ((static_cast<double>(logits[i]) - max) / temperature >= log_min_p) {
        ids_.push_back(static_cast<int32_t>(i));
        weights_.push_back(weight_of(logits[i]));
      }
    }
  } else {
    // Every token: weights for the whole row, and the mass of each block for the draw.
    c.dense = true;
    weights_.resize(static_cast<size_t>(n));
    block_mass_.clear();
    for (int64_t b0 = 0; b0 < n; b0 += kDrawBlock) {
      const int64_t len = std::min(kDrawBlock, n - b0);
      float* w = weights_.data() + b0;
      for (int64_t j = 0; j < len; ++j) w[j] = exp_nonpositive((logits[b0 + j] - max) / temperature);
      block_mass_.push_back(sum_f64(std::span<const float>(w, static_cast<size_t>(len))));
    }
    c.total = 0;
    for (double m : block_mass_) c.total += m;
    return c;
  }
  c.total = sum_f64(weights_);
  return c;
}

void Sampler::select_top_p_over_vocabulary(std::span<const float> logits, float max) {
  const float temperature = params_.temperature;
  const int64_t n = static_cast<int64_t>(logits.size());
  std::array<float, kChunk> t;
  std::array<float, kChunk> w;
  std::array<int, kChunk> bucket;
  auto fill_chunk = [&](int64_t i0, int64_t len) {
    for (int64_t j = 0; j < len; ++j) {
      t[j] = (logits[i0 + j] - max) / temperature;
      w[j] = exp_nonpositive(t[j]);
      bucket[j] = top_p_bucket(t[j]);
    }
  };

  // Pass 1: the probability mass of each bucket.
  std::array<double, kTopPBuckets> mass{};
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    fill_chunk(i0, len);
    for (int64_t j = 0; j < len; ++j) mass[bucket[j]] += w[j];
  }
  double total = 0;
  for (double m : mass) total += m;
  const double target = static_cast<double>(params_.top_p) * total;
  // The bucket where the cumulative mass, from the top, reaches the target.
  int boundary = 0;
  double before = 0;
  while (boundary < kTopPBuckets - 1 && before + mass[boundary] < target)
    before += mass[boundary++];

  // Pass 2: every token above that bucket is kept; the bucket itself is resolved exactly.
  boundary_.clear();
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    fill_chunk(i0, len);
    bool any = false;
    for (int64_t j = 0; j < len; ++j) any |= bucket[j] <= boundary;
    if (!any) continue;
    for (int64_t j = 0; j < len; ++j) {
      if (bucket[j] < boundary) {
        ids_.push_back(static_cast<int32_t>(i0 + j));
        weights_.push_back(w[j]);
      } else if (bucket[j] == boundary) {
        boundary_.push_back({logits[i0 + j], static_cast<int32_t>(i0 + j)});
      }
    }
  }
  resolve_top_p_boundary(max, target - before);
}

// Appends to ids_/weights_ the shortest candidate-order prefix of boundary_ (tokens in id
// order) whose mass reaches `need`. Large sets are split by logit into buckets again, so only
// a small final set is sorted.
void Sampler::resolve_top_p_boundary(float max, double need) {
  const float temperature = params_.temperature;
  auto weight_of = [&](float logit) { return exp_nonpositive((logit - max) / temperature); };
  for (int round = 0; round < kMaxRefineRounds && boundary_.size() > kSortBoundaryAt; ++round) {
    float lo = std::numeric_limits<float>::infinity();  // lowest finite logit
    float hi = -std::numeric_limits<float>::infinity();
    for (const ScoredToken& e : boundary_) {
      if (e.logit > -std::numeric_limits<float>::infinity()) lo = std::min(lo, e.logit);
      hi = std::max(hi, e.logit);
    }
    if (!(hi > lo)) break;  // all equal: the id order already is the candidate order
    // In float64 so that a tiny range cannot overflow the scale.
    const double scale = kRefineBuckets / (static_cast<double>(hi) - lo);
    auto sub_bucket = [&](float logit) {
      if (logit < lo) return kRefineBuckets - 1;  // -inf
      const double key = (static_cast<double>(hi) - logit) * scale;
      return key < kRefineBuckets - 1 ? static_cast<int>(key) : kRefineBuckets - 1;
    };
    std::array<double, kRefineBuckets> mass{};
    for (const ScoredToken& e : boundary_) mass[sub_bucket(e.logit)] += weight_of(e.logit);
    int sub = 0;
    double before = 0;
    while (sub < kRefineBuckets - 1 && before + mass[sub] < need) before += mass[sub++];
    boundary_next_.clear();
    for (const ScoredToken& e : boundary_) {
      const int s = sub_bucket(e.logit);
      if (s < sub) {
        ids_.push_back(e.id);
        weights_.push_back(weight_of(e.logit));
      } else if (s == sub) {
        boundary_next_.push_back(e);
      }
    }
    need -= before;
    std::swap(boundary_, boundary_next_);  // strictly smaller: hi and lo fall in different buckets
  }
  if (!std::is_sorted(boundary_.begin(), boundary_.end(), ranks_before))
    std::sort(boundary_.begin(), boundary_.end(), ranks_before);
  double cum = 0;
  for (const ScoredToken& e : boundary_) {
    const float w = weight_of(e.logit);
    ids_.push_back(e.id);
    weights_.push_back(w);
    cum += w;
    if (cum >= need) break;
  }
}

void Sampler::keep_min_p(std::span<const float> logits, float max) {
  // p / p_max >= min_p  <=>  (logit - max) / T >= log(min_p), without computing p.
  const double log_min_p = std::log(static_cast<double>(params_.min_p));
  size_t out = 0;
  for (size_t i = 0; i < ids_.size(); ++i) {
    if ((static_cast<double>(logits[ids_[i]]) - max) / params_.temperature >= log_min_p) {
      ids_[out] = ids_[i];
      weights_[out] = weights_[i];
      ++out;
    }
  }
  ids_.resize(out);
  weights_.resize(out);
}

// --- the draw ------------------------------------------------------------------------------

int32_t Sampler::draw(const Candidates& c) {
  // One 64-bit output per draw, mapped to a double in [0, 1) by its top 53 bits: exact and
  // the same everywhere (std::uniform_real_distribution is implementation-defined).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  const double target = u * c.total;
  // The token whose cumulative weight interval [cum - w, cum) holds the target; weight-0
  // tokens have empty intervals and are never chosen.
  if (c.dense) {
    const size_t n = weights_.size();
    size_t block = 0;
    double cum = 0;
    while (block + 1 < block_mass_.size() && cum + block_mass_[block] <= target)
      cum += block_mass_[block++];
    for (size_t i = block * kDrawBlock; i < n; ++i) {
      cum += weights_[i];
      if (cum > target) return static_cast<int32_t>(i);
    }
    // Rounding left the target past the last interval: take the last possible token.
    for (size_t i = n; i-- > 0;)
      if (weights_[i] > 0) return static_cast<int32_t>(i);
  } else {
    double cum = 0;
    for (size_t i = 0; i < ids_.size(); ++i) {
      cum += weights_[i];
      if (cum > target) return ids_[i];
    }
    for (size_t i = ids_.size(); i-- > 0;)
      if (weights_[i] > 0) return ids_[i];
  }
  fail("sampling: no candidate token has a positive probability");
}

}  // namespace tessera
