// ModelRunner: one explicit forward (inputs staged, forward run, chosen rows read back), and
// the graph policy on top of it — decode batches padded to a graph size, the first forward
// of a key eager, the second captured, later ones replayed without the model code, a moved
// scratch buffer (graph epoch) forcing a new capture. A recording backend stands in for
// CUDA: while capturing it stores the ops (with their device pointers) instead of running
// them, and a launch runs them again, reading whatever the inputs hold at that time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "core/error.h"
#include "engine/model_runner.h"
#include "model/dummy.h"

namespace tessera {
namespace {

class RecordingBackend final : public Backend {
 public:
  std::string_view name() const override { return "recording"; }
  std::string describe() const override { return "cpu ops recorded into graphs"; }
  void* alloc(size_t bytes) override { return cpu_.alloc(bytes); }
  void free(void* p) override { cpu_.free(p); }
  void synchronize() override { ASSERT_FALSE(capturing_) << "synchronize inside a capture"; }

  void embed(const WeightMatrix& table, const int32_t* ids, int n, float* out) override {
    op([=, this] { cpu_.embed(table, ids, n, out); });
  }
  void rms_norm(const float* x, const float* w, float* out, int n_rows, int dim, float eps) override {
    op([=, this] { cpu_.rms_norm(x, w, out, n_rows, dim, eps); });
  }
  void add_rms_norm(float* x, const float* residual, const float* w, float* out, int n_rows, int dim,
                    float eps) override {
    op([=, this] { cpu_.add_rms_norm(x, residual, w, out, n_rows, dim, eps); });
  }
  void matmul(const float* x, int n_rows, int64_t ldx, std::span<const MatmulTarget> targets) override {
    std::vector<MatmulTarget> t(targets.begin(), targets.end());
    op([=, this] { cpu_.matmul(x, n_rows, ldx, t); });
  }
  void add_bias(float* x, int64_t ld, const float* bias, int n_rows, int dim) override {
    op([=, this] { cpu_.add_bias(x, ld, bias, n_rows, dim); });
  }
  void rope(float* x, int n_rows, int64_t ld, int n_heads, const int32_t* positions, const RopeConfig& cfg) override {
    op([=, this] { cpu_.rope(x, n_rows, ld, n_heads, positions, cfg); });
  }
  void kv_store(const KvLayerView& kv, const float* k, int64_t ldk, const float* v, int64_t ldv,
                const AttentionBatch& batch) override {
    op([=, this] { cpu_.kv_store(kv, k, ldk, v, ldv, batch); });
  }
  void attention(const float* q, int64_t ldq, const KvLayerView& kv, const AttentionBatch& batch, int n_heads,
                 float scale, float* out, int64_t ldo) override {
    op([=, this] { cpu_.attention(q, ldq, kv, batch, n_heads, scale, out, ldo); });
  }
  void swiglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) override {
    op([=, this] { cpu_.swiglu(gate, up, ld_in, out, n_rows, dim); });
  }
  void add(float* x, const float* y, int64_t n) override {
    op([=, this] { cpu_.add(x, y, n); });
  }
  void geglu(const float* gate, const float* up, int64_t ld_in, float* out, int n_rows, int dim) override {
    op([=, this] { cpu_.geglu(gate, up, ld_in, out, n_rows, dim); });
  }
  void rms_norm_heads(float* x, int64_t ld, int n_rows, int n_heads, int head_dim, const float* w, float eps) override {
    op([=, this] { cpu_.rms_norm_heads(x, ld, n_rows, n_heads, head_dim, w, eps); });
  }
  void scale(float* x, float s, int64_t n) override {
    op([=, this] { cpu_.scale(x, s, n); });
  }
  void gather_rows(const float* src, int64_t ld, const int32_t* rows, int n, int dim, float* dst) override {
    op([=, this] { cpu_.gather_rows(src, ld, rows, n, dim, dst); });
  }
  void copy_device(void* dst, const void* src, size_t bytes) override {  // an op (add_rms_norm_matmul's copy)
    op([=] { std::memcpy(dst, src, bytes); });
  }
  void copy_to_host(void* host, const void* device, size_t bytes) override {
    EXPECT_FALSE(capturing_) << "copy to the host inside a capture";
    std::memcpy(host, device, bytes);
  }
  std::shared_ptr<const void> upload(const void* host, size_t bytes) override { return cpu_.upload(host, bytes); }
  void copy_to_device(void* device, const void* host, size_t bytes) override {
    EXPECT_FALSE(capturing_) << "staging inside a capture";
    std::memcpy(device, host, bytes);
  }

  class Recorded final : public Graph {
   public:
    Recorded(std::vector<std::function<void()>> ops, int* launches) : ops_(std::move(ops)), launches_(launches) {}
    void launch() override {
      ++*launches_;
      for (auto& f : ops_) f();
    }

   private:
    std::vector<std::function<void()>> ops_;
    int* launches_;
  };
  bool supports_graphs() const override { return graphs; }
  void begin_capture() override {
    ASSERT_FALSE(capturing_);
    capturing_ = true;
    recorded_.clear();
  }
  std::unique_ptr<Graph> end_capture() override {
    capturing_ = false;
    return std::make_unique<Recorded>(std::move(recorded_), &launches);
  }
  void abandon_capture() override {
    capturing_ = false;
    recorded_.clear();
  }
  uint64_t graph_epoch() const override { return epoch; }

  bool graphs = true;
  uint64_t epoch = 0;
  int launches = 0;     // graph launches
  int64_t ops_run = 0;  // ops run outside graphs

 private:
  void op(std::function<void()> f) {
    if (capturing_) {
      recorded_.push_back(std::move(f));
    } else {
      ++ops_run;
      f();
    }
  }
  CpuBackend cpu_{1};
  bool capturing_ = false;
  std::vector<std::function<void()>> recorded_;
};

// Counts the model's forwards (a replay must not call it).
class CountingModel final : public Model {
 public:
  explicit CountingModel(std::unique_ptr<Model> inner) : inner_(std::move(inner)) {}
  const ModelConfig& config() const override { return inner_->config(); }
  float* forward(const ForwardInputs& in, KvCache& kv) override {
    ++calls;
    return inner_->forward(in, kv);
  }
  int max_batch_tokens() const override { return inner_->max_batch_tokens(); }
  int max_logits_rows() const override { return inner_->max_logits_rows(); }
  int calls = 0;

 private:
  std::unique_ptr<Model> inner_;
};

constexpr int kBlock = 4;

struct Rig {
  explicit Rig(bool graphs, int pad_block = 63) {
    be.graphs = graphs;
    weights = make_dummy_weights("llama3-tiny:bf16", 3);
    model = std::make_unique<CountingModel>(create_model(weights, be, 32, 8));
    const ModelConfig& c = weights->config;
    kv = std::make_unique<KvCache>(be, KvCacheSpec::plain(c.n_layer, c.n_head_kv, c.head_dim, kBlock, 64, DType::F32));
    // Zeroed, so the slots no forward writes compare equal across rigs (alloc does not clear).
    for (int l = 0; l < c.n_layer; ++l) {
      const KvLayerView v = kv->layer(l);
      const size_t bytes = static_cast<size_t>(v.n_blocks) * v.n_kv_heads * v.block_size * v.head_dim * sizeof(float);
      std::memset(v.k, 0, bytes);
      std::memset(v.v, 0, bytes);
    }
    runner = std::make_unique<ModelRunner>(*model, *kv, be, pad_block);
  }
  int n_vocab() const { return weights->config.n_vocab; }
  // Block b's K bytes of layer 0.
  std::vector<uint8_t> k_block(int b) {
    const KvLayerView l = kv->layer(0);
    const size_t bytes = static_cast<size_t>(l.n_kv_heads) * l.block_size * l.head_dim * sizeof(float);
    const auto* p = static_cast<const uint8_t*>(l.k) + static_cast<size_t>(b) * bytes;
    return std::vector<uint8_t>(p, p + bytes);
  }
  RecordingBackend be;
  std::shared_ptr<ModelWeights> weights;
  std::unique_ptr<CountingModel> model;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<ModelRunner> runner;
};

// A 5-token prompt per sequence (blocks 8s..8s+7), then `steps` steps in which sequence s
// feeds rows[s] tokens with every row's logits — one: a decode step; more: a speculative
// verification (its last token and its drafts) — and keeps one (a rejected draft's slots are
// written again by the next step). The logits of every forward, in order.
std::vector<std::vector<float>> run_steps(Rig& r, const std::vector<int>& rows, int steps) {
  const int n_seqs = static_cast<int>(rows.size());
  std::vector<std::vector<float>> out;
  std::vector<SequenceBlocks> seqs(n_seqs);
  for (int s = 0; s < n_seqs; ++s) {
    for (int b = 0; b < 8; ++b) seqs[s].blocks.push_back(8 * s + b);
    const std::vector<int32_t> prompt = {1 + s, 7, 99, 5, 3000};
    ForwardBatch fb;
    SequenceBlocks view = seqs[s];
    view.blocks.resize(2);
    fb.add_sequence(view, kBlock, prompt.data(), 5, ForwardBatch::Logits::Last);
    out.emplace_back(r.n_vocab());
    r.runner->forward(fb, out.back().data());
    seqs[s].n_tokens = 5;
  }
  for (int step = 0; step < steps; ++step) {
    ForwardBatch fb;
    for (int s = 0; s < n_seqs; ++s) {
      SequenceBlocks view = seqs[s];
      view.blocks.resize((seqs[s].n_tokens + rows[s] + kBlock - 1) / kBlock);
      std::vector<int32_t> toks(rows[s]);
      for (int j = 0; j < rows[s]; ++j) toks[j] = (s * 31 + step * 7 + j * 13 + 3) % r.n_vocab();
      fb.add_sequence(view, kBlock, toks.data(), rows[s], ForwardBatch::Logits::All);
    }
    out.emplace_back(static_cast<size_t>(fb.n_tokens()) * r.n_vocab());
    r.runner->forward(fb, out.back().data());
    for (int s = 0; s < n_seqs; ++s) ++seqs[s].n_tokens;
  }
  return out;
}

// n_seqs sequences decoding (one row each).
std::vector<std::vector<float>> run_sequences(Rig& r, int n_seqs, int steps) {
  return run_steps(r, std::vector<int>(n_seqs, 1), steps);
}

TEST(ModelRunner, ReplayedDecodeGivesTheSameLogitsAndKvAsEagerForwards) {
  Rig eager(false), graph(true);
  EXPECT_EQ(eager.runner->graph_batch(3), 0);
  EXPECT_EQ(graph.runner->graph_batch(3), 4);
  EXPECT_EQ(graph.runner->graph_batch(8), 8);
  EXPECT_EQ(graph.runner->graph_batch(9), 0);  // past the model's 8 logits rows
  // 3 sequences (padded to 4), 6 decode steps: tables of 2 blocks, then 3..4 (width 4).
  const auto a = run_sequences(eager, 3, 6), b = run_sequences(graph, 3, 6);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "forward " << i;
  for (int blk = 0; blk < 24; ++blk) EXPECT_EQ(eager.k_block(blk), graph.k_block(blk)) << "block " << blk;
  // Keys (4 sequences, width 2) and (4, 4): each eager once, captured once, then replayed.
  EXPECT_EQ(graph.runner->graphs_captured(), 2);
  EXPECT_EQ(graph.runner->graph_replays(), 2);
  EXPECT_EQ(graph.be.launches, 4);           // captures launch too
  EXPECT_EQ(graph.model->calls, 3 + 6 - 2);  // replays skip the model code
  EXPECT_EQ(eager.model->calls, 3 + 6);
  // The padding sequences wrote the reserved block only (the eager rig never pads).
  EXPECT_NE(graph.k_block(63), eager.k_block(63));
}

TEST(ModelRunner, VerificationStepsReplayAsGraphsWithTheEagerResults) {
  Rig eager(false), graph(true);
  EXPECT_EQ(graph.runner->graph_batch(3, 5), 4);
  EXPECT_EQ(graph.runner->graph_batch(3, 8), 0);  // 8 rows + 1 padding row: past the 8 logits rows
  // Rows 2, 2, 1 (one sequence drafts nothing), padded to 4 sequences and 6 rows; 6 steps:
  // tables 2 blocks wide, then 3 (width 4).
  const std::vector<int> rows = {2, 2, 1};
  const auto a = run_steps(eager, rows, 6), b = run_steps(graph, rows, 6);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "forward " << i;
  for (int blk = 0; blk < 24; ++blk) EXPECT_EQ(eager.k_block(blk), graph.k_block(blk)) << "block " << blk;
  // Keys (4 sequences, 6 rows, width 2) and (4, 6, 4): eager, captured, then replayed.
  EXPECT_EQ(graph.runner->graphs_captured(), 2);
  EXPECT_EQ(graph.runner->graph_replays(), 2);
  EXPECT_EQ(graph.model->calls, 3 + 6 - 2);
  EXPECT_NE(graph.k_block(63), eager.k_block(63));  // the padding sequence's row
  // The same sizes with another spread of rows (3, 1, 1: most rows 3, not 2) is another key:
  // the attention may size its grid by the most rows of a sequence.
  const int captured_before = graph.runner->graphs_captured();
  const int64_t replays_before = graph.runner->graph_replays();
  run_steps(graph, {3, 1, 1}, 3);  // widths 2, 4, 4: the second width-4 step is captured
  EXPECT_EQ(graph.runner->graphs_captured(), captured_before + 1);
  EXPECT_EQ(graph.runner->graph_replays(), replays_before);
  // A batch whose logits rows are not every row in order (a prefill chunk's last row) runs
  // eagerly, whatever its size.
  const int captured = graph.runner->graphs_captured();
  for (int i = 0; i < 3; ++i) {
    ForwardBatch fb;
    SequenceBlocks view;
    view.blocks = {40, 41};
    const std::vector<int32_t> toks = {5, 6, 7};
    fb.add_sequence(view, kBlock, toks.data(), 3, ForwardBatch::Logits::Last);
    std::vector<float> logits(graph.n_vocab());
    graph.runner->forward(fb, logits.data());
  }
  EXPECT_EQ(graph.runner->graphs_captured(), captured);
}

TEST(ModelRunner, MovedScratchMeansANewCaptureAfterAnEagerForward) {
  Rig r(true);
  const auto first = run_sequences(r, 2, 3);  // tables 2 blocks wide all along: eager, capture, replay
  EXPECT_EQ(r.runner->graphs_captured(), 1);
  EXPECT_EQ(r.runner->graph_replays(), 1);
  const int calls = r.model->calls;
  r.be.epoch++;  // a scratch buffer the graph points into moved
  const auto again = run_sequences(r, 2, 3);
  // Prefills (2) eager; the decode key warms up again, is captured again, then replays.
  EXPECT_EQ(r.model->calls - calls, 2 + 2);
  EXPECT_EQ(r.runner->graphs_captured(), 2);
  EXPECT_EQ(r.runner->graph_replays(), 2);
  EXPECT_EQ(first, again);  // the same sequences over the same blocks
}

TEST(ModelRunner, ArgmaxOnlyRowsComeBackAsIds) {
  Rig r(true);
  std::vector<SequenceBlocks> seqs(2);
  ForwardBatch fb;
  for (int s = 0; s < 2; ++s) {
    seqs[s].blocks = {8 * s};
    const int32_t tok = 11 + s;
    fb.add_sequence(seqs[s], kBlock, &tok, 1, ForwardBatch::Logits::Last);
  }
  std::vector<float> full(2 * r.n_vocab());
  ModelRunner(*r.model, *r.kv, r.be).forward(fb, full.data());
  const uint8_t argmax_only[] = {1, 0};
  int32_t ids[] = {-7, -7};
  std::vector<float> got(2 * r.n_vocab());
  r.runner->forward(fb, got.data(), {argmax_only, ids});
  const float* row0 = full.data();
  EXPECT_EQ(ids[0], std::max_element(row0, row0 + r.n_vocab()) - row0);
  EXPECT_EQ(ids[1], -7);  // read in full, not reduced
  EXPECT_EQ(0, std::memcmp(got.data() + r.n_vocab(), full.data() + r.n_vocab(), sizeof(float) * r.n_vocab()));
}

TEST(ModelRunner, BadBatchesAreRefusedBeforeAnythingRuns) {
  Rig r(true);
  std::vector<float> logits(r.n_vocab());
  const auto refused = [&](ForwardBatch fb, const std::string& why) {
    const int64_t ops = r.be.ops_run;
    try {
      r.runner->forward(fb, logits.data());
      ADD_FAILURE() << "accepted: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
    EXPECT_EQ(r.be.ops_run, ops) << why;
  };
  SequenceBlocks seq;
  seq.blocks = {0};
  ForwardBatch fb;
  const int32_t bad = r.n_vocab();
  fb.add_sequence(seq, kBlock, &bad, 1, ForwardBatch::Logits::Last);
  refused(fb, "token id 4096 is outside the vocabulary");
  fb.clear();
  const int32_t ok = 1;
  fb.add_sequence(seq, kBlock, &ok, 1, ForwardBatch::Logits::Last);
  fb.positions[0] = -3;
  refused(fb, "negative position -3");
  fb.positions[0] = 0;
  fb.logits_rows[0] = 1;
  refused(fb, "logits row 1 outside the batch of 1 tokens");
  fb.logits_rows[0] = 0;
  fb.kv_len.push_back(1);
  refused(fb, "arrays disagree");
  // The runner carries on.
  fb.kv_len.pop_back();
  r.runner->forward(fb, logits.data());
}

}  // namespace
}  // namespace tessera
