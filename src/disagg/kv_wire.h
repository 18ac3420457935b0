#pragma once
// The KV transfer wire format (docs/design/disaggregation.md, "Wire format"): framed messages,
// each with its own checksums, so a torn, truncated or corrupted transfer is refused with a
// message naming what is wrong, never written into a KV cache.
//
// Frame: a 24-byte header, then `body_bytes` of body. All integers little-endian.
//   0  magic "TKV1"          4  u16 version (2)     6  u16 type
//   8  u64 body_bytes       16  u32 CRC-32C of the body
//  20  u32 CRC-32C of header bytes 0..19
// With a shared secret (kv_auth.h) every frame after the Challenge but Error is followed by a
// 32-byte HMAC-SHA256 of the session (not counted in body_bytes).
// Bodies (strings are u32 length + bytes):
//   Challenge  u8[32] server nonce, u8 1 if the prefill side requires authentication
//                                                         (prefill -> decode, first on a connection)
//   Pull    u64 lease id, u32 max blocks, identity, u8[32] client nonce   (decode -> prefill)
//   Header  identity, u32 n_tokens, i32 tokens[n_tokens], string tenant salt, string adapter,
//           u32 n_blocks                                  (prefill -> decode)
//   Block   u32 index, then the block's bytes: per layer its K pages, then its V pages, scales
//           included (a HostKvTier slot, identity.block_bytes() long)
//   End     u32 n_blocks sent
//   Ack     u64 lease id: the decode side has every block (the prefill side may release them)
//   Error   string: why the other side refused
//   identity = string model fingerprint, string KV format, i32 n_layers, n_kv_heads, head_dim,
//              block_size, i64 K bytes per layer block, V bytes per layer block
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "disagg/kv_auth.h"
#include "engine/kv_transfer.h"

namespace tessera::disagg {

// A refused message or a failed transfer (bad frame, checksum, timeout, peer error).
class KvTransferError : public Error {
 public:
  using Error::Error;
};

enum class MsgType : uint16_t { Pull = 1, Header = 2, Block = 3, End = 4, Ack = 5, Error = 6, Challenge = 7 };
const char* msg_type_name(MsgType t);

inline constexpr uint32_t kWireVersion = 2;  // 2: the Challenge, the client nonce, MACs
inline constexpr size_t kFrameHeaderBytes = 24;
// The largest body a receiver accepts (a block of a large model is a few MB).
inline constexpr uint64_t kMaxBodyBytes = uint64_t{1} << 31;

// CRC-32C (Castagnoli), continuing from `crc` (0 to start); SSE4.2 when the CPU has it.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

struct FrameHeader {
  MsgType type = MsgType::Error;
  uint64_t body_bytes = 0;
  uint32_t body_crc = 0;
};
// The 24 header bytes of a frame whose body has `body_crc` over `body_bytes` bytes.
std::array<uint8_t, kFrameHeaderBytes> encode_frame_header(MsgType type, uint64_t body_bytes, uint32_t body_crc);
// Parses and checks a frame header (magic, version, known type, header checksum, body size).
FrameHeader decode_frame_header(std::span<const uint8_t> bytes);
// Throws unless `body` has the header's checksum.
void check_body(const FrameHeader& h, std::span<const uint8_t> body);
// A whole frame: header then body.
std::vector<uint8_t> encode_frame(MsgType type, std::span<const uint8_t> body);

// Message bodies.
struct ChallengeMsg {
  KvNonce nonce{};
  bool requires_auth = false;
};
struct PullMsg {
  uint64_t lease = 0;
  uint32_t max_blocks = 0;
  KvIdentity identity;
  KvNonce client_nonce{};
};
struct HeaderMsg {
  KvIdentity identity;
  std::vector<int32_t> tokens;
  std::string tenant_salt;
  std::string adapter_id;
  uint32_t n_blocks = 0;
};
std::vector<uint8_t> encode_challenge(const ChallengeMsg& m);
ChallengeMsg decode_challenge(std::span<const uint8_t> body);
std::vector<uint8_t> encode_pull(const PullMsg& m);
PullMsg decode_pull(std::span<const uint8_t> body);
std::vector<uint8_t> encode_header(const HeaderMsg& m);
HeaderMsg decode_header(std::span<const uint8_t> body);
std::vector<uint8_t> encode_u32(uint32_t v);             // End, and the index at the start of a Block body
std::vector<uint8_t> encode_u64(uint64_t v);             // Ack
std::vector<uint8_t> encode_text(const std::string& s);  // Error
uint32_t decode_u32(std::span<const uint8_t> body, MsgType what);
uint64_t decode_u64(std::span<const uint8_t> body, MsgType what);
std::string decode_text(std::span<const uint8_t> body);

}  // namespace tessera::disagg
