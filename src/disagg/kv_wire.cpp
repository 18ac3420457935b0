#include "disagg/kv_wire.h"

#include <array>
#include <cstring>

namespace tessera::disagg {

namespace {

constexpr uint8_t kMagic[4] = {'T', 'K', 'V', '1'};

// Little-endian writer and bounds-checked reader of message bodies.
class Writer {
 public:
  void u8(uint8_t v) { put(v, 1); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void bytes(std::span<const uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); }
  void u64(uint64_t v) { put(v, 8); }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  std::vector<uint8_t> out;

 private:
  void put(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
};

class Reader {
 public:
  Reader(std::span<const uint8_t> b, MsgType what) : b_(b), what_(what) {}
  uint8_t u8() { return static_cast<uint8_t>(get(1)); }
  uint16_t u16() { return static_cast<uint16_t>(get(2)); }
  void bytes(std::span<uint8_t> out) {
    need(out.size());
    std::memcpy(out.data(), b_.data() + at_, out.size());
    at_ += out.size();
  }
  uint32_t u32() { return static_cast<uint32_t>(get(4)); }
  uint64_t u64() { return get(8); }
  int32_t i32() { return static_cast<int32_t>(u32()); }
  int64_t i64() { return static_cast<int64_t>(u64()); }
  std::string str() {
    const uint32_t n = u32();
    need(n);
    std::string s(reinterpret_cast<const char*>(b_.data() + at_), n);
    at_ += n;
    return s;
  }
  void need(uint64_t n) const {
    if (n > b_.size() - at_)
      throw KvTransferError(std::string("KV transfer: truncated ") + msg_type_name(what_) + " message: needs " +
                            std::to_string(n) + " bytes at offset " + std::to_string(at_) + " of " +
                            std::to_string(b_.size()));
  }
  void done() const {
    if (at_ != b_.size())
      throw KvTransferError(std::string("KV transfer: ") + msg_type_name(what_) + " message has " +
                            std::to_string(b_.size() - at_) + " bytes after its end");
  }

 private:
  uint64_t get(int n) {
    need(n);
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(b_[at_ + i]) << (8 * i);
    at_ += n;
    return v;
  }
  std::span<const uint8_t> b_;
  MsgType what_;
  size_t at_ = 0;
};

void write_identity(Writer& w, const KvIdentity& id) {
  w.str(id.model_fingerprint);
  w.str(id.kv_format);
  w.i32(id.n_layers);
  w.i32(id.n_kv_heads);
  w.i32(id.head_dim);
  w.i32(id.block_size);
  w.i64(id.k_layer_block_bytes);
  w.i64(id.v_layer_block_bytes);
}

KvIdentity read_identity(Reader& r) {
  KvIdentity id;
  id.model_fingerprint = r.str();
  id.kv_format = r.str();
  id.n_layers = r.i32();
  id.n_kv_heads = r.i32();
  id.head_dim = r.i32();
  id.block_size = r.i32();
  id.k_layer_block_bytes = r.i64();
  id.v_layer_block_bytes = r.i64();
  if (id.n_layers <= 0 || id.block_size <= 0 || id.k_layer_block_bytes <= 0 || id.v_layer_block_bytes <= 0 ||
      id.block_bytes() > static_cast<int64_t>(kMaxBodyBytes))
    throw KvTransferError("KV transfer: a KV identity of " + std::to_string(id.n_layers) + " layers, blocks of " +
                          std::to_string(id.block_size) + " tokens and " + std::to_string(id.block_bytes()) +
                          " bytes is not valid");
  return id;
}

uint32_t crc32c_table(const uint8_t* p, size_t n, uint32_t crc) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(const uint8_t* p, size_t n, uint32_t crc) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __builtin_ia32_crc32di(c, v);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}

}  // namespace

const char* msg_type_name(MsgType t) {
  switch (t) {
    case MsgType::Pull:
      return "Pull";
    case MsgType::Header:
      return "Header";
    case MsgType::Block:
      return "Block";
    case MsgType::End:
      return "End";
    case MsgType::Ack:
      return "Ack";
    case MsgType::Error:
      return "Error";
    case MsgType::Challenge:
      return "Challenge";
  }
  return "unknown";
}

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const bool hw = __builtin_cpu_supports("sse4.2");
  const auto* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
  crc = hw ? crc32c_sse42(p, n, crc) : crc32c_table(p, n, crc);
  return ~crc;
}

std::array<uint8_t, kFrameHeaderBytes> encode_frame_header(MsgType type, uint64_t body_bytes, uint32_t body_crc) {
  Writer w;
  w.out.assign(kMagic, kMagic + 4);
  w.u16(kWireVersion);
  w.u16(static_cast<uint16_t>(type));
  w.u64(body_bytes);
  w.u32(body_crc);
  w.u32(crc32c(w.out.data(), w.out.size()));
  std::array<uint8_t, kFrameHeaderBytes> h{};
  std::memcpy(h.data(), w.out.data(), h.size());
  return h;
}

FrameHeader decode_frame_header(std::span<const uint8_t> b) {
  if (b.size() < kFrameHeaderBytes)
    throw KvTransferError("KV transfer: truncated frame header: " + std::to_string(b.size()) + " of " +
                          std::to_string(kFrameHeaderBytes) + " bytes");
  if (std::memcmp(b.data(), kMagic, 4) != 0)
    throw KvTransferError("KV transfer: not a tessera KV transfer message (bad magic)");
  Reader r(b.first(kFrameHeaderBytes), MsgType::Error);
  r.u32();
  const uint16_t version = r.u16();
  const uint16_t type = r.u16();
  FrameHeader h;
  h.body_bytes = r.u64();
  h.body_crc = r.u32();
  const uint32_t header_crc = r.u32();
  if (header_crc != crc32c(b.data(), 20)) throw KvTransferError("KV transfer: frame header checksum mismatch");
  if (version != kWireVersion)
    throw KvTransferError("KV transfer: wire version " + std::to_string(version) + ", this side speaks " +
                          std::to_string(kWireVersion));
  if (type < static_cast<uint16_t>(MsgType::Pull) || type > static_cast<uint16_t>(MsgType::Challenge))
    throw KvTransferError("KV transfer: unknown message type " + std::to_string(type));
  h.type = static_cast<MsgType>(type);
  if (h.body_bytes > kMaxBodyBytes)
    throw KvTransferError(std::string("KV transfer: a ") + msg_type_name(h.type) + " message of " +
                          std::to_string(h.body_bytes) + " bytes is over the limit of " +
                          std::to_string(kMaxBodyBytes));
  return h;
}

void check_body(const FrameHeader& h, std::span<const uint8_t> body) {
  if (body.size() != h.body_bytes)
    throw KvTransferError(std::string("KV transfer: truncated ") + msg_type_name(h.type) + " message: " +
                          std::to_string(body.size()) + " of " + std::to_string(h.body_bytes) + " bytes");
  if (crc32c(body.data(), body.size()) != h.body_crc)
    throw KvTransferError(std::string("KV transfer: ") + msg_type_name(h.type) + " message checksum mismatch");
}

std::vector<uint8_t> encode_frame(MsgType type, std::span<const uint8_t> body) {
  const auto h = encode_frame_header(type, body.size(), crc32c(body.data(), body.size()));
  std::vector<uint8_t> out(h.size() + body.size());
  std::memcpy(out.data(), h.data(), h.size());
  if (!body.empty()) std::memcpy(out.data() + h.size(), body.data(), body.size());
  return out;
}

std::vector<uint8_t> encode_challenge(const ChallengeMsg& m) {
  Writer w;
  w.bytes(m.nonce);
  w.u8(m.requires_auth ? 1 : 0);
  return std::move(w.out);
}

ChallengeMsg decode_challenge(std::span<const uint8_t> body) {
  Reader r(body, MsgType::Challenge);
  ChallengeMsg m;
  r.bytes(m.nonce);
  const uint8_t flag = r.u8();
  if (flag > 1) throw KvTransferError("KV transfer: Challenge message with flag " + std::to_string(flag));
  m.requires_auth = flag == 1;
  r.done();
  return m;
}

std::vector<uint8_t> encode_pull(const PullMsg& m) {
  Writer w;
  w.u64(m.lease);
  w.u32(m.max_blocks);
  write_identity(w, m.identity);
  w.bytes(m.client_nonce);
  return std::move(w.out);
}

PullMsg decode_pull(std::span<const uint8_t> body) {
  Reader r(body, MsgType::Pull);
  PullMsg m;
  m.lease = r.u64();
  m.max_blocks = r.u32();
  m.identity = read_identity(r);
  r.bytes(m.client_nonce);
  r.done();
  return m;
}

std::vector<uint8_t> encode_header(const HeaderMsg& m) {
  Writer w;
  write_identity(w, m.identity);
  w.u32(static_cast<uint32_t>(m.tokens.size()));
  for (int32_t t : m.tokens) w.i32(t);
  w.str(m.tenant_salt);
  w.str(m.adapter_id);
  w.u32(m.n_blocks);
  return std::move(w.out);
}

HeaderMsg decode_header(std::span<const uint8_t> body) {
  Reader r(body, MsgType::Header);
  HeaderMsg m;
  m.identity = read_identity(r);
  const uint32_t n = r.u32();
  r.need(uint64_t{n} * 4);
  m.tokens.resize(n);
  for (auto& t : m.tokens) t = r.i32();
  m.tenant_salt = r.str();
  m.adapter_id = r.str();
  m.n_blocks = r.u32();
  r.done();
  if (uint64_t{m.n_blocks} * m.identity.block_size != m.tokens.size())
    throw KvTransferError("KV transfer: Header message says " + std::to_string(m.n_blocks) + " blocks of " +
                          std::to_string(m.identity.block_size) + " tokens but carries " +
                          std::to_string(m.tokens.size()) + " token ids");
  return m;
}

std::vector<uint8_t> encode_u32(uint32_t v) {
  Writer w;
  w.u32(v);
  return std::move(w.out);
}

std::vector<uint8_t> encode_u64(uint64_t v) {
  Writer w;
  w.u64(v);
  return std::move(w.out);
}

std::vector<uint8_t> encode_text(const std::string& s) {
  Writer w;
  w.str(s);
  return std::move(w.out);
}

uint32_t decode_u32(std::span<const uint8_t> body, MsgType what) {
  Reader r(body, what);
  const uint32_t v = r.u32();
  r.done();
  return v;
}

uint64_t decode_u64(std::span<const uint8_t> body, MsgType what) {
  Reader r(body, what);
  const uint64_t v = r.u64();
  r.done();
  return v;
}

std::string decode_text(std::span<const uint8_t> body) {
  Reader r(body, MsgType::Error);
  std::string s = r.str();
  r.done();
  return s;
}

}  // namespace tessera::disagg
