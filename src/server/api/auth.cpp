#include "server/api/auth.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <strings.h>

#include <cstring>
#include <fstream>

#include "core/error.h"

namespace tessera::api {

namespace {

void sha256(std::string_view data, unsigned char out[32]) {
  SHA256(reinterpret_cast<const unsigned char*>(data.data()), data.size(), out);
}

std::string hex(const unsigned char* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string s(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    s[2 * i] = kDigits[bytes[i] >> 4];
    s[2 * i + 1] = kDigits[bytes[i] & 15];
  }
  return s;
}

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  const size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  unsigned char d[32];
  sha256(data, d);
  return hex(d, 32);
}

ApiKeys::ApiKeys(const std::vector<std::string>& keys) {
  for (const std::string& k : keys) {
    TESSERA_CHECK(!trim(k).empty(), "an API key must not be empty");
    TESSERA_CHECK(trim(k) == k, "an API key must not start or end with whitespace");
    Digest d;
    sha256(k, d.bytes);
    digests_.push_back(d);
  }
}

std::vector<std::string> ApiKeys::read_key_file(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "cannot read the API key file '", path, "'");
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    const std::string_view k = trim(line);
    if (k.empty() || k.front() == '#') continue;
    keys.emplace_back(k);
  }
  TESSERA_CHECK(!keys.empty(), "the API key file '", path, "' holds no key");
  return keys;
}

std::optional<Tenant> ApiKeys::authenticate(std::optional<std::string_view> authorization) const {
  if (!enabled()) return Tenant{};
  if (!authorization) return std::nullopt;
  // RFC 9110 11.1: the scheme is case-insensitive ("bearer", "BEARER"), then spaces, then the key.
  const std::string_view value = trim(*authorization);
  const size_t gap = value.find_first_of(" \t");
  if (gap == std::string_view::npos) return std::nullopt;
  const std::string_view scheme = value.substr(0, gap);
  constexpr std::string_view kBearer = "bearer";
  if (scheme.size() != kBearer.size() || strncasecmp(scheme.data(), kBearer.data(), kBearer.size()) != 0)
    return std::nullopt;
  const std::string_view key = trim(value.substr(gap));
  if (key.empty()) return std::nullopt;
  unsigned char presented[32];
  sha256(key, presented);
  // Every key is compared, and CRYPTO_memcmp takes the same time whatever differs.
  bool match = false;
  for (const Digest& d : digests_) match |= CRYPTO_memcmp(d.bytes, presented, 32) == 0;
  if (!match) return std::nullopt;
  const std::string salt = hex(presented, 32);
  return Tenant{"key-" + salt.substr(0, 12), salt};
}

}  // namespace tessera::api
