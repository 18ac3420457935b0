// RoPE frequencies, shared by every backend: defined here, in the backend interface's
// library, so neither backend depends on the registry that creates them.
#include <algorithm>
#include <cmath>

#include "backend/backend.h"

namespace tessera {

double rope_inv_freq(const RopeConfig& cfg, int i, const float* host_freq_factors) {
  double inv = std::pow(static_cast<double>(cfg.freq_base), -2.0 * i / cfg.rot_dim);
  if (cfg.llama3_factor > 0) {
    const double pi = 3.14159265358979323846;
    const double wavelen = 2 * pi / inv;
    const double low_wavelen = cfg.llama3_original_ctx / cfg.llama3_low_freq_factor;
    const double high_wavelen = cfg.llama3_original_ctx / cfg.llama3_high_freq_factor;
    if (wavelen > low_wavelen) {
      inv /= cfg.llama3_factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth = (cfg.llama3_original_ctx / wavelen - cfg.llama3_low_freq_factor) /
                            (cfg.llama3_high_freq_factor - cfg.llama3_low_freq_factor);
      inv = (1 - smooth) * inv / cfg.llama3_factor + smooth * inv;
    }
  }
  if (cfg.yarn_factor > 0) {
    // The pair index at which a frequency turns `rotations` times over the original context.
    const double pi = 3.14159265358979323846;
    auto correction_pair = [&](double rotations) {
      return cfg.rot_dim * std::log(cfg.yarn_original_ctx / (rotations * 2 * pi)) /
             (2 * std::log(static_cast<double>(cfg.freq_base)));
    };
    const double low = std::max(0.0, std::floor(correction_pair(cfg.yarn_beta_fast)));
    const double high = std::min(cfg.rot_dim - 1.0, std::ceil(correction_pair(cfg.yarn_beta_slow)));
    const double ramp = std::clamp((i - low) / std::max(high - low, 0.001), 0.0, 1.0);  // 0: keep, 1: interpolate
    inv = inv / cfg.yarn_factor * ramp + inv * (1 - ramp);
  }
  if (host_freq_factors) inv /= host_freq_factors[i];
  return inv / cfg.linear_factor;
}

bool same_rope_config(const RopeConfig& a, const RopeConfig& b) {
  return a.head_dim == b.head_dim && a.rot_dim == b.rot_dim && a.freq_base == b.freq_base && a.neox == b.neox &&
         a.llama3_factor == b.llama3_factor && a.llama3_low_freq_factor == b.llama3_low_freq_factor &&
         a.llama3_high_freq_factor == b.llama3_high_freq_factor && a.llama3_original_ctx == b.llama3_original_ctx &&
         a.linear_factor == b.linear_factor && a.freq_factors == b.freq_factors && a.yarn_factor == b.yarn_factor &&
         a.yarn_original_ctx == b.yarn_original_ctx && a.yarn_beta_fast == b.yarn_beta_fast &&
         a.yarn_beta_slow == b.yarn_beta_slow;
}

}  // namespace tessera
