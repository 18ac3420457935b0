// tessera calibrate-kv: static KV constants from a text (docs/design/kv-quant.md). The model
// runs over windows of the text with an exact f32 cache; what each layer and KV head stores
// becomes a JSON file that `--kv-scales` loads: for fp8 :tensor / :head the largest |K| and
// |V| as scales (amax / the format's largest code), for TurboQuant the per-channel mean key
// (k_mean), which the store subtracts, and the per-channel key equalization (k_equal, from the
// keys' and the queries' per-channel spread), which the store divides by and the query
// multiplies by; and, for position-aware centering (file version 2, "k_rope"), the pre-RoPE
// mean key m (keys stored as k − R(p)·m) with its own equalization and each layer's RoPE.
// Queries are only visible on the CPU backend (backend/query_observer.h).
#include <cstdio>

#include "apps/commands.h"
#include "apps/common.h"
#include "core/error.h"
#include "engine/kv_calibration.h"
#include "engine/kv_scales.h"
#include "tokenizer/tokenizer.h"

namespace tessera::apps {

void add_calibrate_kv(CLI::App& app) {
  struct Args {
    ModelArgs model;
    std::string file, out = "kv-scales.json", format = "fp8_e4m3:head";
    int window = 512;
    int max_chunks = 16;
    bool stats = false;
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("calibrate-kv", "static KV-cache constants (fp8 scales, turbo key means and equalization)");
  a->model.add_to(*cmd);
  cmd->add_option("-f,--file", a->file, "calibration text")->required();
  cmd->add_option("-o,--out", a->out, "file to write (for --kv-scales)")->capture_default_str();
  cmd->add_option("--format", a->format,
                  "the format the constants are for: fp8_e4m3|fp8_e5m2 with :tensor or :head (scales), or "
                  "turbo2.5|3|3.5|4 (key means and equalization, position-aware with RoPE, and the first key's "
                  "center)")
      ->capture_default_str();
  cmd->add_option("--window", a->window, "tokens per calibration window")->capture_default_str();
  cmd->add_option("--chunks", a->max_chunks, "windows to run at most (0 = the whole text)")->capture_default_str();
  cmd->add_flag("--stats", a->stats, "print per-layer key statistics (mean energy, outlier channels)");
  cmd->callback([a] {
    const KvFormat k = parse_kv_format(a->format, true), v = parse_kv_format(a->format, false);
    TESSERA_CHECK((k.is_fp8() && k.static_scale()) || k.centers_keys(), "calibrate-kv --format ", a->format,
                  ": static scales are for fp8 with :tensor or :head, key means for turbo formats");
    SessionOptions so = a->model.session_options();
    // Refused before the model loads, not after the whole pass (kv_scales_from_stats checks too).
    TESSERA_CHECK(!k.centers_keys() || so.backend.device == "cpu", "calibrate-kv --format ", a->format,
                  ": the key equalization needs the queries, which only the CPU backend shows; use --device cpu");
    so.k_format = so.v_format = kv_format_of(DType::F32);  // exact values to measure
    so.k_scales.clear();
    so.v_scales.clear();
    so.k_mean.clear();
    so.k_equal.clear();
    so.k_rope_dim = 0;
    so.k_rope_freq.clear();
    so.k_first.clear();
    so.ctx = std::max(so.ctx, a->window);
    so.kv_tokens = a->window;
    Session session(so);
    std::string text = read_file(a->file);
    const auto tokens = session.tokenizer().encode(text, /*add_special=*/false, /*parse_special=*/false);
    const KvStats stats = measure_kv_stats(session, tokens, a->window, a->max_chunks);
    KvScales scales = kv_scales_from_stats(stats, k, v);
    scales.model = a->model.model;
    write_kv_scales(a->out, scales, kv_format_name(k, true), kv_format_name(v), session.config().n_head_kv,
                    session.config().head_dim);
    if (a->stats) std::printf("%s", kv_key_stats_table(stats).c_str());
    float kmax = 0, vmax = 0;
    for (const auto& r : stats.k)
      for (float x : r) kmax = std::max(kmax, x);
    for (const auto& r : stats.v)
      for (float x : r) vmax = std::max(vmax, x);
    std::printf("calibrate-kv: %lld tokens, %zu layers x %d KV heads; max |K| %.3g, max |V| %.3g; %s %s -> %s\n",
                static_cast<long long>(stats.tokens), stats.k.size(), session.config().n_head_kv, kmax, vmax,
                a->format.c_str(),
                k.centers_keys() ? "key means and equalization (static, position-aware where the model has RoPE) "
                                   "and the first key's center"
                                 : "scales",
                a->out.c_str());
  });
}

}  // namespace tessera::apps
