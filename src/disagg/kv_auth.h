#pragma once
// Authentication of a KV transfer (docs/design/disaggregation.md, "Authentication"): both
// workers hold a pre-shared secret (--kv-transfer-secret-file). Each connection starts with the
// prefill side's Challenge, a fresh random nonce; the decode side answers with its own nonce
// in the Pull. Both derive the session key
//   K = HMAC-SHA256(secret, "tessera-kv-session" || server nonce || client nonce)
// and every later frame but Error carries a trailing HMAC-SHA256 under K of its direction, its
// sequence number on the connection, its 24 header bytes and its body. So a peer without the
// secret is refused (its Pull does not verify; a prefill side without it cannot answer), a
// frame changed, dropped, reordered or replayed within a connection fails its MAC, and a
// Pull recorded from an earlier connection fails against the new server nonce.
#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace tessera::disagg {

inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
using KvNonce = std::array<uint8_t, kNonceBytes>;
using KvMac = std::array<uint8_t, kMacBytes>;

// From the operating system's generator (OpenSSL RAND_bytes); throws if it fails.
KvNonce random_nonce();

// Reads the secret a --kv-transfer-secret-file names: its bytes without trailing newlines;
// throws naming the file when it cannot be read or holds fewer than 16 bytes.
std::string read_kv_secret_file(const std::string& path);

class KvSession {
 public:
  KvSession(const std::string& secret, const KvNonce& server_nonce, const KvNonce& client_nonce);
  // The MAC of frame `seq` (0, 1, ... per direction) sent by the prefill side (from_server) or
  // the decode side: its header bytes, then its body in parts.
  KvMac mac(bool from_server, uint64_t seq, std::span<const uint8_t> header,
            std::span<const std::span<const uint8_t>> body) const;

 private:
  KvMac key_{};
};

// Constant-time comparison.
bool mac_equal(const KvMac& a, std::span<const uint8_t> b);

}  // namespace tessera::disagg
