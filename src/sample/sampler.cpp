#include "sample/sampler.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <utility>

#include "core/error.h"
#include "sample/row_kernels.h"

namespace tessera {

namespace {

// Rows are processed in chunks: a kernel fills small arrays, then a scalar loop does what
// cannot vectorize (histograms, appends).
constexpr int64_t kChunk = 256;

// Top-p without top-k buckets the vocabulary (row_kernels.h), so only the bucket where the
// mass target is crossed needs ordering. That bucket is sorted once it holds at most
// kSortBoundaryAt tokens; a larger one is split again into kRefineBuckets buckets by logit.
constexpr size_t kSortBoundaryAt = 2048;
constexpr int kRefineBuckets = 1024;
constexpr int kMaxRefineRounds = 8;

// Dense draws (no filter) sum the weights per block of kDrawBlock tokens, pick the block,
// then recompute that block's weights to find the token.
constexpr int64_t kDrawBlock = 4096;

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
  // Temperature 1: (logit - max) / 1 is exactly logit - max.
  const double z = row_kernels().weight_sum(logits.data(), static_cast<int64_t>(logits.size()), s.max, 1.0f);
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
  TESSERA_CHECK(token >= 0 && token < n, "logprobs: token ", token, " outside the row of ", n, " logits");
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
  // Every weight is exp((logit - max) * (1/T)): a multiply per token instead of a divide. A
  // T so small that 1/T overflows gets the largest float, since (logit - max) * inf would be
  // NaN for the max itself; the outcome is the same (only the max has weight).
  const float inv = params_.greedy() ? 1.0f : 1.0f / params_.temperature;
  inv_temperature_ = inv <= std::numeric_limits<float>::max() ? inv : std::numeric_limits<float>::max();
  rng_.seed(seed_);
  penalties_on_ =
      params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
  for (int32_t token : prompt_tokens) {
    TESSERA_CHECK(token >= 0 && token < vocab_size_, "sampling: prompt token ", token, " outside the vocabulary [0, ",
                  vocab_size_, ")");
    if (penalties_on_) history_entry(token);
  }
}

Sampler::HistoryEntry& Sampler::history_entry(int32_t token) {
  const auto [it, inserted] = history_slot_.try_emplace(token, static_cast<int32_t>(history_.size()));
  if (inserted) history_.push_back({token, 0});
  return history_[static_cast<size_t>(it->second)];
}

void Sampler::accept(int32_t token) {
  TESSERA_CHECK(token >= 0 && token < vocab_size_, "sampling: accepted token ", token, " outside the vocabulary [0, ",
                vocab_size_, ")");
  ++n_accepted_;
  if (penalties_on_) ++history_entry(token).output_count;
}

void Sampler::check_row(std::span<const float> logits) const {
  TESSERA_CHECK(static_cast<int64_t>(logits.size()) == vocab_size_, "sampling: logit row has ", logits.size(),
                " entries but the vocabulary has ", vocab_size_);
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
  return static_cast<int32_t>(first_index_of_max(logits, checked_max_logit(logits)));
}

int32_t Sampler::sample(std::span<float> logits) {
  check_row(logits);
  apply_bias_and_penalties(logits);
  if (params_.greedy()) return argmax(logits);
  return draw(logits, select_candidates(logits));
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
    weights_.resize(logits.size());
    row_kernels().weights(logits.data(), static_cast<int64_t>(logits.size()), c.max, inv_temperature_, weights_.data());
    out.resize(weights_.size());
    for (size_t i = 0; i < weights_.size(); ++i) out[i] = {static_cast<int32_t>(i), weights_[i] / c.total};
  } else {
    out.resize(ids_.size());
    for (size_t i = 0; i < ids_.size(); ++i) out[i] = {ids_[i], weights_[i] / c.total};
    std::sort(out.begin(), out.end(), [](const TokenProb& a, const TokenProb& b) { return a.token < b.token; });
  }
  return out;
}

// --- candidate selection -------------------------------------------------------------------

Sampler::Candidates Sampler::select_candidates(std::span<const float> logits) {
  const RowKernels& kernels = row_kernels();
  const float max = checked_max_logit(logits);
  const float inv_t = inv_temperature_;
  const int64_t n = static_cast<int64_t>(logits.size());
  const bool use_top_k = params_.top_k > 0 && params_.top_k < n;
  const bool use_top_p = params_.top_p < 1.0f;
  const bool use_min_p = params_.min_p > 0.0f;
  auto weight_of = [&](float logit) { return exp_nonpositive((logit - max) * inv_t); };
  // min-p: p / p_max >= min_p  <=>  (logit - max) / T >= log(min_p), decided in float64.
  const double log_min_p = use_min_p ? std::log(static_cast<double>(params_.min_p)) : 0.0;
  auto passes_min_p = [&](float logit) {
    return (static_cast<double>(logit) - max) / params_.temperature >= log_min_p;
  };
  ids_.clear();
  weights_.clear();
  Candidates c;
  c.max = max;

  if (use_top_k) {
    select_top_k(logits, params_.top_k, ranked_);  // sorted in candidate order
    size_t keep = ranked_.size();
    weights_.resize(keep);
    for (size_t i = 0; i < keep; ++i) weights_[i] = weight_of(ranked_[i].logit);
    if (use_top_p) {
      // The shortest prefix whose share of the top-k mass reaches top_p.
      const double target =
          static_cast<double>(params_.top_p) * kernels.sum_f64(weights_.data(), static_cast<int64_t>(keep));
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
      size_t n_pass = 0;
      while (n_pass < keep && passes_min_p(ranked_[n_pass].logit)) ++n_pass;
      keep = n_pass;
    }
    weights_.resize(keep);
    ids_.resize(keep);
    for (size_t i = 0; i < keep; ++i) ids_[i] = ranked_[i].id;
  } else if (use_top_p) {
    select_top_p_over_vocabulary(logits, max);
    if (use_min_p) keep_min_p(logits, max);
  } else if (use_min_p) {
    // A float threshold a little below the exact one finds the candidates fast; the exact
    // float64 test then decides.
    const double exact = static_cast<double>(max) + static_cast<double>(params_.temperature) * log_min_p;
    const float loose = static_cast<float>(exact - 1e-6 * std::abs(exact) - 1e-6);
    std::array<int32_t, kChunk + 8> index;
    for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
      const int64_t count = kernels.collect_greater(logits.data() + i0, std::min(kChunk, n - i0), loose,
                                                    static_cast<int32_t>(i0), index.data());
      for (int64_t j = 0; j < count; ++j) {
        const float logit = logits[index[j]];
        if (passes_min_p(logit)) {
          ids_.push_back(index[j]);
          weights_.push_back(weight_of(logit));
        }
      }
    }
  } else {
    // Every token: only the mass of each block is kept; draw() recomputes one block.
    c.dense = true;
    block_mass_.clear();
    for (int64_t b0 = 0; b0 < n; b0 += kDrawBlock)
      block_mass_.push_back(kernels.weight_sum(logits.data() + b0, std::min(kDrawBlock, n - b0), max, inv_t));
    c.total = 0;
    for (double m : block_mass_) c.total += m;
    return c;
  }
  c.total = kernels.sum_f64(weights_.data(), static_cast<int64_t>(weights_.size()));
  return c;
}

void Sampler::select_top_p_over_vocabulary(std::span<const float> logits, float max) {
  const RowKernels& kernels = row_kernels();
  const float inv_t = inv_temperature_;
  const float* x = logits.data();
  const int64_t n = static_cast<int64_t>(logits.size());
  const double top_p = params_.top_p;

  // Pass 1: the total mass, and the mass of each bucket down to `cut`. Tokens below
  // t = log((1 - top_p) / 2n) together weigh at most (1 - top_p) / 2 (the max weighs 1, so
  // the total is at least 1): the target top_p * total is always reached above them, and
  // they need no histogram. On real logit rows that skips most of the vocabulary.
  const double skippable_t = std::log((1.0 - top_p) * 0.5 / static_cast<double>(n));
  const int32_t cut =
      static_cast<int32_t>(std::min<double>(kTopPBuckets - 1, std::floor(-skippable_t * kTopPBucketsPerUnit)));
  // The scatter-add is scalar; four histograms (token j into histogram j % 4) keep runs of
  // same-bucket tokens from forming one long dependency chain; they are combined in a
  // fixed order.
  constexpr int kHistograms = 4;
  std::array<std::array<double, kTopPBuckets>, kHistograms> hist{};
  std::array<float, kChunk> w;
  std::array<int32_t, kChunk> bucket;
  std::array<int32_t, kChunk + 8> index;
  double total = 0;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t len = std::min(kChunk, n - i0);
    kernels.weights_and_buckets(x + i0, len, max, inv_t, w.data(), bucket.data());
    total += kernels.sum_f64(w.data(), len);
    // Collecting the tokens above the cut first keeps the scatter loop free of branches
    // that real rows would mispredict.
    const int64_t count = kernels.collect_at_most(bucket.data(), len, cut, 0, index.data());
    for (int64_t j = 0; j < count; ++j) hist[j % kHistograms][bucket[index[j]]] += w[index[j]];
  }
  const double target = top_p * total;
  // The bucket where the cumulative mass, from the top, reaches the target.
  int32_t boundary = 0;
  double before = 0;
  while (true) {
    const double mass = (hist[0][boundary] + hist[1][boundary]) + (hist[2][boundary] + hist[3][boundary]);
    if (before + mass >= target || boundary == cut) break;
    before += mass;
    ++boundary;
  }

  // Pass 2: every token above that bucket is kept; the bucket itself is resolved exactly.
  // Tokens in buckets <= boundary have t > -(boundary + 1) / kTopPBucketsPerUnit; a logit
  // threshold a little below that edge finds them (and a few from the next bucket, which
  // the exact bucket test then drops), so the rest of the row is skipped at scan speed.
  float loose = -std::numeric_limits<float>::infinity();
  if (boundary < kTopPBuckets - 1) {
    const double edge = static_cast<double>(max) - (boundary + 1) / kTopPBucketsPerUnit / static_cast<double>(inv_t);
    loose = static_cast<float>(edge - 1e-4 * (std::abs(edge) + std::abs(max)) - 1e-6);
  }
  boundary_.clear();
  std::array<float, kChunk> gathered;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t count =
        kernels.collect_greater(x + i0, std::min(kChunk, n - i0), loose, static_cast<int32_t>(i0), index.data());
    if (count == 0) continue;
    // The same kernel on the same logits gives the same weights and buckets as pass 1.
    for (int64_t j = 0; j < count; ++j) gathered[j] = x[index[j]];
    kernels.weights_and_buckets(gathered.data(), count, max, inv_t, w.data(), bucket.data());
    for (int64_t j = 0; j < count; ++j) {
      if (bucket[j] < boundary) {
        ids_.push_back(index[j]);
        weights_.push_back(w[j]);
      } else if (bucket[j] == boundary) {
        boundary_.push_back({gathered[j], index[j]});
      }
    }
  }
  resolve_top_p_boundary(max, target - before);
}

// Appends to ids_/weights_ the shortest candidate-order prefix of boundary_ (tokens in id
// order) whose mass reaches `need`. Large sets are split by logit into buckets again, so only
// a small final set is sorted.
void Sampler::resolve_top_p_boundary(float max, double need) {
  const float inv_t = inv_temperature_;
  auto weight_of = [&](float logit) { return exp_nonpositive((logit - max) * inv_t); };
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
  // The same float64 test as in select_candidates.
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

int32_t Sampler::draw(std::span<const float> logits, const Candidates& c) {
  // One 64-bit output per draw, mapped to a double in [0, 1) by its top 53 bits: exact and
  // the same everywhere (std::uniform_real_distribution is implementation-defined).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
  const double target = u * c.total;
  // The token whose cumulative weight interval [cum - w, cum) holds the target; weight-0
  // tokens have empty intervals and are never chosen.
  if (c.dense) {
    // The walk stops at the last block with mass at the latest (the max's block has mass),
    // so the chosen block always holds a token of positive weight.
    size_t last = block_mass_.size() - 1;
    while (block_mass_[last] == 0) --last;
    size_t block = 0;
    double cum = 0;
    while (block < last && cum + block_mass_[block] <= target) cum += block_mass_[block++];
    const int64_t b0 = static_cast<int64_t>(block) * kDrawBlock;
    const int64_t len = std::min(kDrawBlock, static_cast<int64_t>(logits.size()) - b0);
    weights_.resize(static_cast<size_t>(len));
    row_kernels().weights(logits.data() + b0, len, c.max, inv_temperature_, weights_.data());
    for (int64_t j = 0; j < len; ++j) {
      cum += weights_[j];
      if (cum > target) return static_cast<int32_t>(b0 + j);
    }
    // Rounding left the target past the block's last interval: its last possible token.
    for (int64_t j = len; j-- > 0;)
      if (weights_[j] > 0) return static_cast<int32_t>(b0 + j);
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
