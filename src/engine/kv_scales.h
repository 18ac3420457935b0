#pragma once
// Static KV-cache constants, as `tessera calibrate-kv` writes them and --kv-scales reads them:
//   {"model": "...", "k_format": "fp8_e4m3:head", "v_format": "...", "n_layers": L,
//    "n_kv_heads": H, "head_dim": D, "k_scales": [[s_0, ..., s_H-1], ...L rows], "v_scales": [...],
//    "k_mean": [[μ_0, ..., μ_{H·D-1}], ...L rows], "k_equal": [[s_0, ..., s_{H·D-1}], ...L rows]}
// Scales (fp8 :tensor and :head): a row holds one value (per tensor) or one per KV head; a
// scale maps stored codes back to values (x = code * scale), so it is amax / the format's
// largest value; [] when the file has none. k_mean (optional; TurboQuant keys): per layer,
// the mean key of each KV head and channel (head-major), which the store subtracts.
// k_equal (optional, only beside k_mean): per layer, the per-channel key equalization s
// (head-major, finite and > 0): keys are stored as R ((k − μ)/s), queries scaled by s.
// Version 2 (optional "version": 2) adds "k_rope": {"rot_dim": r, "neox": b, "inv_freq": [[r/2
// values] ...L rows], "mean": [[m ...H·D] ...L rows], "equal": [[s ...H·D] ...L rows]}:
// position-aware key centering, m the pre-RoPE mean key (keys stored as (k − R(p)·m)/s, s
// measured around R(p)·m). k_mean / k_equal stay the static centering, so version-1 readers
// (which ignore "k_rope") and files without it load as before. Version 2 may also hold
// "k_first": [[c ...H·D] ...L rows], the mean key at position 0 (the attention sink), which
// that one key is stored relative to, with either centering (KvCacheSpec::k_first).
#include <string>
#include <vector>

#include "kv/kv_cache.h"
#include "model/weights.h"

namespace tessera {

struct KvScales {
  std::string model;
  std::vector<std::vector<float>> k, v;     // [n_layers][1 or n_kv_heads], or empty
  std::vector<std::vector<float>> k_mean;   // [n_layers][n_kv_heads * head_dim], or empty
  std::vector<std::vector<float>> k_equal;  // [n_layers][n_kv_heads * head_dim], or empty
  int rope_dim = 0;                         // "k_rope" (0: absent)
  bool rope_neox = false;
  std::vector<std::vector<float>> rope_inv_freq;  // [n_layers][rope_dim / 2]
  std::vector<std::vector<float>> rope_mean;      // [n_layers][n_kv_heads * head_dim] pre-RoPE
  std::vector<std::vector<float>> rope_equal;     // [n_layers][n_kv_heads * head_dim]
  std::vector<std::vector<float>> k_first;        // "k_first" [n_layers][n_kv_heads * head_dim], or empty
};

// Throws naming the file and what is wrong (not JSON, rows of the wrong length, a scale
// that is not finite and positive, a mean that is not finite, an equalization that is not
// finite and positive or comes without means or of another shape, layer counts that differ).
KvScales read_kv_scales(const std::string& path);
void write_kv_scales(const std::string& path, const KvScales& scales, const std::string& k_format,
                     const std::string& v_format, int n_kv_heads, int head_dim);

// fp8 :tensor K (or V) without explicit scales takes the checkpoint's per-layer k_scale /
// v_scale when it has them (as vLLM does); anything else is left as it is.
void apply_checkpoint_kv_scales(const ModelWeights& weights, KvCacheSpec& spec);

}  // namespace tessera
