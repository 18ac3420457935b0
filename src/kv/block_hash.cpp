#include "kv/block_hash.h"

#include <openssl/sha.h>

#include <string>

namespace tessera {

namespace {
void append_field(std::string& buf, std::string_view field) {
  const uint64_t n = field.size();
  buf.append(reinterpret_cast<const char*>(&n), sizeof n);
  buf.append(field);
}
}  // namespace

BlockHash prefix_root_hash(const PrefixExtraKeys& keys) {
  std::string buf = "tessera.kv.prefix.v1";
  append_field(buf, keys.model_fingerprint);
  append_field(buf, keys.adapter_id);
  append_field(buf, keys.tenant_salt);
  BlockHash h;
  SHA256(reinterpret_cast<const unsigned char*>(buf.data()), buf.size(), h.bytes.data());
  return h;
}

BlockHash block_hash(const BlockHash& parent, std::span<const int32_t> tokens) {
  // [parent 32 bytes][n_tokens u64][tokens i32...]; a block is small (block_size tokens).
  unsigned char buf[32 + 8 + 4 * 1024];
  std::string big;
  unsigned char* p = buf;
  const size_t bytes = 32 + 8 + 4 * tokens.size();
  if (bytes > sizeof buf) {
    big.resize(bytes);
    p = reinterpret_cast<unsigned char*>(big.data());
  }
  const uint64_t n = tokens.size();
  std::memcpy(p, parent.bytes.data(), 32);
  std::memcpy(p + 32, &n, 8);
  if (!tokens.empty()) std::memcpy(p + 40, tokens.data(), 4 * tokens.size());  // an empty span's data() may be null
  BlockHash h;
  SHA256(p, bytes, h.bytes.data());
  return h;
}

}  // namespace tessera
