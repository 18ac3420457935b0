// The KV transfer wire format: messages round-trip; a corrupted, truncated or foreign message
// is refused with an error naming what is wrong; identities that differ say which field.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <string>

#include "disagg/kv_wire.h"

using namespace tessera;
using namespace tessera::disagg;

namespace {

KvIdentity identity() {
  KvIdentity id;
  id.model_fingerprint = "dummy:llama3-tiny|256|3";
  id.kv_format = "f16";
  id.n_layers = 3;
  id.n_kv_heads = 2;
  id.head_dim = 128;
  id.block_size = 4;
  id.k_layer_block_bytes = 2 * 4 * 128 * 2;
  id.v_layer_block_bytes = 2 * 4 * 128 * 2;
  return id;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const KvTransferError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(KvWire, Crc32cMatchesTheStandardCheckValue) {
  // RFC 3720 / the Castagnoli check value of "123456789"; and continuation equals one pass.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("6789", 4, crc32c("12345", 5)), 0xE3069283u);
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720 B.4: 32 bytes of zeros
}

TEST(KvWire, HeaderAndPullRoundTrip) {
  HeaderMsg h{identity(), {1, 2, 3, 4, 5, 6, 7, 8}, "salt-of-tenant", "adapter-x", 2};
  const auto frame = encode_frame(MsgType::Header, encode_header(h));
  const FrameHeader fh = decode_frame_header(frame);
  EXPECT_EQ(fh.type, MsgType::Header);
  const std::span<const uint8_t> body = std::span(frame).subspan(kFrameHeaderBytes);
  check_body(fh, body);
  const HeaderMsg back = decode_header(body);
  EXPECT_EQ(back.identity, h.identity);
  EXPECT_EQ(back.tokens, h.tokens);
  EXPECT_EQ(back.tenant_salt, "salt-of-tenant");
  EXPECT_EQ(back.adapter_id, "adapter-x");
  EXPECT_EQ(back.n_blocks, 2u);

  const PullMsg p = decode_pull(encode_pull({42, 7, identity()}));
  EXPECT_EQ(p.lease, 42u);
  EXPECT_EQ(p.max_blocks, 7u);
  EXPECT_EQ(p.identity, identity());
  EXPECT_EQ(decode_text(encode_text("no such lease")), "no such lease");
  EXPECT_EQ(decode_u64(encode_u64(1ull << 40), MsgType::Ack), 1ull << 40);
}

TEST(KvWire, CorruptedMessagesAreRefusedByName) {
  HeaderMsg h{identity(), {1, 2, 3, 4}, "s", "", 1};
  const auto frame = encode_frame(MsgType::Header, encode_header(h));
  // A flipped header byte (the body length).
  auto bad = frame;
  bad[9] ^= 1;
  EXPECT_NE(error_of([&] { decode_frame_header(bad); }).find("header checksum"), std::string::npos);
  // A flipped body byte.
  bad = frame;
  bad[kFrameHeaderBytes + 40] ^= 0x10;
  const FrameHeader fh = decode_frame_header(bad);
  EXPECT_NE(
      error_of([&] { check_body(fh, std::span(bad).subspan(kFrameHeaderBytes)); }).find("Header message checksum"),
      std::string::npos);
  // Truncated: the body is short, or the frame header itself.
  EXPECT_NE(error_of([&] { check_body(fh, std::span(frame).subspan(kFrameHeaderBytes, 10)); }).find("truncated Header"),
            std::string::npos);
  EXPECT_NE(error_of([&] { decode_frame_header(std::span(frame).first(10)); }).find("truncated frame header"),
            std::string::npos);
  // A body cut short inside a field, even with a matching checksum.
  const auto body = encode_header(h);
  EXPECT_NE(error_of([&] { decode_header(std::span(body).first(body.size() - 3)); }).find("truncated Header"),
            std::string::npos);
  // Not this protocol.
  bad = frame;
  bad[0] = 'H';
  EXPECT_NE(error_of([&] { decode_frame_header(bad); }).find("not a tessera KV transfer message"), std::string::npos);
  // Token ids that do not fill the blocks it claims.
  h.n_blocks = 2;
  EXPECT_NE(error_of([&] { decode_header(encode_header(h)); }).find("says 2 blocks of 4 tokens but carries 4"),
            std::string::npos);
}

TEST(KvWire, IdentityMismatchNamesTheField) {
  KvIdentity other = identity();
  EXPECT_EQ(identity().mismatch(other), "");
  other.kv_format = "fp8_e4m3";
  EXPECT_EQ(identity().mismatch(other), "KV format: here 'f16', there 'fp8_e4m3'");
  other = identity();
  other.block_size = 16;
  EXPECT_EQ(identity().mismatch(other), "block size: here '4', there '16'");
}

// The session MAC (kv_auth.h): the same inputs give the same code on both sides; any other
// secret, nonce, direction, sequence number, header byte or body byte gives another; and the
// Challenge round-trips with its flag.
TEST(KvAuth, SessionMacBindsSecretNoncesDirectionSequenceAndBytes) {
  const KvNonce server = random_nonce(), client = random_nonce();
  EXPECT_NE(server, client);
  const KvSession a("secret-of-sixteen-bytes", server, client), b("secret-of-sixteen-bytes", server, client);
  std::vector<uint8_t> header(kFrameHeaderBytes, 7), body = {1, 2, 3, 4, 5};
  const std::span<const uint8_t> parts[] = {body};
  const KvMac m = a.mac(true, 3, header, parts);
  EXPECT_TRUE(mac_equal(m, b.mac(true, 3, header, parts)));
  EXPECT_FALSE(mac_equal(m, KvSession("another-secret-16", server, client).mac(true, 3, header, parts)));
  EXPECT_FALSE(mac_equal(m, KvSession("secret-of-sixteen-bytes", client, server).mac(true, 3, header, parts)));
  EXPECT_FALSE(mac_equal(m, a.mac(false, 3, header, parts)));  // the other direction
  EXPECT_FALSE(mac_equal(m, a.mac(true, 4, header, parts)));   // a replay at another position
  header[5] ^= 1;
  EXPECT_FALSE(mac_equal(m, a.mac(true, 3, header, parts)));
  header[5] ^= 1;
  body[2] ^= 0x80;
  EXPECT_FALSE(mac_equal(m, a.mac(true, 3, header, parts)));
  EXPECT_FALSE(mac_equal(m, std::span(m.data(), m.size() - 1)));  // a short code
  const ChallengeMsg c = decode_challenge(encode_challenge({server, true}));
  EXPECT_EQ(c.nonce, server);
  EXPECT_TRUE(c.requires_auth);
  std::vector<uint8_t> bad = encode_challenge({server, true});
  bad.back() = 2;
  EXPECT_THROW(decode_challenge(bad), KvTransferError);
}

// --kv-transfer-secret-file: trailing newlines dropped; a missing file or a secret under 16
// bytes is refused naming the flag and the file.
TEST(KvAuth, SecretFileIsReadAndShortOrMissingOnesRefused) {
  const std::string dir = ::testing::TempDir();
  const auto write = [&](const std::string& name, const std::string& text) {
    const std::string path = dir + "/" + name;
    std::ofstream(path, std::ios::binary) << text;
    return path;
  };
  EXPECT_EQ(read_kv_secret_file(write("kv-secret-ok", "0123456789abcdef0123\n")), "0123456789abcdef0123");
  const auto error_of = [](const std::string& path) {
    try {
      read_kv_secret_file(path);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  const std::string short_path = write("kv-secret-short", "too-short\n");
  EXPECT_NE(error_of(short_path).find("--kv-transfer-secret-file: '" + short_path + "' holds 9 bytes"),
            std::string::npos)
      << error_of(short_path);
  EXPECT_NE(error_of(dir + "/no-such-secret").find("cannot read"), std::string::npos);
}
