#pragma once
// GPTQ and AWQ over a whole model (`tessera quantize --method gptq|awq`, `-m MODEL@gptq-w4g128`):
// the calibration tokens run through the decoder one layer at a time, the inputs of each
// layer's linear layers are reduced to what the methods need (the Gram matrix XᵀX and the mean
// |x| per input channel), and the layer is quantized before the next one's inputs are made.
// Llama-family decoders (llama, mistral, qwen2) on the CPU backend. docs/design/weight-quant.md.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "model/weights.h"

namespace tessera {

struct CalibratedQuantOptions {
  std::string method = "gptq";  // gptq | awq
  int bits = 4;
  int64_t group_size = 128;  // a multiple of 32, or -1 for one group per output row
  bool asymmetric = false;
  double damp = 0.01;      // GPTQ: fraction of mean(diag H) added to the diagonal
  bool act_order = false;  // GPTQ: columns by descending diag(H), written with g_idx
  int window = 512;        // calibration tokens per sequence
  int threads = 0;         // GPTQ/AWQ's own loops (0: all cores); the backend has its own
};

// One matrix: the relative output error on its calibration inputs X,
// ||X·(Q − W)ᵀ||_F / ||X·Wᵀ||_F, for this method and for round-to-nearest of the same W on the
// same X, and the relative weight error ||Q − W||_F / ||W||_F (Q: the weights the quantized
// layer effectively applies, AWQ's scales undone).
struct CalibratedMatrixReport {
  std::string name;  // "q_proj", ... "down_proj"
  int64_t rows = 0, cols = 0;
  double out_err = 0, rtn_out_err = 0, weight_err = 0;
};

struct CalibratedLayerReport {
  int layer = 0, n_layers = 0;
  std::vector<CalibratedMatrixReport> matrices;
  std::vector<double> awq_alpha;  // AWQ: α of q/k/v, o (NaN when not folded), gate/up, down
  double seconds = 0;             // this layer's time
};

// Quantizes every decoder linear layer of w in place (W4G/W8G matrices; AWQ also replaces the
// two norms and, where it folds scales into them, v_proj and up_proj). `tokens` are cut into
// windows of options.window tokens (the remainder is dropped; at least one window). `be` must
// be a CPU backend. Throws tessera::Error naming what is wrong.
void quantize_calibrated(ModelWeights& w, Backend& be, std::span<const int32_t> tokens,
                         const CalibratedQuantOptions& options,
                         const std::function<void(const CalibratedLayerReport&)>& on_layer = {});

// The names of the seven decoder linear layers in the order reports list them.
extern const char* const kDecoderLinearNames[7];

}  // namespace tessera
