// CUDA graphs for the decode step: a forward replayed from a captured graph must give the
// same bits as the same forward launched op by op, at every graph batch size (GEMV and
// cuBLASLt paths), across steps whose contexts grow past block boundaries (new keys when
// the block tables widen), with the KV cache written identically.
#include <cstring>
#include <string>

#include "cuda_test_util.h"
#include "engine/model_runner.h"
#include "model/dummy.h"
#include "model/model.h"

using namespace tessera;
using namespace tessera::cudatest;

namespace {

struct Rig {
  std::unique_ptr<Backend> be;
  std::unique_ptr<Model> model;
  std::unique_ptr<KvCache> kv;
  std::unique_ptr<ModelRunner> runner;
};

Rig make_rig(bool graphs, const std::shared_ptr<ModelWeights>& w, const KvCacheSpec& spec) {
  Rig r;
  BackendOptions o;
  o.device = "cuda";
  o.cuda_graphs = graphs;
  r.be = make_backend(o);
  r.model = create_model(w, *r.be, 256, 128);
  r.kv = std::make_unique<KvCache>(*r.be, spec);
  // The last block is the padding sequences' (the test's sequences use the first ones).
  r.runner = std::make_unique<ModelRunner>(*r.model, *r.kv, *r.be, spec.n_blocks - 1);
  return r;
}

std::vector<uint8_t> kv_bytes(Rig& r) {
  const KvCacheSpec& s = r.kv->spec();
  const size_t layer = static_cast<size_t>(s.k_layer_block_bytes()) * s.n_blocks;
  std::vector<uint8_t> all(layer * 2 * s.n_layers);
  for (int l = 0; l < s.n_layers; ++l) {
    r.be->copy_to_host(all.data() + 2 * l * layer, r.kv->layer(l).k, layer);
    r.be->copy_to_host(all.data() + (2 * l + 1) * layer, r.kv->layer(l).v, layer);
  }
  return all;
}

}  // namespace

TEST(CudaGraphs, ReplayedDecodeGivesTheSameBitsAsEagerLaunches) {
  TESSERA_REQUIRE_CUDA();
  for (const char* spec_name : {"smollm2-135m:bf16", "smollm2-135m:q4_0"}) {
    SCOPED_TRACE(spec_name);
    const auto w = make_dummy_weights(spec_name, 5);
    KvCacheSpec spec;
    spec.n_layers = w->config.n_layer;
    spec.n_kv_heads = w->config.n_head_kv;
    spec.head_dim = w->config.head_dim;
    spec.block_size = 4;
    spec.n_blocks = 1024;
    Rig eager = make_rig(false, w, spec);
    Rig graph = make_rig(true, w, spec);
    EXPECT_EQ(eager.runner->graph_batch(3), 0);
    ASSERT_EQ(graph.runner->graph_batch(3), 4);
    EXPECT_EQ(graph.runner->graph_batch(100), 128);
    EXPECT_EQ(graph.runner->graph_batch(129), 0);
    int next_block = 0;
    for (int n_seqs : {1, 3, 16}) {  // GEMV (<= 8 rows) and cuBLASLt paths; 3 is padded to 4
      SCOPED_TRACE(n_seqs);
      std::vector<SequenceBlocks> seqs(n_seqs);
      const int n_vocab = w->config.n_vocab;
      // Prefill each sequence (3..9 tokens, not a graph forward), then decode 12 steps: the
      // tables widen up to 6 blocks (new keys at 2, 4, 8) and the contexts cross block edges.
      for (int s = 0; s < n_seqs; ++s) {
        for (int b = 0; b < 6; ++b) seqs[s].blocks.push_back(next_block++);
        std::vector<int32_t> prompt;
        for (int i = 0; i < 3 + (s * 5) % 7; ++i) prompt.push_back((s * 131 + i * 17 + 1) % n_vocab);
        ForwardBatch fb;
        // Each sequence shows only the blocks it uses so far.
        SequenceBlocks view = seqs[s];
        view.blocks.resize((prompt.size() + 3) / 4);
        fb.add_sequence(view, 4, prompt.data(), static_cast<int>(prompt.size()), ForwardBatch::Logits::Last);
        std::vector<float> l1(n_vocab), l2(n_vocab);
        eager.runner->forward(fb, l1.data());
        graph.runner->forward(fb, l2.data());
        ASSERT_EQ(std::memcmp(l1.data(), l2.data(), sizeof(float) * n_vocab), 0) << "prefill of " << s;
        seqs[s].n_tokens = static_cast<int>(prompt.size());
      }
      for (int step = 0; step < 12; ++step) {
        ForwardBatch fb;
        for (int s = 0; s < n_seqs; ++s) {
          SequenceBlocks view = seqs[s];
          view.blocks.resize(std::min<size_t>(6, (seqs[s].n_tokens + 1 + 3) / 4));
          const int32_t tok = (s * 31 + step * 7 + 3) % n_vocab;
          fb.add_sequence(view, 4, &tok, 1, ForwardBatch::Logits::Last);
        }
        std::vector<float> l1(static_cast<size_t>(n_seqs) * n_vocab), l2(l1.size(), 1.0f);
        eager.runner->forward(fb, l1.data());
        graph.runner->forward(fb, l2.data());
        ASSERT_EQ(std::memcmp(l1.data(), l2.data(), sizeof(float) * l1.size()), 0)
            << "step " << step << " (max_blocks " << fb.max_blocks << ")";
        for (int s = 0; s < n_seqs; ++s) ++seqs[s].n_tokens;
      }
    }
    // The padding sequences (n_seqs 3) wrote only the last block, on the graph rig alone.
    std::vector<uint8_t> ke = kv_bytes(eager), kg = kv_bytes(graph);
    const KvCacheSpec& s = graph.kv->spec();
    const size_t block = static_cast<size_t>(s.k_layer_block_bytes());
    const size_t layer = block * s.n_blocks;
    for (size_t part = 0; part < ke.size() / layer; ++part) {
      std::fill_n(ke.begin() + part * layer + (s.n_blocks - 1) * block, block, 0);
      std::fill_n(kg.begin() + part * layer + (s.n_blocks - 1) * block, block, 0);
    }
    EXPECT_EQ(ke, kg);
    // The graph backend did replay: a replay and an eager launch are told apart only by the
    // counter, so the bitwise comparison above covers the replays.
    EXPECT_GT(graph.runner->graph_replays(), 5);
    EXPECT_GE(graph.runner->graphs_captured(), 3);
    EXPECT_EQ(eager.runner->graph_replays(), 0);
    EXPECT_EQ(eager.runner->graphs_captured(), 0);
  }
}
