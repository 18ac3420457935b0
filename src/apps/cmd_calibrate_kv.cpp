// tessera calibrate-kv: static fp8 KV scales from a text (docs/design/kv-quant.md). The model
// runs over windows of the text with an exact f32 cache; the largest |K| and |V| each layer
// and KV head stores become scales (amax / the format's largest code) in a JSON file that
// `--kv-scales` loads with `--kv-cache-dtype fp8_e4m3` (:tensor) or `fp8_e4m3:head`.
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
  };
  auto a = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("calibrate-kv", "static fp8 KV-cache scales from a calibration text");
  a->model.add_to(*cmd);
  cmd->add_option("-f,--file", a->file, "calibration text")->required();
  cmd->add_option("-o,--out", a->out, "scales file to write (for --kv-scales)")->capture_default_str();
  cmd->add_option("--format", a->format, "the fp8 format the scales are for: fp8_e4m3|fp8_e5m2 with :tensor or :head")
      ->capture_default_str();
  cmd->add_option("--window", a->window, "tokens per calibration window")->capture_default_str();
  cmd->add_option("--chunks", a->max_chunks, "windows to run at most (0 = the whole text)")->capture_default_str();
  cmd->callback([a] {
    const KvFormat k = parse_kv_format(a->format, true), v = parse_kv_format(a->format, false);
    TESSERA_CHECK(k.is_fp8() && k.static_scale(), "calibrate-kv --format ", a->format,
                  ": static scales are for fp8 with :tensor or :head");
    SessionOptions so = a->model.session_options();
    so.k_format = so.v_format = kv_format_of(DType::F32);  // exact values to measure
    so.k_scales.clear();
    so.v_scales.clear();
    so.ctx = std::max(so.ctx, a->window);
    so.kv_tokens = a->window;
    Session session(so);
    std::string text = read_file(a->file);
    const auto tokens = session.tokenizer().encode(text, /*add_special=*/false, /*parse_special=*/false);
    const KvAbsMax amax = measure_kv_absmax(session, tokens, a->window, a->max_chunks);
    KvScales scales = kv_scales_from_absmax(amax, k, v);
    scales.model = a->model.model;
    write_kv_scales(a->out, scales, kv_format_name(k, true), kv_format_name(v), session.config().n_head_kv);
    float kmax = 0, vmax = 0;
    for (const auto& r : amax.k)
      for (float x : r) kmax = std::max(kmax, x);
    for (const auto& r : amax.v)
      for (float x : r) vmax = std::max(vmax, x);
    std::printf("calibrate-kv: %lld tokens, %zu layers x %d KV heads; max |K| %.3g, max |V| %.3g; %s scales -> %s\n",
                static_cast<long long>(amax.tokens), amax.k.size(), session.config().n_head_kv, kmax, vmax,
                a->format.c_str(), a->out.c_str());
  });
}

}  // namespace tessera::apps
