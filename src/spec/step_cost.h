#pragma once
// What speculation is worth on this device, learned from the engine's own steps, and the draft
// lengths it implies (docs/design/spec-decode.md, "Draft length and the off switch").
//
// A verification step trades serial steps for query rows. Whether that pays depends on how a
// forward's time grows with its rows — nearly flat on a GPU at small batch (bandwidth-bound),
// close to linear on a small CPU or at a large batch (compute-bound) — so it is measured, not
// guessed: StepCostModel keeps the observed step time per row count, and plan_draft_lengths
// picks the draft lengths that maximise expected tokens per second, which is zero drafts when
// nothing pays (the off switch at large batch sizes).
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace tessera {

class StepCostModel {
 public:
  // A forward of `rows` query rows took `seconds` (kept per bucket: rows 1..32 each, then
  // buckets a quarter octave wide; the last kWindow observations of each).
  void observe(int rows, double seconds);
  // The expected seconds of a forward of `rows` rows, from a non-decreasing fit of the recent
  // buckets' medians (more rows never cost less: an outlier — a first step at a new row count that
  // captured a graph or picked a GEMM algorithm, a step slowed by something else on the
  // machine — is pooled with its neighbours instead of making one row count look dear, which
  // the plan would then avoid and so never re-measure). Interpolated linearly between fitted
  // buckets; past the largest observed one, proportional to rows (the pessimistic,
  // compute-bound guess); below the smallest, that bucket's time. 0 when nothing was observed.
  double seconds(int rows) const;
  bool empty() const { return n_known_ == 0; }
  // Whether the bucket of `rows` has an observation.
  bool observed(int rows) const;

  static constexpr int kWindow = 5;  // observations kept per bucket (their median counts)
  // A bucket not observed in the last kMaxAge observations (of any bucket) is left out of the
  // fit, so its estimate comes from its neighbours again: a row count the plan avoids because
  // of one old slow measurement is tried again within a few hundred steps, and measured.
  static constexpr int64_t kMaxAge = 200;

 private:
  struct Bucket {
    double last[kWindow] = {};  // ring of the latest observations
    int n = 0;                  // observations held (<= kWindow)
    int next = 0;               // ring position of the next one
    int64_t seen = 0;           // index of its latest observation
  };
  static int bucket_of(int rows);
  static int rows_of_bucket(int b);
  void fit() const;
  std::vector<Bucket> buckets_;
  int n_known_ = 0;
  int64_t n_observed_ = 0;
  // The fitted curve, rebuilt on the first query after an observation: (representative rows,
  // seconds) of the observed buckets, rows ascending, seconds non-decreasing.
  mutable std::vector<std::pair<int, double>> curve_;
  mutable bool dirty_ = false;
};

// One speculating sequence's inputs to the plan.
struct DraftCandidate {
  double acceptance = 0;  // running per-token acceptance rate (spec/draft_length.h)
  int k_max = 0;          // the most draft tokens it may verify this step
};

// Draft lengths `k` (one per candidate) that maximise the expected tokens per second of the
// step: (base_tokens + Σ_i Σ_{j<=k_i} a_i^j) / (cost(base_rows + Σ k_i) + draft_seconds_per_pos
// · max k_i), where a draft token j of sequence i is kept with probability a_i^j (a run of
// acceptances). For each total n the n most likely tokens are taken (per sequence they come in
// order, a^1 > a^2 > ...), and the best n over 0..Σ k_max wins, so a cost curve with steps
// (kernels changing at some row count) is handled. All zeros when no draft pays or the model
// has seen nothing. base_rows: the rows the step has without drafts; base_tokens: the tokens
// it yields without drafts.
void plan_draft_lengths(const StepCostModel& cost, int base_rows, int base_tokens, double draft_seconds_per_pos,
                        std::span<const DraftCandidate> candidates, std::span<int> k);

}  // namespace tessera
