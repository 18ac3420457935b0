// tessera quantize: round-to-nearest group quantization of a 16-bit Hugging Face checkpoint,
// written as compressed-tensors pack-quantized safetensors that tessera and vLLM load.
#include <chrono>
#include <cstdio>
#include <memory>

#include "apps/commands.h"
#include "model/quantize_checkpoint.h"

namespace tessera::apps {

void add_quantize(CLI::App& app) {
  struct Args {
    std::string model, out;
    QuantizeOptions o;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("quantize", "Quantize a Hugging Face checkpoint's linear layers to 4/8-bit groups");
  cmd->add_option("-m,--model", a->model, "Hugging Face directory (config.json + F16/BF16/F32 safetensors)")
      ->required();
  cmd->add_option("-o,--out", a->out, "output directory (compressed-tensors pack-quantized)")->required();
  cmd->add_option("--method", a->o.method, "rtn (gptq and awq are not implemented yet)")->capture_default_str();
  cmd->add_option("--bits", a->o.bits, "4 or 8")->capture_default_str();
  cmd->add_option("--group-size", a->o.group_size, "columns per scale: a multiple of 32, or -1 per output row")
      ->capture_default_str();
  cmd->add_flag("--asym", a->o.asymmetric, "zero points per group (default symmetric)");
  cmd->callback([a] {
    const auto t0 = std::chrono::steady_clock::now();
    auto secs = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
    std::printf("quantize: %s -> %s, %s %d-bit, group %lld, %s\n", a->model.c_str(), a->out.c_str(),
                a->o.method.c_str(), a->o.bits, static_cast<long long>(a->o.group_size),
                a->o.asymmetric ? "asymmetric" : "symmetric");
    const QuantizeReport r = quantize_checkpoint(
        a->model, a->out, a->o, [&](int layer, int n_layers, const std::vector<QuantizedTensorReport>& ts) {
          double worst = 0;
          for (const auto& t : ts) worst = std::max(worst, t.rel_error);
          std::printf("  layer %d/%d: %zu matrices, worst relative error %.4f (%.1f s)\n", layer + 1, n_layers,
                      ts.size(), worst, secs());
          std::fflush(stdout);
        });
    std::printf("\n%-56s %8s %8s %10s\n", "tensor", "rows", "cols", "rel error");
    double sum = 0;
    for (const auto& t : r.tensors) {
      std::printf("%-56s %8lld %8lld %10.5f\n", t.name.c_str(), static_cast<long long>(t.rows),
                  static_cast<long long>(t.cols), t.rel_error);
      sum += t.rel_error;
    }
    int partial = 0;
    for (const auto& t : r.tensors) partial += a->o.group_size > 0 && t.cols % a->o.group_size != 0;
    if (partial)
      std::printf(
          "\nnote: %d matrices have a partial last group (width not a multiple of %lld): tessera loads them, "
          "vLLM may not\n",
          partial, static_cast<long long>(a->o.group_size));
    std::printf("\n%zu matrices quantized, mean relative error %.5f; %.1f MB -> %.1f MB in %.1f s\n", r.tensors.size(),
                r.tensors.empty() ? 0.0 : sum / static_cast<double>(r.tensors.size()), r.bytes_in / 1e6,
                r.bytes_out / 1e6, secs());
  });
}

}  // namespace tessera::apps
