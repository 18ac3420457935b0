#pragma once
// Prefill/decode disaggregation, the engine's side (docs/design/disaggregation.md): what a
// sequence's KV looks like when it leaves one engine and enters another. The prefill engine
// keeps a finished request's prompt blocks under a lease and stages them in host memory on
// request; the decode engine reserves blocks for them first, then writes the staged bytes in
// and enters them into its prefix index, so the request that follows hits them like a local
// prefix. Transports (src/disagg/) move a KvBlocksPayload between the two; the engine never
// sees a socket.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/kv_host_ops.h"

namespace tessera {

// What the bytes of a block mean: two engines exchange blocks only when all of it is equal.
struct KvIdentity {
  std::string model_fingerprint;  // EngineConfig::model_fingerprint (weights, KV format, constants)
  std::string kv_format;          // KvCacheSpec::format_name()
  int32_t n_layers = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  int64_t k_layer_block_bytes = 0;  // one layer's K part of a block (its n_kv_heads pages, scales included)
  int64_t v_layer_block_bytes = 0;

  static KvIdentity of(const KvCacheSpec& spec, const std::string& model_fingerprint);
  // Bytes of one block across all layers: a HostKvTier slot.
  int64_t block_bytes() const { return (k_layer_block_bytes + v_layer_block_bytes) * n_layers; }
  // "" when `other` is the same, else a sentence naming the first field that differs, with
  // both values ("model fingerprint: here 'a', there 'b'").
  std::string mismatch(const KvIdentity& other) const;
  bool operator==(const KvIdentity&) const = default;
};

// One sequence's leading full blocks, staged in host memory: block i of the sequence is slot i
// of `blocks` (HostKvTier layout: [n_layers][K pages, V pages], a block self-contained).
struct KvBlocksPayload {
  KvIdentity identity;
  std::vector<int32_t> tokens;  // the tokens whose KV the blocks hold: n_blocks x block_size
  std::string tenant_salt;      // prefix-cache isolation: travels with the blocks
  std::string adapter_id;
  std::shared_ptr<HostKvTier> blocks;  // at least n_blocks() slots
  int32_t n_blocks() const {
    return identity.block_size > 0 ? static_cast<int32_t>(tokens.size()) / identity.block_size : 0;
  }
};

// A lease the prefill engine holds for a finished request (RequestProgress::kv_lease).
struct KvLeaseInfo {
  uint64_t id = 0;       // the engine's request id
  int32_t n_blocks = 0;  // pinned blocks: the prompt's first (n_prompt - 1) / block_size
  int32_t n_tokens = 0;  // n_blocks x block_size
};

// Blocks the decode engine holds for an import (Engine::reserve_kv_import), and the host
// staging the transport fills. Handed back through Request::kv_import, or cancelled.
struct KvImportReservation {
  uint64_t id = 0;
  int32_t n_blocks = 0;
  std::shared_ptr<HostKvTier> staging;  // n_blocks slots
};

// The KV a request brings with it (Request::kv_import): a reservation whose staging the
// transport filled, described by `payload` (its blocks are the reservation's staging).
struct KvImport {
  uint64_t reservation = 0;
  std::shared_ptr<const KvBlocksPayload> payload;
};

}  // namespace tessera
