#pragma once
// The calibration forward of `quantize_calibrated`: a Llama-family decoder layer run over all
// calibration windows in four stages, each stopping at the input of the next group of linear
// layers so that the group can be quantized before its output is used (GPTQ's "true
// sequential" order), plus the reductions of those inputs. The layer's matrices are f32 copies
// the caller owns and may replace between stages. Same ops as model/arch/llama.cpp (the
// backend's), one layer at a time; activations live in host memory (CPU backend).
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/op_types.h"
#include "kv/kv_cache.h"
#include "model/weights.h"

namespace tessera {

// Σ x·xᵀ ([d][d], double) and Σ |x| ([d]) over the calibration tokens of one input.
struct InputStats {
  int64_t d = 0, n = 0;
  std::vector<double> gram, abs_sum;
  explicit InputStats(int64_t dim) : d(dim), gram(static_cast<size_t>(dim * dim)), abs_sum(static_cast<size_t>(dim)) {}
  // x: [rows][ld], the first d columns.
  void add(Backend& be, const float* x, int64_t ld, int rows);
  std::vector<double> abs_mean() const;
  std::vector<float> gram_f32() const;

 private:
  std::vector<float> xt_, prod_;
};

// One layer's linear weights as f32 ([rows][cols] each), in kDecoderLinearNames' order.
struct LayerF32 {
  std::vector<float> m[7];
  const float* attn_norm = nullptr;
  const float* ffn_norm = nullptr;
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
};

class CalibForward {
 public:
  CalibForward(Backend& be, const ModelWeights& w, std::span<const int32_t> tokens, int window);
  ~CalibForward();
  int n_windows() const { return n_windows_; }
  int64_t n_tokens() const { return static_cast<int64_t>(n_windows_) * window_; }

  // A: norm(x) into q/k/v's stats. B: attention with the current q/k/v into o's stats.
  // C: x + o(att), normed, into gate/up's stats. D: silu(gate)·up into down's stats.
  // E: the layer's output becomes the next layer's input.
  void stage_a(const LayerF32& l, InputStats& qkv_in);
  void stage_b(const LayerF32& l, InputStats& o_in);
  void stage_c(const LayerF32& l, InputStats& ffn_in);
  void stage_d(const LayerF32& l, InputStats& down_in);
  void stage_e(const LayerF32& l);
  // [n_tokens][n_embd]: the current layer's input (after stage_e, the next layer's).
  std::span<const float> residual() const { return x_; }

 private:
  Backend& be_;
  const ModelConfig& c_;
  int window_, n_windows_;
  int64_t q_dim_, kv_dim_, qkv_ld_;
  RopeConfig rope_;
  // [n_tokens][...]: the layer's input x, the attention output, x after the attention's
  // residual, silu(gate)·up
  std::vector<float> x_, att_, xmid_, h_;
  std::vector<float> xn_, qkv_, gu_, tmp_;  // one window
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<BlockPool> pool_;
};

}  // namespace tessera
