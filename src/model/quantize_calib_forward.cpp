#include "model/quantize_calib_forward.h"

#include <cmath>

#include "core/error.h"
#include "model/arch/arch.h"
#include "model/model.h"

namespace tessera {

namespace {

WeightMatrix f32_view(const std::vector<float>& m, int64_t rows, int64_t cols) {
  WeightMatrix w;
  w.data = m.data();
  w.dtype = DType::F32;
  w.rows = rows;
  w.cols = cols;
  return w;
}

}  // namespace

void InputStats::add(Backend& be, const float* x, int64_t ld, int rows) {
  // Σ x·xᵀ of this window as one product: X ᵀ [d][rows] times itself ([d][d], f32 over at most
  // a window's tokens), summed in double.
  xt_.resize(static_cast<size_t>(d * rows));
  prod_.resize(static_cast<size_t>(d * d));
  for (int t = 0; t < rows; ++t)
    for (int64_t i = 0; i < d; ++i) {
      xt_[i * rows + t] = x[t * ld + i];
      abs_sum[i] += std::fabs(x[t * ld + i]);
    }
  const MatmulTarget target[] = {{f32_view(xt_, d, rows), prod_.data(), d}};
  be.matmul(xt_.data(), static_cast<int>(d), rows, target);
  for (size_t i = 0; i < gram.size(); ++i) gram[i] += prod_[i];
  n += rows;
}

std::vector<double> InputStats::abs_mean() const {
  std::vector<double> m(abs_sum);
  for (double& v : m) v /= static_cast<double>(std::max<int64_t>(n, 1));
  return m;
}

std::vector<float> InputStats::gram_f32() const { return std::vector<float>(gram.begin(), gram.end()); }

CalibForward::CalibForward(Backend& be, const ModelWeights& w, std::span<const int32_t> tokens, int window)
    : be_(be), c_(w.config), window_(window) {
  TESSERA_CHECK(c_.arch == "llama" || c_.arch == "mistral" || c_.arch == "qwen2", "quantize: calibration runs ",
                "Llama-family decoders (llama, mistral, qwen2), not '", c_.arch, "'");
  TESSERA_CHECK(be.device_free_bytes() == 0, "quantize: calibration runs on the CPU backend, not ", be.name());
  TESSERA_CHECK(window >= 16 && window <= 8192, "quantize: calibration window ", window, " (16 to 8192 tokens)");
  n_windows_ = static_cast<int>(tokens.size() / static_cast<size_t>(window));
  TESSERA_CHECK(n_windows_ >= 1, "quantize: ", tokens.size(), " calibration tokens, fewer than one window of ", window);
  q_dim_ = static_cast<int64_t>(c_.n_head) * c_.head_dim;
  kv_dim_ = static_cast<int64_t>(c_.n_head_kv) * c_.head_dim;
  qkv_ld_ = q_dim_ + 2 * kv_dim_;
  rope_ = rope_config_for(c_, c_.rope_freq_base, w.rope_freq_factors, /*with_scaling=*/true);
  const int64_t n = n_tokens(), e = c_.n_embd;
  x_.resize(static_cast<size_t>(n * e));
  xmid_.resize(static_cast<size_t>(n * e));
  att_.resize(static_cast<size_t>(n * q_dim_));
  h_.resize(static_cast<size_t>(n * c_.n_ff));
  xn_.resize(static_cast<size_t>(window * e));
  tmp_.resize(static_cast<size_t>(window * e));
  qkv_.resize(static_cast<size_t>(window * qkv_ld_));
  gu_.resize(static_cast<size_t>(window * 2 * c_.n_ff));
  for (int s = 0; s < n_windows_; ++s)
    be_.embed(w.tok_embd, tokens.data() + static_cast<size_t>(s) * window, window, x_.data() + s * window * e);
  const int block = 16;
  kv_ = std::make_unique<KvCache>(
      be_, KvCacheSpec::plain(1, c_.n_head_kv, c_.head_dim, block, (window + block - 1) / block, DType::F32));
  pool_ = std::make_unique<BlockPool>(kv_->spec().n_blocks);
}

CalibForward::~CalibForward() = default;

void CalibForward::stage_a(const LayerF32& l, InputStats& qkv_in) {
  const int e = c_.n_embd;
  for (int s = 0; s < n_windows_; ++s) {
    be_.rms_norm(x_.data() + s * window_ * e, l.attn_norm, xn_.data(), window_, e, c_.rms_eps);
    qkv_in.add(be_, xn_.data(), e, window_);
  }
}

void CalibForward::stage_b(const LayerF32& l, InputStats& o_in) {
  const int e = c_.n_embd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(c_.head_dim));
  float* q = qkv_.data();
  float* k = q + q_dim_;
  float* v = k + kv_dim_;
  const MatmulTarget qkv[] = {{f32_view(l.m[0], q_dim_, e), q, qkv_ld_},
                              {f32_view(l.m[1], kv_dim_, e), k, qkv_ld_},
                              {f32_view(l.m[2], kv_dim_, e), v, qkv_ld_}};
  std::vector<int32_t> ids(static_cast<size_t>(window_), 0);  // the cache takes positions, not ids
  for (int s = 0; s < n_windows_; ++s) {
    be_.rms_norm(x_.data() + s * window_ * e, l.attn_norm, xn_.data(), window_, e, c_.rms_eps);
    be_.matmul(xn_.data(), window_, e, qkv);
    if (l.bq) {
      be_.add_bias(q, qkv_ld_, l.bq, window_, static_cast<int>(q_dim_));
      be_.add_bias(k, qkv_ld_, l.bk, window_, static_cast<int>(kv_dim_));
      be_.add_bias(v, qkv_ld_, l.bv, window_, static_cast<int>(kv_dim_));
    }
    SequenceBlocks seq;
    TESSERA_CHECK(seq.reserve(*pool_, kv_->spec().block_size, window_), "quantize: calibration KV cache too small");
    ForwardBatch batch;
    batch.add_sequence(seq, kv_->spec().block_size, ids.data(), window_, ForwardBatch::Logits::None);
    float* att = att_.data() + s * window_ * q_dim_;
    be_.rope_kv_store_attention(q, qkv_ld_, c_.n_head, k, qkv_ld_, v, qkv_ld_, kv_->layer(0), batch.attention_view(),
                                rope_, scale, att, q_dim_);
    seq.release_all(*pool_);
    o_in.add(be_, att, q_dim_, window_);
  }
}

void CalibForward::stage_c(const LayerF32& l, InputStats& ffn_in) {
  const int e = c_.n_embd;
  const MatmulTarget o[] = {{f32_view(l.m[3], e, q_dim_), tmp_.data(), e}};
  for (int s = 0; s < n_windows_; ++s) {
    const int64_t off = static_cast<int64_t>(s) * window_ * e;
    be_.matmul(att_.data() + s * window_ * q_dim_, window_, q_dim_, o);
    for (int64_t i = 0; i < static_cast<int64_t>(window_) * e; ++i) xmid_[off + i] = x_[off + i] + tmp_[i];
    be_.rms_norm(xmid_.data() + off, l.ffn_norm, xn_.data(), window_, e, c_.rms_eps);
    ffn_in.add(be_, xn_.data(), e, window_);
  }
}

void CalibForward::stage_d(const LayerF32& l, InputStats& down_in) {
  const int e = c_.n_embd, f = c_.n_ff;
  const MatmulTarget gu[] = {{f32_view(l.m[4], f, e), gu_.data(), 2 * f},
                             {f32_view(l.m[5], f, e), gu_.data() + f, 2 * f}};
  for (int s = 0; s < n_windows_; ++s) {
    be_.rms_norm(xmid_.data() + s * window_ * e, l.ffn_norm, xn_.data(), window_, e, c_.rms_eps);
    be_.matmul(xn_.data(), window_, e, gu);
    float* h = h_.data() + static_cast<int64_t>(s) * window_ * f;
    be_.swiglu(gu_.data(), gu_.data() + f, 2 * f, h, window_, f);
    down_in.add(be_, h, f, window_);
  }
}

void CalibForward::stage_e(const LayerF32& l) {
  const int e = c_.n_embd, f = c_.n_ff;
  const MatmulTarget down[] = {{f32_view(l.m[6], e, f), tmp_.data(), e}};
  for (int s = 0; s < n_windows_; ++s) {
    const int64_t off = static_cast<int64_t>(s) * window_ * e;
    be_.matmul(h_.data() + static_cast<int64_t>(s) * window_ * f, window_, f, down);
    for (int64_t i = 0; i < static_cast<int64_t>(window_) * e; ++i) x_[off + i] = xmid_[off + i] + tmp_[i];
  }
}

}  // namespace tessera
