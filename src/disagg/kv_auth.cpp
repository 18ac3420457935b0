#include "disagg/kv_auth.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "core/error.h"

namespace tessera::disagg {

namespace {

// OpenSSL's HMAC implementation, fetched once for the process (a fetch looks the algorithm up
// in the provider tables under a lock: not something to do for every block); kept until exit.
EVP_MAC* hmac_algorithm() {
  static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  TESSERA_CHECK(mac != nullptr, "KV transfer: OpenSSL has no HMAC");
  return mac;
}

// HMAC-SHA256 of the concatenated parts under `key` (OpenSSL's EVP_MAC).
KvMac hmac(std::span<const uint8_t> key, std::span<const std::span<const uint8_t>> parts) {
  std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)> ctx(EVP_MAC_CTX_new(hmac_algorithm()), EVP_MAC_CTX_free);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  TESSERA_CHECK(ctx && EVP_MAC_init(ctx.get(), key.data(), key.size(), params) == 1,
                "KV transfer: HMAC-SHA256 init failed");
  for (const auto& p : parts)
    if (!p.empty()) TESSERA_CHECK(EVP_MAC_update(ctx.get(), p.data(), p.size()) == 1, "KV transfer: HMAC failed");
  KvMac out{};
  size_t n = 0;
  TESSERA_CHECK(EVP_MAC_final(ctx.get(), out.data(), &n, out.size()) == 1 && n == out.size(),
                "KV transfer: HMAC failed");
  return out;
}

std::span<const uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

KvNonce random_nonce() {
  KvNonce n{};
  TESSERA_CHECK(RAND_bytes(n.data(), static_cast<int>(n.size())) == 1, "KV transfer: no random bytes for a nonce");
  return n;
}

std::string read_kv_secret_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TESSERA_CHECK(in.good(), "--kv-transfer-secret-file: cannot read '", path, "'");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  TESSERA_CHECK(s.size() >= 16, "--kv-transfer-secret-file: '", path, "' holds ", s.size(),
                " bytes; a secret needs at least 16 (e.g. `openssl rand -hex 32 > FILE`)");
  return s;
}

KvSession::KvSession(const std::string& secret, const KvNonce& server_nonce, const KvNonce& client_nonce) {
  static const std::string kLabel = "tessera-kv-session";
  const std::span<const uint8_t> parts[] = {bytes_of(kLabel), server_nonce, client_nonce};
  key_ = hmac(bytes_of(secret), parts);
}

KvMac KvSession::mac(bool from_server, uint64_t seq, std::span<const uint8_t> header,
                     std::span<const std::span<const uint8_t>> body) const {
  std::array<uint8_t, 9> prefix{};
  prefix[0] = from_server ? 'S' : 'C';
  for (int i = 0; i < 8; ++i) prefix[1 + i] = static_cast<uint8_t>(seq >> (8 * i));
  std::vector<std::span<const uint8_t>> parts = {prefix, header};
  parts.insert(parts.end(), body.begin(), body.end());
  return hmac(key_, parts);
}

bool mac_equal(const KvMac& a, std::span<const uint8_t> b) {
  return b.size() == a.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace tessera::disagg
