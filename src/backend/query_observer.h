#pragma once
// A look at the queries attention reads, for calibration: `tessera calibrate-kv` weighs each
// key channel's coding error by how strongly the queries read that channel
// (docs/design/kv-quant.md, "Key equalization"). The queries are the ones the attention op
// receives, after RoPE (and any QK-norm): q: [n_rows, n_heads * head_dim] at stride ldq, in
// host memory; kv is the layer being attended (its k pointer tells the layers apart).
#include <cstdint>
#include <functional>

#include "backend/op_types.h"

namespace tessera {

class Backend;

using QueryObserver = std::function<void(const float* q, int64_t ldq, int n_rows, int n_heads, const KvLayerView& kv)>;

// Calls f with every later attention call's queries (an empty f stops it). Returns false, and
// installs nothing, for a backend that cannot show its queries on the host (a device one).
bool observe_queries(Backend& backend, QueryObserver f);

}  // namespace tessera
