#include "spec/step_cost.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace tessera {

namespace {
constexpr int kExact = 32;                             // rows 1..32 have a bucket each
constexpr int kPerOctave = 4;                          // past that, buckets a quarter octave wide
constexpr int kMaxBuckets = kExact + kPerOctave * 20;  // up to 32 · 2^20 rows
}  // namespace

int StepCostModel::bucket_of(int rows) {
  if (rows <= kExact) return rows - 1;
  const double octaves = std::log2(static_cast<double>(rows) / kExact);
  return std::min(kMaxBuckets - 1, kExact + static_cast<int>(std::lround(octaves * kPerOctave)));
}

int StepCostModel::rows_of_bucket(int b) {
  if (b < kExact) return b + 1;
  return static_cast<int>(std::lround(kExact * std::exp2(static_cast<double>(b - kExact) / kPerOctave)));
}

void StepCostModel::observe(int rows, double seconds) {
  TESSERA_CHECK(rows >= 1 && seconds >= 0 && std::isfinite(seconds), "step cost: bad observation of ", rows,
                " rows in ", seconds, " s");
  const int b = bucket_of(rows);
  if (static_cast<int>(buckets_.size()) <= b) buckets_.resize(b + 1);
  Bucket& k = buckets_[b];
  if (k.n == 0) ++n_known_;
  k.last[k.next] = seconds;
  k.next = (k.next + 1) % kWindow;
  k.n = std::min(k.n + 1, kWindow);
  k.seen = ++n_observed_;
  dirty_ = true;
}

bool StepCostModel::observed(int rows) const {
  const int b = bucket_of(std::max(rows, 1));
  return b < static_cast<int>(buckets_.size()) && buckets_[b].n > 0;
}

// Pool-adjacent-violators over the buckets' medians, each weighted by its observations: the
// non-decreasing curve closest to them in weighted least squares.
void StepCostModel::fit() const {
  struct Block {
    double sum_wy, sum_w;
    int n_points;
  };
  std::vector<Block> blocks;
  std::vector<int> rows;
  for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
    const Bucket& k = buckets_[b];
    if (k.n == 0 || n_observed_ - k.seen > kMaxAge) continue;  // never, or not lately, observed
    double v[kWindow];
    for (int i = 0; i < k.n; ++i) {  // insertion sort of at most kWindow values
      int j = i;
      for (; j > 0 && v[j - 1] > k.last[i]; --j) v[j] = v[j - 1];
      v[j] = k.last[i];
    }
    const double median = k.n % 2 ? v[k.n / 2] : 0.5 * (v[k.n / 2 - 1] + v[k.n / 2]);
    rows.push_back(rows_of_bucket(b));
    blocks.push_back({median * k.n, static_cast<double>(k.n), 1});
    while (blocks.size() > 1) {
      const Block& hi = blocks.back();
      const Block& lo = blocks[blocks.size() - 2];
      if (lo.sum_wy / lo.sum_w <= hi.sum_wy / hi.sum_w) break;
      const Block merged{lo.sum_wy + hi.sum_wy, lo.sum_w + hi.sum_w, lo.n_points + hi.n_points};
      blocks.pop_back();
      blocks.back() = merged;
    }
  }
  curve_.clear();
  size_t i = 0;
  for (const Block& bl : blocks)
    for (int j = 0; j < bl.n_points; ++j) curve_.emplace_back(rows[i++], bl.sum_wy / bl.sum_w);
  dirty_ = false;
}

double StepCostModel::seconds(int rows) const {
  if (n_known_ == 0) return 0;
  if (dirty_) fit();
  rows = std::max(rows, 1);
  // The nearest fitted point at or below `rows` and the nearest above it.
  const auto hi = std::upper_bound(curve_.begin(), curve_.end(), rows,
                                   [](int r, const std::pair<int, double>& p) { return r < p.first; });
  if (hi == curve_.begin()) return hi->second;  // below every observation: the smallest one's time
  const auto lo = hi - 1;
  const double r_lo = lo->first;
  if (hi == curve_.end()) return lo->second * static_cast<double>(rows) / r_lo;  // past them: proportional
  const double r_hi = hi->first;
  return lo->second + (hi->second - lo->second) * (static_cast<double>(rows) - r_lo) / (r_hi - r_lo);
}

void plan_draft_lengths(const StepCostModel& cost, int base_rows, int base_tokens, double draft_seconds_per_pos,
                        std::span<const DraftCandidate> candidates, std::span<int> k) {
  TESSERA_CHECK(k.size() == candidates.size(), "plan_draft_lengths: ", k.size(), " outputs for ", candidates.size(),
                " candidates");
  std::fill(k.begin(), k.end(), 0);
  if (cost.empty() || candidates.empty()) return;
  struct Gain {
    double p;  // probability that this draft token is kept
    int seq;
  };
  std::vector<Gain> gains;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const double a = std::clamp(candidates[i].acceptance, 0.0, 1.0);
    double p = 1;
    for (int j = 0; j < candidates[i].k_max; ++j) gains.push_back({p *= a, static_cast<int>(i)});
  }
  // Per sequence a^1 > a^2 > ..., so this order takes each sequence's tokens in order.
  std::stable_sort(gains.begin(), gains.end(), [](const Gain& x, const Gain& y) { return x.p > y.p; });
  const double t0 = cost.seconds(base_rows);
  if (!(t0 > 0)) return;
  double best = base_tokens / t0;
  size_t best_n = 0;
  double expected = base_tokens;
  int max_k = 0;
  std::vector<int> count(candidates.size(), 0);
  for (size_t n = 1; n <= gains.size(); ++n) {
    expected += gains[n - 1].p;
    max_k = std::max(max_k, ++count[gains[n - 1].seq]);
    const double rate = expected / (cost.seconds(base_rows + static_cast<int>(n)) + draft_seconds_per_pos * max_k);
    if (rate > best * (1 + 1e-9)) best = rate, best_n = n;
  }
  for (size_t n = 0; n < best_n; ++n) ++k[gains[n].seq];
}

}  // namespace tessera
