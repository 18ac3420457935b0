#include "apps/common.h"

#include <charconv>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <utility>

#include "core/error.h"
#include "engine/engine_summary.h"
#include "engine/kv_scales.h"

namespace tessera::apps {

void ModelArgs::add_to(CLI::App& cmd) {
  cmd.add_option("-m,--model", model, "GGUF path, alias (smollm2-135m) or dummy:<preset>[:dtype]")
      ->capture_default_str();
  cmd.add_option("--device", device, "cpu or cuda")->capture_default_str();
  cmd.add_option("-t,--threads", threads, "CPU threads (0 = all cores)")->capture_default_str();
  cmd.add_option("--max-model-len,--ctx,-c", max_model_len,
                 "tokens of one sequence, prompt + output (0 = the model's trained context)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("-b,--batch-size", batch, "tokens per forward (prefill chunk)")->capture_default_str();
  cmd.add_option("--block-size", block_size, "tokens per KV block")->capture_default_str();
  cmd.add_option("--kv-cache-dtype,--kv-type", kv_cache_dtype,
                 "KV cache format of K and V: f16, f32, fp8[_e4m3|_e5m2][:tensor|:head|:token], int8[:token|:gN], "
                 "int4[:kivi|:gN], turbo2.5|3|3.5|4[:qjl] (docs/design/kv-quant.md)")
      ->capture_default_str();
  cmd.add_option("--k-cache-dtype", k_cache_dtype, "format of K alone (overrides --kv-cache-dtype)");
  cmd.add_option("--v-cache-dtype", v_cache_dtype, "format of V alone (overrides --kv-cache-dtype)");
  cmd.add_option("--kv-scales", kv_scales,
                 "static KV constants (JSON from tessera calibrate-kv): fp8 :tensor/:head scales, turbo key means");
  cmd.add_option("--quantization,-q", quantization,
                 "quantize the model's linear layers at load, round-to-nearest: fp8 (E4M3, a scale per output "
                 "channel), int8 (8-bit integers, a scale per output channel, = MODEL@w8c) or w4a16 (4-bit groups "
                 "of 128, = MODEL@w4g128); docs/design/weight-quant.md");
  cmd.add_flag("--no-cuda-graphs", no_cuda_graphs, "CUDA: launch every op instead of replaying decode graphs");
}

SessionOptions ModelArgs::session_options() const {
  SessionOptions o;
  o.model = model;
  if (!quantization.empty()) {
    // The flag maps onto the MODEL@spec quantization at load that Session performs.
    std::string spec;
    if (quantization == "fp8")
      spec = "fp8";
    else if (quantization == "w4a16")
      spec = "w4g128";
    else if (quantization == "int8")
      spec = "w8c";  // the CPU multiplies it with 8-bit activations (W8A8); CUDA with 16/32-bit ones
    else
      fail("--quantization '", quantization, "': expected fp8, int8 or w4a16");
    TESSERA_CHECK(model.find('@') == std::string::npos, "--quantization ", quantization, " with model '", model,
                  "', which names a quantization after '@' already");
    o.model += "@" + spec;
  }
  o.backend.device = device;
  o.backend.threads = threads;
  o.backend.cuda_graphs = !no_cuda_graphs;
  o.ctx = max_model_len;
  o.max_batch_tokens = batch;
  o.block_size = block_size;
  o.k_format = parse_kv_format(k_cache_dtype.empty() ? kv_cache_dtype : k_cache_dtype, true);
  o.v_format = parse_kv_format(v_cache_dtype.empty() ? kv_cache_dtype : v_cache_dtype, false);
  if (!kv_scales.empty()) {
    const KvScales s = read_kv_scales(kv_scales);
    const bool scales = o.k_format.static_scale() || o.v_format.static_scale();
    const bool mean = o.k_format.centers_keys() && !s.k_mean.empty();
    TESSERA_CHECK(scales || mean, "--kv-scales ", kv_scales, ": the KV format ", kv_format_name(o.k_format, true), "/",
                  kv_format_name(o.v_format),
                  " takes nothing from it (fp8 :tensor or :head takes scales, turbo keys the key means \"k_mean\")");
    TESSERA_CHECK(!o.k_format.static_scale() || !s.k.empty(), "--kv-scales ", kv_scales, ": no K scales for ",
                  kv_format_name(o.k_format, true));
    TESSERA_CHECK(!o.v_format.static_scale() || !s.v.empty(), "--kv-scales ", kv_scales, ": no V scales for ",
                  kv_format_name(o.v_format));
    if (o.k_format.static_scale()) o.k_scales = s.k;
    if (o.v_format.static_scale()) o.v_scales = s.v;
    if (mean) apply_key_centering(s, o);
  }
  if (o.k_format.centers_keys() && o.k_mean.empty())
    std::fprintf(stderr,
                 "tessera: warning: %s keys without calibrated key means (--kv-scales from `tessera calibrate-kv "
                 "--format %s`) are not centered; on models whose keys carry a per-channel offset this costs "
                 "much quality (SmolLM2-135M, turbo3.5: +24%% perplexity uncentered, +10%% centered; "
                 "docs/benchmarks/kv-quant.md)\n",
                 kv_format_name(o.k_format, true).c_str(), kv_format_name(o.k_format, true).c_str());
  o.dummy_seed = seed;
  return o;
}

void apply_key_centering(const KvScales& file, SessionOptions& o) {
  // Only the CPU backend reads centering by position (Backend::supports_key_centering_by_position);
  // elsewhere the file's static pair, which it always holds beside "k_rope". The CUDA kernels
  // read "k_first" (cuda_kv_quant_test), but their last fix has not run on a GPU yet: until it
  // has, CUDA keeps the static centering alone (docs/design/kv-quant.md, "On the GPU").
  const bool static_only = o.backend.device != "cpu" && (file.rope_dim > 0 || !file.k_first.empty());
  if (static_only)
    std::fprintf(stderr,
                 "tessera: warning: --device %s does not read position-aware key centering (\"k_rope\") or the "
                 "first key's center (\"k_first\") yet; its keys are centered by the file's static k_mean / "
                 "k_equal (SmolLM2-135M, turbo3.5, 2,048-token windows: KL 0.172 static against 0.057 with both; "
                 "docs/benchmarks/kv-quant.md)\n",
                 o.backend.device.c_str());
  o.k_first = static_only ? std::vector<std::vector<float>>() : file.k_first;
  if (!static_only && file.rope_dim > 0) {  // version 2: position-aware centering replaces the static one
    o.k_mean = file.rope_mean;
    o.k_equal = file.rope_equal;
    o.k_rope_dim = file.rope_dim;
    o.k_rope_neox = file.rope_neox;
    o.k_rope_freq = file.rope_inv_freq;
    return;
  }
  o.k_mean = file.k_mean;
  o.k_equal = file.k_equal;
  o.k_rope_dim = 0;
  o.k_rope_freq.clear();
}

void EngineArgs::add_to(CLI::App& cmd) {
  cmd.add_option("--max-num-seqs", max_num_seqs, "sequences per engine step")->capture_default_str();
  cmd.add_option("--max-num-batched-tokens", max_num_batched_tokens, "tokens per engine step")->capture_default_str();
  cmd.add_option("--kv-cache-memory", kv_cache_memory,
                 "KV cache budget in bytes (suffix K, M, G); "
                 "default 40% of available memory");
  cmd.add_flag("--no-prefix-cache", no_prefix_cache, "disable prefix caching");
  cmd.add_flag("--disable-hybrid-kv-cache-manager", disable_hybrid_kv,
               "sliding-window layers keep the whole sequence's KV, like every other layer (default: a pool of "
               "their own that frees the blocks behind the window)");
  cmd.add_option("--scheduling-policy", scheduling_policy,
                 "fcfs (arrival order) or priority (the request's priority, lower first; preempts lower ones)")
      ->check(CLI::IsMember({"fcfs", "priority"}))
      ->capture_default_str();
  cmd.add_option("--preemption-mode", preemption_mode,
                 "when KV blocks run out: recompute (free and recompute later) or swap (copy KV to host memory)")
      ->check(CLI::IsMember({"recompute", "swap"}))
      ->capture_default_str();
  cmd.add_option("--swap-space", swap_space_gib,
                 "host memory for swapped-out KV in GiB (only with --preemption-mode swap; default 4)")
      ->check(CLI::Range(0.0, 1024.0));
  cmd.add_option("--max-requests-per-tenant", max_requests_per_tenant,
                 "sequences in flight per tenant: a request counts n x prompts (0 = no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--speculative-config", speculative_config,
                 "speculative decoding as JSON, e.g. '{\"method\": \"ngram\", \"num_speculative_tokens\": 4, "
                 "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}'; methods ngram, draft_model (\"model\": a model "
                 "spec as -m takes it, optional \"draft_layers\") and early_exit (\"draft_layers\": L); ngram's "
                 "\"prompt_lookup_candidates\": C drafts C continuations as a tree (docs/design/spec-decode.md)");
  cmd.add_option(
         "--tensor-parallel-size", tensor_parallel_size,
         "(also -tp) split the model over N ranks (tensor parallelism; threads of this process on the CPU, GPUs "
         "cuda:0..N-1 on CUDA): heads, FFN and vocabulary N ways, each rank a KV cache of its KV heads; "
         "--kv-cache-memory and --swap-space are per rank (docs/design/parallel.md)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--pipeline-parallel-size", pipeline_parallel_size,
                 "(also -pp) split the model's layers into N stages (pipeline parallelism; threads of this process on "
                 "the CPU, GPUs cuda:0..N-1 on CUDA), each stage a KV cache of its layers; each step's batch runs "
                 "through them in micro-batches; --kv-cache-memory and --swap-space are per stage "
                 "(docs/design/parallel.md)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--max-tokens-per-tenant", max_tokens_per_tenant,
                 "tokens in flight per tenant, prompt + max_tokens x n of each request (0 = no limit)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

namespace {
int64_t parse_bytes(const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    fail("'", s, "' is not a byte count (e.g. 512M, 2G)");
  }
  const std::string suffix = s.substr(used);
  double mult = 1;
  if (suffix == "K" || suffix == "k")
    mult = 1024.0;
  else if (suffix == "M" || suffix == "m")
    mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g")
    mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty())
    fail("'", s, "' has an unknown size suffix (K, M, G)");
  TESSERA_CHECK(v > 0 && v * mult < 9e18, "'", s, "' is not a positive byte count");
  return static_cast<int64_t>(v * mult);
}
}  // namespace

ModelEngineOptions EngineArgs::engine_options(const ModelArgs& model) const {
  ModelEngineOptions o;
  o.session = model.session_options();
  o.scheduler.max_num_seqs = max_num_seqs;
  o.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  o.scheduler.max_model_len = model.max_model_len;  // 0: the model's trained context
  o.scheduler.policy = parse_scheduling_policy(scheduling_policy);
  if (!kv_cache_memory.empty()) o.kv_cache_bytes = parse_bytes(kv_cache_memory);
  o.prefix_caching = !no_prefix_cache;
  o.hybrid_kv_cache = !disable_hybrid_kv;
  if (preemption_mode == "swap") {
    o.scheduler.preemption_mode = PreemptionMode::Swap;
    o.swap_space_bytes = static_cast<int64_t>(swap_space_gib.value_or(4.0) * 1024.0 * 1024.0 * 1024.0);
  } else if (preemption_mode != "recompute") {
    fail("--preemption-mode '", preemption_mode, "' is not one of recompute, swap");
  } else if (swap_space_gib) {
    fail("--swap-space ", *swap_space_gib, " is only used with --preemption-mode swap (the mode is ", preemption_mode,
         "): add --preemption-mode swap or drop --swap-space");
  }
  o.admission.max_requests_per_tenant = max_requests_per_tenant;
  o.admission.max_tokens_per_tenant = max_tokens_per_tenant;
  o.speculative = parse_speculative_config(speculative_config);
  o.tensor_parallel_size = tensor_parallel_size;
  o.pipeline_parallel_size = pipeline_parallel_size;
  return o;
}

void print_engine_summary(ModelEngine& engine, const ModelArgs& model) {
  const std::string text = format_engine_summary(describe_engine(engine, model.model));
  std::fprintf(stderr, "%s", text.c_str());
  std::fflush(stderr);
}

std::vector<std::string> expand_short_aliases(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i] == "--") break;  // what follows is positional
    for (const auto& [alias, flag] :
         {std::pair<std::string, std::string>{"-tp", "--tensor-parallel-size"}, {"-pp", "--pipeline-parallel-size"}}) {
      if (args[i] == alias)
        args[i] = flag;
      else if (args[i].rfind(alias + "=", 0) == 0)
        args[i] = flag + "=" + args[i].substr(alias.size() + 1);
    }
  }
  return args;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read '", path, "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int> parse_int_list(const std::string& text, const std::string& option, int min_value) {
  std::vector<int> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    int value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    // The whole item must be the number: "8x" or "" is refused, not read as 8 or skipped.
    if (ec != std::errc() || end != item.data() + item.size() || item.empty())
      fail(option, " '", text, "' is not a comma-separated list of integers");
    v.push_back(value);
    TESSERA_CHECK(v.back() >= min_value, option, " values must be at least ", min_value, " (got ", v.back(), ")");
  }
  TESSERA_CHECK(!v.empty(), option, " is empty");
  return v;
}

}  // namespace tessera::apps
