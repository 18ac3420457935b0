#pragma once
// API keys: `Authorization: Bearer <key>` against the keys the server was started with. Each
// key is its own tenant: the tenant name (for per-key limits) and the prefix-cache salt are
// derived from the key by the server, so a client cannot choose them and two keys never share
// a cached block. Keys are compared by their SHA-256 digests in constant time, every key
// every time, so the time taken says nothing about how much of a key matched.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::api {

struct Tenant {
  std::string name;  // "key-" + the first 12 hex digits of SHA-256(key); "" without keys
  std::string salt;  // hex SHA-256(key); "" without keys
};

class ApiKeys {
 public:
  ApiKeys() = default;
  explicit ApiKeys(const std::vector<std::string>& keys);
  // One key per line; blank lines and lines starting with '#' are skipped, surrounding
  // whitespace trimmed. Throws tessera::Error naming the file.
  static std::vector<std::string> read_key_file(const std::string& path);

  bool enabled() const { return !digests_.empty(); }
  size_t size() const { return digests_.size(); }
  // The tenant of an Authorization header value, or nothing when keys are enabled and it
  // does not carry a valid one. Without keys everyone is the anonymous tenant.
  std::optional<Tenant> authenticate(std::optional<std::string_view> authorization) const;

 private:
  struct Digest {
    unsigned char bytes[32];
  };
  std::vector<Digest> digests_;
};

// Lowercase hex SHA-256 of `data`.
std::string sha256_hex(std::string_view data);

}  // namespace tessera::api
