#pragma once
// Offline weight quantization of a Hugging Face checkpoint (`tessera quantize`): every linear
// layer of the decoder blocks quantized to integers in groups, written as compressed-tensors
// `pack-quantized` safetensors with a config.json that tessera (and vLLM) load. Round-to-nearest
// here; GPTQ and AWQ quantize the loaded model first (model/quantize_calibrated.h) and hand
// the result in.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/weights.h"

namespace tessera {

struct QuantizeOptions {
  std::string method = "rtn";
  int bits = 4;              // 4 or 8
  int64_t group_size = 128;  // a multiple of 32, or -1 for one group per output row
  bool asymmetric = false;   // zero points per group
  // GPTQ/AWQ (the calibration itself runs before quantize_checkpoint, see there):
  std::string calib_file;
  int calib_tokens = 8192;
  int window = 512;
  double damp = 0.01;
  bool act_order = false;
};

// One quantized matrix's relative error ||W - Q(W)||_F / ||W||_F.
struct QuantizedTensorReport {
  std::string name;
  int64_t rows = 0, cols = 0;
  double rel_error = 0;
};

struct QuantizeReport {
  std::vector<QuantizedTensorReport> tensors;
  int64_t bytes_in = 0, bytes_out = 0;  // safetensors data of the input and of the output
};

// Reads in_dir (config.json + safetensors, 16- or 32-bit), writes out_dir/config.json (with
// quantization_config), out_dir/model.safetensors and copies the other files of in_dir
// (tokenizer, generation config). `on_layer(i, n_layers, tensors of that layer)` is called as
// each decoder layer is done. Throws tessera::Error naming what is wrong (an already quantized
// input, an unsupported option, a tensor of an unexpected type).
//
// method gptq/awq: `calibrated` is in_dir's model (load_safetensors_weights) after
// quantize_calibrated; its group-quantized matrices are written instead of RTN's, and its
// norms (and v_proj bias), which AWQ changes, as F32. rel_error is against in_dir's weights
// for GPTQ, NaN for AWQ (its matrices hold scaled weights; quantize_calibrated reports the
// output errors that matter).
QuantizeReport quantize_checkpoint(
    const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& options,
    const std::function<void(int layer, int n_layers, const std::vector<QuantizedTensorReport>&)>& on_layer = {},
    const ModelWeights* calibrated = nullptr);

}  // namespace tessera
