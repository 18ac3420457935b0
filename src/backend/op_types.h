#pragma once
// The plain argument types of the backend's ops that the device kernels also take (RoPE
// configuration, one layer's paged KV view), apart from backend.h so that kernel sources do
// not depend on the op interface.
#include <cstdint>

#include "backend/kv_format.h"
#include "backend/tensor.h"

namespace tessera {

// A mixture-of-experts SwiGLU FFN (Backend::moe_ffn): the router and every expert's matrices.
struct MoeFfnWeights {
  WeightMatrix router;                 // [n_expert, dim]
  const WeightMatrix* gate = nullptr;  // n_expert x [n_ff, dim]
  const WeightMatrix* up = nullptr;    // n_expert x [n_ff, dim]
  const WeightMatrix* down = nullptr;  // n_expert x [dim, n_ff]
  int n_expert = 0, n_used = 0, n_ff = 0;
  bool renormalize = true;  // the chosen experts' weights divided by their sum
};

struct RopeConfig {
  int head_dim = 0;  // elements per head
  int rot_dim = 0;   // leading elements of each head that rotate (= head_dim usually)
  float freq_base = 10000.0f;
  bool neox = false;  // pairs (i, i + rot_dim/2) instead of (2i, 2i + 1)
  // Llama 3 frequency scaling (rope_scaling.rope_type == "llama3"); factor 0 = off.
  float llama3_factor = 0.0f;
  float llama3_low_freq_factor = 1.0f;
  float llama3_high_freq_factor = 4.0f;
  int llama3_original_ctx = 8192;
  // Linear position scaling (rope_scaling.type == "linear"): positions / linear_factor.
  float linear_factor = 1.0f;
  // YaRN (rope_scaling.rope_type == "yarn"); factor 0 = off. Pairs rotating faster than
  // beta_fast turns over the original context keep their frequency, those slower than beta_slow
  // are divided by the factor, a linear ramp between. YaRN's attention magnitude (mscale) is not
  // here: scaling q and k by it equals scaling the attention scale by its square, which the
  // model does.
  float yarn_factor = 0.0f;
  int yarn_original_ctx = 0;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  // Per-pair frequency divisors [rot_dim/2] (GGUF tensor rope_freqs.weight), or nullptr.
  const float* freq_factors = nullptr;
};

// Inverse frequency of rotated pair i, in double, with Llama 3's rescaling, the per-pair
// divisors (read from `host_freq_factors`, a host copy of cfg.freq_factors, or nullptr) and
// linear scaling: every backend's RoPE uses it, so their angles agree.
double rope_inv_freq(const RopeConfig& cfg, int i, const float* host_freq_factors);
// Whether two configurations give the same rotation (for caching tables per configuration).
bool same_rope_config(const RopeConfig& a, const RopeConfig& b);

// One layer's paged KV storage. K and V are each an array of pages, one per (block, KV head):
// page block * n_kv_heads + head at byte offset page * {k,v}_page_bytes, laid out as
// kv_format.h says (plain f16/f32: [block_size, head_dim] elements). The constants are the
// layer's static scales and TurboQuant tables (kv_codec.h, KvConstantsLayout), in this
// backend's memory, or null for formats that have none.
struct KvLayerView {
  void* k = nullptr;
  void* v = nullptr;
  KvFormat k_fmt;
  KvFormat v_fmt;
  int n_blocks = 0;
  int block_size = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int64_t k_page_bytes = 0;
  int64_t v_page_bytes = 0;
  const float* k_consts = nullptr;
  const float* v_consts = nullptr;

  // F16 or F32 when K and V are both stored in that plain type, Unknown otherwise.
  DType plain_dtype() const { return k_fmt == v_fmt ? k_fmt.plain_dtype() : DType::Unknown; }
};

// One token's move between two slots (block * block_size + offset) of a layer's cache
// (Backend::move_kv_tokens).
struct KvSlotMove {
  int32_t src = -1;
  int32_t dst = -1;
};

// A view of plain f16/f32 storage ([n_blocks, n_kv_heads, block_size, head_dim] each).
KvLayerView plain_kv_view(void* k, void* v, DType dtype, int n_blocks, int block_size, int n_kv_heads, int head_dim);

}  // namespace tessera
