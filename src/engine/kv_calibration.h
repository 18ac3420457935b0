#pragma once
// Static KV constants from a calibration pass (`tessera calibrate-kv`): run the model over a
// text with an exact (f32/f16) cache and read back what each layer and KV head stores:
// the largest |K| and |V| become the fp8 scales --kv-scales loads (scale = amax / largest
// code); the per-channel mean of K becomes the key centering μ (TurboQuant keys store k − μ;
// every score of a query shifts by the same q·μ, so the softmax is unchanged).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backend/kv_format.h"
#include "engine/kv_scales.h"

namespace tessera {

class Session;

struct KvStats {
  std::vector<std::vector<float>> k, v;  // [layer][KV head]: max |value| stored
  // [layer][head * head_dim + channel]: sums of K and K² over the stored tokens, and of the
  // squared deviations of K from its page's mean (what per-page schemes like KIVI see)
  std::vector<std::vector<double>> k_sum, k_sq, k_within;
  // [layer][head * head_dim + channel]: sums of each window's first key and its squares
  std::vector<std::vector<double>> k_first_sum, k_first_sq;
  // [layer][KV head * head_dim + channel]: sum of q_c² over the query rows attention read (after
  // RoPE) and over the query heads of the KV head's group; q_rows[layer] counts (row, query
  // head) pairs per KV head. Empty when the backend does not show its queries (CUDA).
  std::vector<std::vector<double>> q_sq;
  std::vector<int64_t> q_rows;
  // Position-aware centering (RoPE keys): rope_dim > 0 rotated channels; per layer the pairs'
  // inverse frequencies [rope_dim/2], and over the stored keys (position p, pair angle φ_c of
  // channel c): [layer][head * hd + c] sums of the pre-RoPE key R(p)ᵀk, of k_c cos φ_c and of
  // k_c sin φ_c; [layer][pair] sums of cos² φ, sin² φ and sin φ cos φ over positions.
  int rope_dim = 0;
  bool rope_neox = false;
  std::vector<std::vector<float>> rope_inv_freq;
  std::vector<std::vector<double>> k_pre_sum, k_cos, k_sin;
  std::vector<std::vector<double>> pos_cc, pos_ss, pos_sc;
  int head_dim = 0;
  int64_t tokens = 0;  // tokens run through the model (per layer and head)
  int windows = 0;
};

// Windows of `window` tokens from `tokens`, each a fresh sequence (at most max_chunks; 0 =
// all). The session's cache must be plain (f16 or f32): the values read back are what the
// model computed, as a quantized cache would receive them.
KvStats measure_kv_stats(Session& session, std::span<const int32_t> tokens, int window, int max_chunks);

// Scales for formats with static scales: one per layer (:tensor) or per KV head (:head);
// other formats get no rows (their scales are per token). A zero amax gives scale 1.
// Key means (k_mean) and the per-channel key equalization (k_equal: s_c ∝ sqrt(σ_c / ρ_c),
// σ_c the key channel's deviation around μ, ρ_c the RMS of the queries that read it;
// mean(s²) = 1 per head) for key formats that center (KvFormat::centers_keys), else none.
// Those need the queries: stats measured on a backend that does not show them are an error.
// With RoPE (stats.rope_dim > 0) also the position-aware pair (KvScales::rope_*): the pre-RoPE
// mean m = E R(p)ᵀk and s from each channel's variance around R(p)·m. Centering formats also
// get k_first, the mean of the windows' first keys (the center of the key at position 0).
KvScales kv_scales_from_stats(const KvStats& stats, const KvFormat& k_format, const KvFormat& v_format);

// One line per layer on the keys (means over its heads): energy per token E|k|², the share
// of it in the mean (|μ|² / E|k|²: what centering removes), the largest channel's share of
// the variance left (outlier channels), the share of that variance within a page (around
// each page's own channel means: what KIVI's per-page ranges see), the score-error ratio of
// no equalization to the calibration's (Σσ²)(Σρ²)/(Σσρ)², ρ the queries' RMS per channel
// (ρ = 1 where the queries were not seen: hd·Σσ²/(Σσ)², the gain for isotropic queries), and
// the first key of a window (the attention sink) as E|k_0 − μ|² over E|k − μ|², and around
// the first keys' own mean, E|k_0 − μ_0|² over E|k − μ|² (what the first-key center leaves).
std::string kv_key_stats_table(const KvStats& stats);

}  // namespace tessera
