#include "engine/executor_pp.h"

#include <algorithm>
#include <string>

#include "core/error.h"
#include "kv/kv_host_ops.h"

namespace tessera {

PipelineParallelExecutor::PipelineParallelExecutor(ParallelRanks& ranks, int max_batch_tokens, int max_logits_rows,
                                                   int n_host_blocks)
    : ParallelExecutor(ranks, ranks.layout().sampling_rank(), max_batch_tokens, max_logits_rows, n_host_blocks) {
  TESSERA_CHECK(ranks.layout().pipelined(), "pipeline executor: the ranks are not pipeline stages");
}

void PipelineParallelExecutor::split(const StepInput& in, int parts) {
  const ForwardBatch& b = in.batch;
  const int n_seqs = b.n_seqs();
  parts = std::max(1, std::min(parts, n_seqs));
  micro_.resize(parts);
  // Cut after the sequence that brings micro-batch m to its share of the tokens, keeping at
  // least one sequence for each micro-batch after it.
  std::vector<int> first(parts + 1, n_seqs);
  first[0] = 0;
  int m = 1;
  for (int s = 1; s < n_seqs && m < parts; ++s) {
    const int64_t share = static_cast<int64_t>(b.n_tokens()) * m / parts;
    if (b.q_start[s] >= share || n_seqs - s <= parts - m) first[m++] = s;
  }
  // Which micro-batch, and which of its logits rows, each of the step's logits rows is.
  const size_t n_rows = b.logits_rows.size();
  std::vector<int> micro_of(n_rows), row_in(n_rows);
  std::vector<int> rows_so_far(parts, 0);
  for (size_t i = 0; i < n_rows; ++i) {
    const int row = b.logits_rows[i];
    int mb = parts - 1;
    while (mb > 0 && row < b.q_start[first[mb]]) --mb;
    micro_of[i] = mb;
    row_in[i] = rows_so_far[mb]++;
  }
  for (int k = 0; k < parts; ++k) {
    Micro& mb = micro_[k];
    mb.batch = b.sequences(first[k], first[k + 1]);
    mb.no_logits = mb.batch;
    mb.no_logits.logits_rows.clear();
    mb.samples.clear();
    mb.prompt_logprobs.clear();
    mb.sample_of.clear();
    mb.prompt_of.clear();
  }
  const auto owner = [&](int32_t row, const char* what) {
    TESSERA_CHECK(row >= 0 && static_cast<size_t>(row) < n_rows, "pipeline executor: ", what, " row ", row, " of ",
                  n_rows, " logits rows");
    return micro_of[row];
  };
  for (size_t i = 0; i < in.samples.size(); ++i) {
    SampleTarget t = in.samples[i];
    TESSERA_CHECK(t.draft_parents.empty(), "pipeline executor: draft trees are not supported");
    Micro& mb = micro_[owner(t.row, "sample")];
    t.row = row_in[t.row];  // a draft's rows follow its first: they are the same sequence's
    mb.samples.push_back(t);
    mb.sample_of.push_back(i);
  }
  for (size_t i = 0; i < in.prompt_logprobs.size(); ++i) {
    PromptLogprobTarget t = in.prompt_logprobs[i];
    Micro& mb = micro_[owner(t.row, "prompt logprob")];
    t.row = row_in[t.row];
    mb.prompt_logprobs.push_back(t);
    mb.prompt_of.push_back(i);
  }
}

void PipelineParallelExecutor::join(const StepInput& in, StepOutput& out) {
  // Per step target i: (micro-batch, its index there); then each output walked in order.
  struct Where {
    int micro = 0;
    size_t index = 0;
  };
  std::vector<Where> sample_at(in.samples.size()), prompt_at(in.prompt_logprobs.size());
  for (size_t k = 0; k < micro_.size(); ++k) {
    for (size_t j = 0; j < micro_[k].sample_of.size(); ++j) sample_at[micro_[k].sample_of[j]] = {int(k), j};
    for (size_t j = 0; j < micro_[k].prompt_of.size(); ++j) prompt_at[micro_[k].prompt_of[j]] = {int(k), j};
  }
  // Offsets of each micro-batch's targets in its flat token and logprob lists.
  std::vector<std::vector<size_t>> token_at(micro_.size()), logprob_at(micro_.size());
  for (size_t k = 0; k < micro_.size(); ++k) {
    const Micro& mb = micro_[k];
    size_t tok = 0, lp = 0;
    for (size_t j = 0; j < mb.samples.size(); ++j) {
      token_at[k].push_back(tok);
      logprob_at[k].push_back(lp);
      tok += static_cast<size_t>(mb.out.counts[j]);
      if (mb.samples[j].logprobs) lp += static_cast<size_t>(mb.out.counts[j]);
    }
  }
  out.tokens.clear();
  out.counts.clear();
  out.logprobs.clear();
  out.prompt_logprobs.clear();
  for (size_t i = 0; i < in.samples.size(); ++i) {
    const auto [k, j] = sample_at[i];
    const StepOutput& o = micro_[k].out;
    const int n = o.counts[j];
    out.counts.push_back(n);
    const auto tok = o.tokens.begin() + static_cast<ptrdiff_t>(token_at[k][j]);
    out.tokens.insert(out.tokens.end(), tok, tok + n);
    if (in.samples[i].logprobs) {
      const auto lp = o.logprobs.begin() + static_cast<ptrdiff_t>(logprob_at[k][j]);
      out.logprobs.insert(out.logprobs.end(), lp, lp + n);
    }
  }
  for (size_t i = 0; i < in.prompt_logprobs.size(); ++i) {
    const auto [k, j] = prompt_at[i];
    out.prompt_logprobs.push_back(micro_[k].out.prompt_logprobs[j]);
  }
}

void PipelineParallelExecutor::execute(const StepInput& in, StepOutput& out) {
  const ParallelLayout& layout = ranks_.layout();
  split(in, layout.pipeline);
  last_micro_batches_ = static_cast<int>(micro_.size());
  // The last stage's other tensor ranks compute their vocabulary slices for the all-gather;
  // the logits are the sampling rank's, so only their argmax comes back (as TP's ranks > 0).
  size_t max_rows = 0;
  for (const Micro& mb : micro_) max_rows = std::max(max_rows, mb.batch.logits_rows.size());
  const int64_t n_vocab = ranks_.rank(layout.sampling_rank()).model->config().n_vocab;
  ranks_.run([&](ParallelRanks::Rank& r) {
    if (!in.copies.empty()) copy_kv_blocks(*r.kv, in.copies);
    Scratch& s = scratch_[r.index];
    const bool logits = layout.computes_logits(r.index);
    s.logits.resize(logits ? max_rows * n_vocab : 1);  // the stages before the last read back no logits
    for (Micro& mb : micro_) {
      if (r.index == sampling_rank_) {
        sampler_->execute(
            {.batch = mb.batch, .copies = {}, .samples = mb.samples, .prompt_logprobs = mb.prompt_logprobs}, mb.out);
      } else if (logits) {
        const size_t rows = mb.batch.logits_rows.size();
        s.argmax_only.assign(rows, 1);
        s.argmax.assign(rows, -1);
        r.runner->forward(mb.batch, s.logits.data(), {s.argmax_only.data(), s.argmax.data()});
      } else {
        r.runner->forward(mb.no_logits, s.logits.data());
      }
    }
  });
  join(in, out);
}

}  // namespace tessera
