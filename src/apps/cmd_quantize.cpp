// tessera quantize: group quantization of a 16-bit Hugging Face checkpoint's linear layers
// (round-to-nearest, GPTQ or AWQ), written as compressed-tensors pack-quantized safetensors
// that tessera and vLLM load; or a GGUF file's matrices requantized to one GGML block type
// (--type), written as GGUF (llama-quantize's job).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "apps/commands.h"
#include "apps/common.h"
#include "backend/backend.h"
#include "core/error.h"
#include "model/quantize_checkpoint.h"
#include "model/quantize_gguf.h"
#include "model/quantize_weights.h"
#include "tokenizer/tokenizer.h"

namespace tessera::apps {

namespace {

// GPTQ/AWQ: the model loaded, the calibration text tokenized, every layer quantized; prints a
// line per layer and the mean output errors against RTN's.
std::shared_ptr<ModelWeights> calibrate(const std::string& dir, const QuantizeOptions& o, int threads) {
  const std::string tok_path = (std::filesystem::path(dir) / "tokenizer.json").string();
  TESSERA_CHECK(std::filesystem::exists(tok_path), "quantize: ", dir,
                " has no tokenizer.json (the calibration text is tokenized with it)");
  const auto tokenizer = Tokenizer::from_hf_json(tok_path);
  auto weights = load_safetensors_weights(dir);
  BackendOptions bo;
  bo.threads = threads;
  const auto be = make_backend(bo);
  WeightQuantSpec spec;
  spec.method = o.method;
  spec.bits = o.bits;
  spec.group = o.group_size < 0 ? 0 : o.group_size;
  spec.asymmetric = o.asymmetric;
  spec.calib_file = o.calib_file;
  spec.calib_tokens = o.calib_tokens;
  spec.window = o.window;
  spec.damp = o.damp;
  spec.act_order = o.act_order;
  double sum = 0, sum_rtn = 0;
  int n = 0;
  quantize_linear_weights_calibrated(
      *weights, spec,
      [&](const std::string& text) {
        const auto t = tokenizer->encode(text, /*add_special=*/false, /*parse_special=*/false);
        std::printf("calibration: %zu tokens in %s, %d used (windows of %d)\n", t.size(), o.calib_file.c_str(),
                    std::min<int>(static_cast<int>(t.size()), o.calib_tokens) / o.window * o.window, o.window);
        return t;
      },
      *be,
      [&](const CalibratedLayerReport& r) {
        std::printf("  %s\n", describe_calibrated_layer(r).c_str());
        std::fflush(stdout);
        for (const auto& m : r.matrices) sum += m.out_err, sum_rtn += m.rtn_out_err, ++n;
      });
  std::printf("mean relative output error on the calibration inputs: %s %.5f, RTN %.5f (%d matrices)\n",
              o.method.c_str(), n ? sum / n : 0.0, n ? sum_rtn / n : 0.0, n);
  return weights;
}

// GGUF in, GGUF out: a line per requantized tensor, then the totals.
void quantize_gguf_file(const std::string& in, const std::string& out, const std::string& type) {
  const GgufQuantTarget to = gguf_quant_target(type);
  const auto t0 = std::chrono::steady_clock::now();
  auto secs = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::printf("quantize: %s -> %s, matrices to %s%s\n", in.c_str(), out.c_str(),
              std::string(dtype_name(to.base)).c_str(),
              to.mix ? " (Q6_K for the output, and attn_v / ffn_down in llama.cpp's use_more_bits layers)" : "");
  int requantized = 0;
  const GgufQuantizeReport r = quantize_gguf(in, out, to, [&](const GgufTensorReport& t, size_t i, size_t n) {
    if (t.to == t.from) return;
    const bool was_quantized = t.from != DType::F32 && t.from != DType::F16 && t.from != DType::BF16;
    std::printf("  [%zu/%zu] %-40s %5s -> %-5s rel error %.5f%s (%.1f s)\n", i + 1, n, t.name.c_str(),
                std::string(dtype_name(t.from)).c_str(), std::string(dtype_name(t.to)).c_str(), t.rel_error,
                was_quantized ? " (requantized from a quantized source)" : "", secs());
    std::fflush(stdout);
    ++requantized;
  });
  std::printf(
      "\n%d of %zu tensors requantized (the rest kept: norms, routers, vectors, rows not a multiple of the "
      "block); %.1f MB -> %.1f MB in %.1f s\n",
      requantized, r.tensors.size(), r.bytes_in / 1e6, r.bytes_out / 1e6, secs());
}

}  // namespace

void add_quantize(CLI::App& app) {
  struct Args {
    std::string model, out, type;
    QuantizeOptions o;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("quantize",
                                     "Quantize a Hugging Face checkpoint's linear layers to 4/8-bit groups, or a "
                                     "GGUF file's matrices to a GGML block type");
  cmd->add_option("-m,--model", a->model,
                  "Hugging Face directory (config.json + F16/BF16/F32 safetensors), or a .gguf file (with --type)")
      ->required();
  cmd->add_option("-o,--out", a->out,
                  "output directory (compressed-tensors pack-quantized), or the .gguf file to write")
      ->required();
  cmd->add_option("--type", a->type, "GGUF input: q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q4_k_m, q5_k, q5_k_m or q6_k");
  cmd->add_option("--method", a->o.method, "rtn, gptq or awq")->capture_default_str();
  cmd->add_option("--bits", a->o.bits, "4 or 8")->capture_default_str();
  cmd->add_option("--group-size", a->o.group_size, "columns per scale: a multiple of 32, or -1 per output row")
      ->capture_default_str();
  cmd->add_flag("--asym", a->o.asymmetric, "zero points per group (default symmetric)");
  cmd->add_option("--calib", a->o.calib_file, "gptq/awq: calibration text (tokenized with the model's tokenizer)");
  cmd->add_option("--calib-tokens", a->o.calib_tokens, "gptq/awq: calibration tokens used (the text's first)")
      ->capture_default_str();
  cmd->add_option("--window", a->o.window, "gptq/awq: tokens per calibration sequence")->capture_default_str();
  cmd->add_option("--damp", a->o.damp, "gptq: damping, a fraction of the mean diagonal of H")->capture_default_str();
  cmd->add_flag("--act-order", a->o.act_order, "gptq: columns by descending diag(H), written with g_idx");
  cmd->add_option("-t,--threads", a->threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd->callback([a] {
    const QuantizeOptions& o = a->o;
    if (!std::filesystem::is_directory(a->model) && a->model.ends_with(".gguf")) {
      TESSERA_CHECK(!a->type.empty(), "quantize: a GGUF input needs --type (q4_0, q8_0, q4_k, ...)");
      TESSERA_CHECK(o.method == "rtn" && o.calib_file.empty(), "quantize: GGUF input is requantized round-to-",
                    "nearest; --method gptq/awq take a Hugging Face directory");
      return quantize_gguf_file(a->model, a->out, a->type);
    }
    TESSERA_CHECK(a->type.empty(), "quantize: --type is for GGUF input; a Hugging Face directory takes --bits and ",
                  "--group-size");
    const auto t0 = std::chrono::steady_clock::now();
    auto secs = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    TESSERA_CHECK(o.method == "rtn" || o.method == "gptq" || o.method == "awq", "quantize: --method ", o.method,
                  " (rtn, gptq or awq)");
    TESSERA_CHECK(o.method == "rtn" || !o.calib_file.empty(), "quantize: --method ", o.method,
                  " needs --calib FILE (calibration text)");
    TESSERA_CHECK(o.method != "rtn" || (o.calib_file.empty() && !o.act_order), "quantize: --method rtn takes ",
                  "no --calib or --act-order");
    TESSERA_CHECK(!o.act_order || o.method == "gptq", "quantize: --act-order is a GPTQ option");
    TESSERA_CHECK(std::filesystem::is_directory(a->model), "quantize: '", a->model,
                  "' is not a Hugging Face directory (nor a .gguf file, which takes --type). GPTQ/AWQ on a GGUF "
                  "model run at load instead: -m MODEL.gguf@gptq-w4g128,calib=FILE (tessera eval/serve/bench)");
    std::printf("quantize: %s -> %s, %s %d-bit, group %lld, %s%s\n", a->model.c_str(), a->out.c_str(), o.method.c_str(),
                o.bits, static_cast<long long>(o.group_size), o.asymmetric ? "asymmetric" : "symmetric",
                o.act_order ? ", act-order" : "");
    std::shared_ptr<ModelWeights> calibrated;
    if (o.method != "rtn") calibrated = calibrate(a->model, o, a->threads);
    const QuantizeReport r = quantize_checkpoint(
        a->model, a->out, o,
        [&](int layer, int n_layers, const std::vector<QuantizedTensorReport>& ts) {
          if (calibrated) return;  // calibrate printed its own lines
          double worst = 0;
          for (const auto& t : ts) worst = std::max(worst, t.rel_error);
          std::printf("  layer %d/%d: %zu matrices, worst relative error %.4f (%.1f s)\n", layer + 1, n_layers,
                      ts.size(), worst, secs());
          std::fflush(stdout);
        },
        calibrated.get());
    std::printf("\n%-56s %8s %8s %10s\n", "tensor", "rows", "cols", "rel error");
    double sum = 0;
    for (const auto& t : r.tensors) {
      std::printf("%-56s %8lld %8lld %10.5f\n", t.name.c_str(), static_cast<long long>(t.rows),
                  static_cast<long long>(t.cols), t.rel_error);
      sum += t.rel_error;
    }
    int partial = 0;
    for (const auto& t : r.tensors) partial += o.group_size > 0 && t.cols % o.group_size != 0;
    if (partial)
      std::printf(
          "\nnote: %d matrices have a partial last group (width not a multiple of %lld): tessera loads them, "
          "vLLM may not\n",
          partial, static_cast<long long>(o.group_size));
    std::printf("\n%zu matrices quantized, mean relative weight error %.5f%s; %.1f MB -> %.1f MB in %.1f s\n",
                r.tensors.size(), r.tensors.empty() ? 0.0 : sum / static_cast<double>(r.tensors.size()),
                o.method == "awq" ? " (AWQ: of scaled weights, not reported)" : "", r.bytes_in / 1e6, r.bytes_out / 1e6,
                secs());
  });
}

}  // namespace tessera::apps
