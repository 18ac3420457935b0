#pragma once
// Offline weight quantization of a Hugging Face checkpoint (`tessera quantize`): every linear
// layer of the decoder blocks quantized to integers in groups, written as compressed-tensors
// `pack-quantized` safetensors with a config.json that tessera (and vLLM) load. Round-to-nearest
// only for now; GPTQ and AWQ are issue 22's next steps.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace tessera {

struct QuantizeOptions {
  std::string method = "rtn";
  int bits = 4;              // 4 or 8
  int64_t group_size = 128;  // a multiple of 32, or -1 for one group per output row
  bool asymmetric = false;   // zero points per group
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
QuantizeReport quantize_checkpoint(
    const std::string& in_dir, const std::string& out_dir, const QuantizeOptions& options,
    const std::function<void(int layer, int n_layers, const std::vector<QuantizedTensorReport>&)>& on_layer = {});

}  // namespace tessera
