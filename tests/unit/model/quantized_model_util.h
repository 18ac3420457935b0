// Test helpers for quantized checkpoints: the decoder's linear layers by Hugging Face name, and
// a tiny model's logits on the CPU backend (for comparisons against a dequantized copy).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "engine/model_runner.h"
#include "format/safetensors.h"
#include "model/model.h"

namespace tessera::testing_util {

inline std::string wquant_fixture(const std::string& name) {
  return std::string(TESSERA_FIXTURES_DIR) + "/wquant/" + name;
}

inline std::map<std::string, WeightMatrix> hf_linears(const ModelWeights& w) {
  std::map<std::string, WeightMatrix> out;
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const LayerWeights& L = w.layers[l];
    out[p + "self_attn.q_proj"] = L.wq;
    out[p + "self_attn.k_proj"] = L.wk;
    out[p + "self_attn.v_proj"] = L.wv;
    out[p + "self_attn.o_proj"] = L.wo;
    out[p + "mlp.gate_proj"] = L.w_gate;
    out[p + "mlp.up_proj"] = L.w_up;
    out[p + "mlp.down_proj"] = L.w_down;
  }
  return out;
}

// Element i of a safetensors tensor as T (the bytes as stored).
template <typename T>
T tensor_at(const SafetensorsTensor& t, int64_t i) {
  T v;
  std::memcpy(&v, t.data + sizeof(T) * i, sizeof(T));
  return v;
}

// All positions' logits [toks.size()][n_vocab] of one sequence (at most 16 tokens), CPU backend,
// f32 KV cache; run as forwards of `chunk` tokens (0: one forward).
inline std::vector<float> run_logits(std::shared_ptr<const ModelWeights> w, const std::vector<int32_t>& toks,
                                     int chunk = 0) {
  const ModelConfig& c = w->config;
  CpuBackend be(2);
  auto model = create_model(w, be, 16, 16);
  KvCache kv(be, KvCacheSpec::plain(c.n_layer, c.n_head_kv, c.head_dim, 4, 8, DType::F32));
  BlockPool pool(8);
  SequenceBlocks seq;
  std::vector<float> logits(toks.size() * c.n_vocab, NAN);
  for (size_t done = 0; done < toks.size();) {
    const int n = static_cast<int>(chunk > 0 ? std::min<size_t>(chunk, toks.size() - done) : toks.size());
    EXPECT_TRUE(seq.reserve(pool, 4, n));
    ForwardBatch fb;
    fb.add_sequence(seq, 4, toks.data() + done, n, ForwardBatch::Logits::All);
    ModelRunner(*model, kv, be).forward(fb, logits.data() + done * c.n_vocab);
    seq.n_tokens += n;
    done += n;
  }
  seq.release_all(pool);
  return logits;
}

// ‖got − ref‖ / ‖ref‖ (L2 over all elements); NaN when got holds a non-finite value.
inline double relative_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return NAN;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

}  // namespace tessera::testing_util
