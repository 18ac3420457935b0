#pragma once
// Static KV scales from a calibration pass (`tessera calibrate-kv`): run the model over a
// text with an exact (f32/f16) cache, take the largest |K| and |V| each layer and KV head
// stores, and turn them into the fp8 scales --kv-scales loads (scale = amax / largest code).
#include <cstdint>
#include <span>
#include <vector>

#include "backend/kv_format.h"
#include "engine/kv_scales.h"

namespace tessera {

class Session;

struct KvAbsMax {
  std::vector<std::vector<float>> k, v;  // [layer][KV head]: max |value| stored
  int64_t tokens = 0;                    // tokens run through the model
};

// Windows of `window` tokens from `tokens`, each a fresh sequence (at most max_chunks; 0 =
// all). The session's cache must be plain (f16 or f32): the values read back are what the
// model computed, as a quantized cache would receive them.
KvAbsMax measure_kv_absmax(Session& session, std::span<const int32_t> tokens, int window, int max_chunks);

// Scales for formats with static scales: one per layer (:tensor) or per KV head (:head);
// other formats get no rows (their scales are per token). A zero amax gives scale 1.
KvScales kv_scales_from_absmax(const KvAbsMax& amax, const KvFormat& k_format, const KvFormat& v_format);

}  // namespace tessera
