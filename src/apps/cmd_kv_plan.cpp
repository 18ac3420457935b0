// tessera kv-plan: KV-cache bytes per token, block overhead and the largest concurrency that
// fits a memory budget, per KV dtype, block size and context length.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/commands.h"
#include "benchharness/kv_plan.h"
#include "core/error.h"

namespace tessera::apps {

namespace {

template <typename T>
std::vector<T> parse_list(const std::string& text, const char* flag) {
  std::vector<T> out;
  size_t pos = 0;
  while (pos <= text.size()) {
    const size_t comma = std::min(text.find(',', pos), text.size());
    const std::string item = text.substr(pos, comma - pos);
    long long v = 0;
    try {
      size_t used = 0;
      v = std::stoll(item, &used);
      // Allow a k suffix for contexts: 8k = 8192.
      if (used + 1 == item.size() && (item.back() == 'k' || item.back() == 'K'))
        v *= 1024;
      else if (used != item.size())
        throw std::invalid_argument(item);
    } catch (const std::exception&) {
      fail(flag, " '", text, "': '", item, "' is not a positive integer");
    }
    TESSERA_CHECK(v > 0, flag, " values must be positive");
    out.push_back(static_cast<T>(v));
    pos = comma + 1;
  }
  return out;
}

}  // namespace

void add_kv_plan(CLI::App& app) {
  struct Args {
    std::string model = "smollm2-135m";
    std::string memory = "16GiB";
    std::string reserve = "0";
    std::string ctx = "2048,8192,32768";
    std::string block_size = "16";
    std::string formats;
    bool json = false;
    int tensor_parallel_size = 1;
    int pipeline_parallel_size = 1;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("kv-plan", "KV cache bytes per token and max concurrency for a memory budget");
  cmd->add_option("-m,--model", a->model, "GGUF path, alias, Hugging Face directory (config.json) or dummy:<preset>")
      ->capture_default_str();
  cmd->add_option("--memory", a->memory, "device memory budget (weights + KV), e.g. 16GiB, 80GB")
      ->capture_default_str();
  cmd->add_option("--reserve", a->reserve, "memory kept for activations and the runtime")->capture_default_str();
  cmd->add_option("--ctx", a->ctx, "comma-separated context lengths (8k = 8192)")->capture_default_str();
  cmd->add_option("--block-size", a->block_size, "comma-separated KV block sizes (tokens)")->capture_default_str();
  cmd->add_option("--kv-cache-dtype", a->formats,
                  "comma-separated KV formats (default: f32, f16, fp8, int8, int4 and turbo variants)");
  cmd->add_flag("--json", a->json, "print JSON instead of a table");
  cmd->add_option("--tensor-parallel-size", a->tensor_parallel_size,
                  "(also -tp) plan one rank of N: --memory is a rank's device, holding 1/N of the weights and its "
                  "KV heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--pipeline-parallel-size", a->pipeline_parallel_size,
                  "(also -pp) plan one stage of N: --memory is a stage's device, holding the largest stage's layers "
                  "and their share of the weights")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->callback([a] {
    bench::KvPlanOptions o;
    o.memory_bytes = bench::parse_memory_size(a->memory);
    o.reserve_bytes = a->reserve == "0" ? 0 : bench::parse_memory_size(a->reserve);
    o.ctx = parse_list<int64_t>(a->ctx, "--ctx");
    o.block_sizes = parse_list<int>(a->block_size, "--block-size");
    o.tensor_parallel_size = a->tensor_parallel_size;
    o.pipeline_parallel_size = a->pipeline_parallel_size;
    if (!a->formats.empty()) {
      o.formats.clear();
      for (size_t pos = 0; pos <= a->formats.size();) {
        const size_t comma = std::min(a->formats.find(',', pos), a->formats.size());
        o.formats.push_back(a->formats.substr(pos, comma - pos));
        pos = comma + 1;
      }
    }
    const bench::KvModelInfo info = bench::load_kv_model_info(a->model);
    const auto rows = bench::kv_plan(info, o);
    if (a->json)
      std::printf("%s\n", bench::kv_plan_json(info, o, rows).dump(1).c_str());
    else
      std::printf("%s", bench::format_kv_plan(info, o, rows).c_str());
  });
}

}  // namespace tessera::apps
