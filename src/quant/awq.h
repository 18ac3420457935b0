#pragma once
// AWQ (Lin et al. 2023, "AWQ: Activation-aware Weight Quantization for LLM Compression and
// Acceleration"): before round-to-nearest, the input channels of the linear layers that read
// one input are scaled by s = s_x^α (s_x: the channel's mean |x| over the calibration
// tokens), the inverse scale folded into whatever produces that input, with α searched on a
// grid for the least output error; then each group's clipping range is searched the same way.
// docs/design/weight-quant.md ("AWQ") says what is folded where and where it follows llm-awq.
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace tessera {

struct AwqOptions {
  int bits = 4;
  int64_t group_size = 128;  // a multiple of 32, or the row length
  bool asymmetric = false;
  int n_grid = 20;          // α in {0, 1/n_grid, ..., (n_grid-1)/n_grid}; clip shrinks of 1/n_grid
  double max_shrink = 0.5;  // clipping tries max|w| · (1 - i/n_grid) for i < max_shrink · n_grid
};

// Σ_r d_r · H · d_rᵀ for d: [rows][cols], H = XᵀX of the calibration inputs: the summed squared
// output error a weight difference d causes over the calibration tokens.
using OutputError = std::function<double(const float* d, int64_t rows)>;

struct AwqMatrix {
  const float* w = nullptr;  // [rows][cols]
  int64_t rows = 0;
};

struct AwqScales {
  double alpha = 0;
  std::vector<float> s;      // [cols] the input-channel scales, normalized by sqrt(max · min)
  std::vector<double> loss;  // [n_grid] the summed output error at each α
};

// Round-to-nearest of W·diag(s), scaled back by diag(1/s), into out ([rows][cols]): the weights
// the quantized layer effectively applies to the unscaled input.
void awq_fake_quantize(const float* w, int64_t rows, int64_t cols, std::span<const float> s, const AwqOptions& o,
                       float* out);

// The α grid search over the matrices that share one input (all `cols` wide); x_abs_mean:
// [cols]. The loss of each α is Σ over the matrices of err(awq_fake_quantize(W) − W).
AwqScales awq_search_scales(std::span<const AwqMatrix> mats, int64_t cols, const double* x_abs_mean,
                            const OutputError& err, const AwqOptions& o);

// Clipping search on already scaled weights w ([rows][cols], changed in place): for every
// (row, group) the shrink of max|w| whose clamped-then-rounded group has the least output
// error δᵀ·H_gg·δ against the unclipped weights, H: [cols][cols] the Gram matrix of the
// (scaled) inputs. Returns the chosen shrink index per [row][group].
std::vector<uint8_t> awq_clip(float* w, int64_t rows, int64_t cols, const double* h, const AwqOptions& o,
                              int threads = 0);

}  // namespace tessera
