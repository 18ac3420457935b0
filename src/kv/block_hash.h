#pragma once
// Prefix-cache keys. A full KV block is named by a SHA-256 chained over its parent's key and
// its tokens; the chain starts at a root key over the extra keys (model fingerprint, adapter,
// tenant salt). Two blocks share a key only when the same model and adapter computed the same
// tokens after the same prefix for the same tenant. A hit still compares the tokens.
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string_view>

namespace tessera {

struct BlockHash {
  std::array<uint8_t, 32> bytes{};
  bool operator==(const BlockHash&) const = default;
};

struct BlockHashHasher {
  size_t operator()(const BlockHash& h) const {
    size_t v;  // SHA-256 output is uniform: its first bytes are a fine table hash
    std::memcpy(&v, h.bytes.data(), sizeof v);
    return v;
  }
};

// What, besides the tokens, decides whether KV can be reused.
struct PrefixExtraKeys {
  std::string_view model_fingerprint;  // weights identity (path, size, config)
  std::string_view adapter_id;         // LoRA adapter, "" for none
  std::string_view tenant_salt;        // from the server, derived from the credential
};

// Root of a sequence's chain. Fields are length-prefixed so no two key sets collide by
// concatenation ("ab"+"c" vs "a"+"bc").
BlockHash prefix_root_hash(const PrefixExtraKeys& keys);

// Key of a full block: H(parent, tokens).
BlockHash block_hash(const BlockHash& parent, std::span<const int32_t> tokens);

}  // namespace tessera
