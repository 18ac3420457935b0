#include "disagg/tcp_transport.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <initializer_list>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "disagg/kv_wire.h"

namespace tessera::disagg {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

class KvTransferTimeout : public KvTransferError {
 public:
  using KvTransferError::KvTransferError;
};

// A socket with its own io_context: every operation completes or ends at its deadline
// (a synchronous Asio read would wait forever on a peer that stopped sending).
class TimedSocket {
 public:
  TimedSocket() : socket_(io_) {}
  TimedSocket(const tcp& protocol, tcp::socket::native_handle_type fd) : socket_(io_, protocol, fd) {}

  void connect(const std::string& host, uint16_t port, Clock::time_point deadline) {
    tcp::resolver resolver(io_);
    boost::system::error_code ec;
    const auto endpoints = resolver.resolve(host, std::to_string(port), ec);
    if (ec) throw KvTransferError("KV transfer: cannot resolve " + host + ": " + ec.message());
    run([&](auto done) { asio::async_connect(socket_, endpoints, [done](auto e, const auto&) { done(e, 0); }); },
        deadline, "connecting to " + host + ":" + std::to_string(port));
    socket_.set_option(tcp::no_delay(true));
  }
  void read(void* p, size_t n, Clock::time_point deadline, const char* what) {
    run([&](auto done) { asio::async_read(socket_, asio::buffer(p, n), done); }, deadline, what);
  }
  void write(const std::vector<asio::const_buffer>& buffers, Clock::time_point deadline, const char* what) {
    run([&](auto done) { asio::async_write(socket_, buffers, done); }, deadline, what);
  }
  void close() {
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

 private:
  template <typename Start>
  void run(Start start, Clock::time_point deadline, const std::string& what) {
    bool done = false;
    boost::system::error_code ec;
    start([&](boost::system::error_code e, size_t) {
      ec = e;
      done = true;
    });
    io_.restart();
    io_.run_until(deadline);
    if (!done) {
      boost::system::error_code ignored;
      socket_.cancel(ignored);
      io_.restart();
      io_.run();  // the cancelled handler
      throw KvTransferTimeout("KV transfer: timed out " + what);
    }
    if (ec) throw KvTransferError("KV transfer: " + what + ": " + ec.message());
  }

  asio::io_context io_;
  tcp::socket socket_;
};

// The MACs of one side of a connection (kv_auth.h): none until start(), i.e. without a secret.
class FrameAuth {
 public:
  explicit FrameAuth(bool server) : server_(server) {}
  void start(const std::string& secret, const KvNonce& server_nonce, const KvNonce& client_nonce) {
    session_.emplace(secret, server_nonce, client_nonce);
  }
  bool active() const { return session_.has_value(); }
  // The MAC of the next frame this side sends.
  KvMac next_out(std::span<const uint8_t> header, std::initializer_list<std::span<const uint8_t>> body) {
    return session_->mac(server_, out_seq_++, header, std::span(body.begin(), body.size()));
  }
  // Checks the MAC read after the peer's next frame.
  void check_in(std::span<const uint8_t> header, std::initializer_list<std::span<const uint8_t>> body,
                std::span<const uint8_t> mac, const std::string& what) {
    if (!mac_equal(session_->mac(!server_, in_seq_++, header, std::span(body.begin(), body.size())), mac))
      throw KvTransferError("KV transfer: " + what +
                            " fails its authentication code (another secret, or the message was altered)");
  }

 private:
  bool server_;
  std::optional<KvSession> session_;
  uint64_t out_seq_ = 0, in_seq_ = 0;
};

// One message: its header, then its body (checked), then, with `auth` active and unless it
// is an Error, its MAC (checked). A body over `max_body` is refused unread.
struct Frame {
  FrameHeader header;
  std::array<uint8_t, kFrameHeaderBytes> raw{};  // the header as sent
  std::vector<uint8_t> body;
};

void read_mac(TimedSocket& s, FrameAuth& auth, std::span<const uint8_t> header,
              std::initializer_list<std::span<const uint8_t>> body, Clock::time_point deadline,
              const std::string& what) {
  KvMac mac{};
  s.read(mac.data(), mac.size(), deadline, "reading an authentication code");
  auth.check_in(header, body, mac, what);
}

Frame read_frame(TimedSocket& s, Clock::time_point deadline, uint64_t max_body, FrameAuth* auth) {
  Frame f;
  auto& h = f.raw;
  s.read(h.data(), h.size(), deadline, "reading a message header");
  f.header = decode_frame_header(h);
  if (f.header.body_bytes > max_body)
    throw KvTransferError(std::string("KV transfer: a ") + msg_type_name(f.header.type) + " message of " +
                          std::to_string(f.header.body_bytes) + " bytes where at most " + std::to_string(max_body) +
                          " were expected");
  f.body.resize(f.header.body_bytes);
  s.read(f.body.data(), f.body.size(), deadline, "reading a message body");
  check_body(f.header, f.body);
  if (auth && auth->active() && f.header.type != MsgType::Error)
    read_mac(s, *auth, h, {f.body}, deadline, std::string("a ") + msg_type_name(f.header.type) + " message");
  return f;
}

// Error frames carry no MAC: they only end a transfer, which anyone on the path can do.
void write_frame(TimedSocket& s, MsgType type, std::span<const uint8_t> body, Clock::time_point deadline,
                 FrameAuth* auth) {
  const auto h = encode_frame_header(type, body.size(), crc32c(body.data(), body.size()));
  if (auth && auth->active() && type != MsgType::Error) {
    const KvMac mac = auth->next_out(h, {body});
    s.write({asio::buffer(h), asio::buffer(body.data(), body.size()), asio::buffer(mac)}, deadline,
            "sending a message");
    return;
  }
  s.write({asio::buffer(h), asio::buffer(body.data(), body.size())}, deadline, "sending a message");
}

// The peer's Error message becomes ours; anything but `want` is refused by name.
void expect_type(const Frame& f, MsgType want, const std::string& peer) {
  if (f.header.type == want) return;
  if (f.header.type == MsgType::Error)
    throw KvTransferError("KV transfer: " + peer + " refused: " + decode_text(f.body));
  throw KvTransferError(std::string("KV transfer: expected a ") + msg_type_name(want) + " message from " + peer +
                        ", got " + msg_type_name(f.header.type));
}

constexpr uint64_t kMaxControlBody = 1 << 20;   // Pull, End, Ack, Error
constexpr uint64_t kMaxHeaderBody = 64u << 20;  // token ids of a long prompt

void add(std::atomic<int64_t>* c, int64_t v) {
  if (c) c->fetch_add(v, std::memory_order_relaxed);
}

}  // namespace

std::string KvHandle::address() const { return host + ":" + std::to_string(port) + "/" + std::to_string(lease); }

KvHandle KvHandle::parse(const std::string& address, int32_t n_blocks) {
  const size_t slash = address.rfind('/'), colon = address.rfind(':', slash);
  TESSERA_CHECK(slash != std::string::npos && colon != std::string::npos && colon > 0 && slash > colon + 1 &&
                    slash + 1 < address.size(),
                "KV handle '", address, "' is not host:port/id");
  KvHandle h;
  h.host = address.substr(0, colon);
  if (h.host.size() > 2 && h.host.front() == '[' && h.host.back() == ']') h.host = h.host.substr(1, h.host.size() - 2);
  try {
    size_t used = 0;
    const std::string port = address.substr(colon + 1, slash - colon - 1), id = address.substr(slash + 1);
    const unsigned long p = std::stoul(port, &used);
    TESSERA_CHECK(used == port.size() && p >= 1 && p <= 65535, "bad port");
    h.port = static_cast<uint16_t>(p);
    h.lease = std::stoull(id, &used);
    TESSERA_CHECK(used == id.size(), "bad id");
  } catch (const std::exception&) {
    fail("KV handle '", address, "' is not host:port/id (port 1..65535, id a number)");
  }
  TESSERA_CHECK(n_blocks >= 0, "KV handle '", address, "': ", n_blocks, " blocks");
  h.n_blocks = n_blocks;
  return h;
}

struct TcpKvServer::Impl {
  KvLeaseSource& source;
  TcpKvServerOptions options;
  KvTransferCounters* counters;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::thread accept_thread;
  std::mutex mutex;
  struct Worker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::vector<Worker> workers;
  bool started = false;

  Impl(KvLeaseSource& s, TcpKvServerOptions o, KvTransferCounters* c) : source(s), options(std::move(o)), counters(c) {}

  void accept_next() {
    acceptor.async_accept([this](boost::system::error_code ec, tcp::socket socket) {
      if (ec) return;  // closed: stopping
      spawn(std::move(socket));
      accept_next();
    });
  }

  void spawn(tcp::socket socket) {
    boost::system::error_code ec;
    const tcp protocol = socket.local_endpoint(ec).protocol();
    if (ec) return;
    const auto fd = socket.release(ec);
    if (ec) return;
    std::lock_guard lock(mutex);
    // Join the workers that have finished, so the list holds only live pulls.
    std::erase_if(workers, [](Worker& w) {
      if (!w.done->load()) return false;
      w.thread.join();
      return true;
    });
    auto done = std::make_shared<std::atomic<bool>>(false);
    workers.push_back({std::thread([this, protocol, fd, done] {
                         serve(protocol, fd);
                         done->store(true);
                       }),
                       done});
  }

  void serve(const tcp& protocol, tcp::socket::native_handle_type fd) {
    TimedSocket s(protocol, fd);
    const auto deadline = [&] { return Clock::now() + options.io_timeout; };
    bool refused = false;
    FrameAuth auth(/*server=*/true);
    try {
      const KvNonce server_nonce = random_nonce();
      write_frame(s, MsgType::Challenge, encode_challenge({server_nonce, !options.secret.empty()}), deadline(),
                  nullptr);
      // The Pull's MAC can be checked once its body has given the client's nonce; nothing else
      // of it is looked at before.
      const Frame f = read_frame(s, deadline(), kMaxControlBody, nullptr);
      expect_type(f, MsgType::Pull, "the decode side");
      const PullMsg pull = decode_pull(f.body);
      if (!options.secret.empty()) {
        auth.start(options.secret, server_nonce, pull.client_nonce);
        try {
          read_mac(s, auth, f.raw, {f.body}, deadline(), "the Pull message");
        } catch (const std::exception& e) {
          refused = true;
          add(counters ? &counters->unauthenticated : nullptr, 1);
          fail("unauthenticated peer: ", e.what(), " (both workers need the same --kv-transfer-secret-file)");
        }
      }
      const KvIdentity mine = source.identity();
      if (const std::string why = mine.mismatch(pull.identity); !why.empty()) {
        refused = true;
        fail("KV format mismatch (", why, ")");
      }
      std::shared_ptr<const KvBlocksPayload> payload;
      try {
        payload = source.stage(pull.lease);
      } catch (const std::exception&) {
        refused = true;
        throw;
      }
      const uint32_t n = std::min<uint32_t>(pull.max_blocks, static_cast<uint32_t>(payload->n_blocks()));
      HeaderMsg header{payload->identity,
                       std::vector<int32_t>(payload->tokens.begin(), payload->tokens.begin() + n * mine.block_size),
                       payload->tenant_salt, payload->adapter_id, n};
      write_frame(s, MsgType::Header, encode_header(header), deadline(), &auth);
      const auto bb = static_cast<size_t>(mine.block_bytes());
      for (uint32_t i = 0; i < n; ++i) {
        const auto index = encode_u32(i);
        const uint8_t* slot = payload->blocks->slot(static_cast<int32_t>(i));
        const uint32_t crc = crc32c(slot, bb, crc32c(index.data(), index.size()));
        const auto h = encode_frame_header(MsgType::Block, index.size() + bb, crc);
        KvMac mac{};
        if (auth.active()) mac = auth.next_out(h, {index, std::span(slot, bb)});
        s.write({asio::buffer(h), asio::buffer(index), asio::buffer(slot, bb),
                 asio::buffer(mac.data(), auth.active() ? mac.size() : 0)},
                deadline(), "sending a block");
        add(counters ? &counters->bytes_sent : nullptr, static_cast<int64_t>(kFrameHeaderBytes + index.size() + bb));
      }
      write_frame(s, MsgType::End, encode_u32(n), deadline(), &auth);
      const Frame ack = read_frame(s, deadline(), kMaxControlBody, &auth);
      expect_type(ack, MsgType::Ack, "the decode side");
      TESSERA_CHECK(decode_u64(ack.body, MsgType::Ack) == pull.lease, "KV transfer: acknowledgement of another lease");
      source.release(pull.lease);  // every block arrived: the lease has done its work
      add(counters ? &counters->served : nullptr, 1);
    } catch (const std::exception& e) {
      // The lease stays until it expires: the decode side may not have the blocks.
      add(counters ? &counters->serve_failures : nullptr, 1);
      if (refused) {
        try {
          write_frame(s, MsgType::Error, encode_text(e.what()), deadline(), nullptr);
        } catch (const std::exception&) {
        }
      }
    }
    s.close();
  }
};

TcpKvServer::TcpKvServer(KvLeaseSource& source, TcpKvServerOptions options, KvTransferCounters* counters)
    : impl_(std::make_unique<Impl>(source, std::move(options), counters)) {}

TcpKvServer::~TcpKvServer() { stop(); }

void TcpKvServer::start() {
  TESSERA_CHECK(!impl_->started, "KV transfer server: started twice");
  Impl& m = *impl_;
  try {
    const tcp::endpoint ep(asio::ip::make_address(m.options.host), m.options.port);
    m.acceptor.open(ep.protocol());
    m.acceptor.set_option(tcp::acceptor::reuse_address(true));
    m.acceptor.bind(ep);
    m.acceptor.listen();
  } catch (const std::exception& e) {
    fail("KV transfer server: cannot listen on ", m.options.host, ":", m.options.port, ": ", e.what());
  }
  m.started = true;
  m.accept_next();
  m.accept_thread = std::thread([&m] { m.io.run(); });
}

uint16_t TcpKvServer::port() const { return impl_->acceptor.local_endpoint().port(); }
const std::string& TcpKvServer::host() const { return impl_->options.host; }

void TcpKvServer::stop() {
  Impl& m = *impl_;
  if (!m.started) return;
  asio::post(m.io, [&m] {
    boost::system::error_code ec;
    m.acceptor.close(ec);
  });
  if (m.accept_thread.joinable()) m.accept_thread.join();
  std::vector<Impl::Worker> workers;
  {
    std::lock_guard lock(m.mutex);
    workers.swap(m.workers);
  }
  for (auto& w : workers) w.thread.join();
  m.started = false;
}

std::shared_ptr<KvBlocksPayload> TcpKvPuller::pull(const KvHandle& handle, const KvIdentity& expect,
                                                   std::shared_ptr<HostKvTier> staging,
                                                   std::chrono::milliseconds timeout) {
  const auto t0 = Clock::now();
  const Clock::time_point deadline = t0 + timeout;
  const std::string peer = "prefill worker " + handle.host + ":" + std::to_string(handle.port);
  int64_t received = 0;
  try {
    TESSERA_CHECK(staging != nullptr && staging->slot_bytes() == expect.block_bytes(), "KV transfer: staging of ",
                  staging ? staging->slot_bytes() : 0, " bytes a slot for blocks of ", expect.block_bytes());
    TimedSocket s;
    s.connect(handle.host, handle.port, deadline);
    const Frame ch = read_frame(s, deadline, kMaxControlBody, nullptr);
    expect_type(ch, MsgType::Challenge, peer);
    const ChallengeMsg challenge = decode_challenge(ch.body);
    if (challenge.requires_auth && secret_.empty())
      throw KvTransferError("KV transfer: " + peer +
                            " requires authentication: give this worker its --kv-transfer-secret-file");
    if (!challenge.requires_auth && !secret_.empty())
      throw KvTransferError("KV transfer: " + peer +
                            " does not authenticate (it has no --kv-transfer-secret-file): its KV is refused");
    const PullMsg pull{handle.lease, static_cast<uint32_t>(staging->n_slots()), expect, random_nonce()};
    FrameAuth auth(/*server=*/false);
    if (challenge.requires_auth) auth.start(secret_, challenge.nonce, pull.client_nonce);
    write_frame(s, MsgType::Pull, encode_pull(pull), deadline, &auth);
    const Frame f = read_frame(s, deadline, kMaxHeaderBody, &auth);
    expect_type(f, MsgType::Header, peer);
    HeaderMsg header = decode_header(f.body);
    if (const std::string why = expect.mismatch(header.identity); !why.empty())
      throw KvTransferError("KV transfer: KV format mismatch with " + peer + " (" + why + ")");
    TESSERA_CHECK(header.n_blocks <= static_cast<uint32_t>(staging->n_slots()), "KV transfer: ", peer, " sends ",
                  header.n_blocks, " blocks for ", staging->n_slots(), " reserved");
    const auto bb = static_cast<size_t>(expect.block_bytes());
    for (uint32_t i = 0; i < header.n_blocks; ++i) {
      // Straight into the staging slot: header, then the index, then the block's bytes.
      std::array<uint8_t, kFrameHeaderBytes> hb{};
      s.read(hb.data(), hb.size(), deadline, "reading a block header");
      const FrameHeader h = decode_frame_header(hb);
      if (h.type != MsgType::Block) {
        Frame other{h, hb, std::vector<uint8_t>(std::min<uint64_t>(h.body_bytes, kMaxControlBody))};
        if (h.type == MsgType::Error && h.body_bytes <= kMaxControlBody) {
          s.read(other.body.data(), other.body.size(), deadline, "reading an error");
          check_body(h, other.body);
        }
        expect_type(other, MsgType::Block, peer);
      }
      TESSERA_CHECK(h.body_bytes == 4 + bb, "KV transfer: block ", i, " message of ", h.body_bytes, " bytes, expected ",
                    4 + bb);
      std::array<uint8_t, 4> index{};
      s.read(index.data(), index.size(), deadline, "reading a block");
      uint8_t* slot = staging->slot(static_cast<int32_t>(i));
      s.read(slot, bb, deadline, "reading a block");
      if (crc32c(slot, bb, crc32c(index.data(), index.size())) != h.body_crc)
        throw KvTransferError("KV transfer: block " + std::to_string(i) + " checksum mismatch");
      if (auth.active()) read_mac(s, auth, hb, {index, std::span(slot, bb)}, deadline, "block " + std::to_string(i));
      TESSERA_CHECK(decode_u32(index, MsgType::Block) == i, "KV transfer: block ", decode_u32(index, MsgType::Block),
                    " arrived where block ", i, " was due");
      received += static_cast<int64_t>(kFrameHeaderBytes + 4 + bb);
    }
    const Frame end = read_frame(s, deadline, kMaxControlBody, &auth);
    expect_type(end, MsgType::End, peer);
    TESSERA_CHECK(decode_u32(end.body, MsgType::End) == header.n_blocks, "KV transfer: ", peer, " ended after ",
                  decode_u32(end.body, MsgType::End), " of ", header.n_blocks, " blocks");
    write_frame(s, MsgType::Ack, encode_u64(handle.lease), deadline, &auth);
    s.close();
    auto payload = std::make_shared<KvBlocksPayload>();
    payload->identity = header.identity;
    payload->tokens = std::move(header.tokens);
    payload->tenant_salt = std::move(header.tenant_salt);
    payload->adapter_id = std::move(header.adapter_id);
    payload->blocks = std::move(staging);
    if (counters_) {
      counters_->pulled.fetch_add(1, std::memory_order_relaxed);
      counters_->bytes_received.fetch_add(received, std::memory_order_relaxed);
      counters_->pull_micros.fetch_add(std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - t0).count(),
                                       std::memory_order_relaxed);
    }
    return payload;
  } catch (const KvTransferTimeout&) {
    if (counters_) {
      counters_->pull_failures.fetch_add(1, std::memory_order_relaxed);
      counters_->pull_timeouts.fetch_add(1, std::memory_order_relaxed);
    }
    throw;
  } catch (const KvTransferError&) {
    if (counters_) counters_->pull_failures.fetch_add(1, std::memory_order_relaxed);
    throw;
  } catch (const std::exception& e) {
    if (counters_) counters_->pull_failures.fetch_add(1, std::memory_order_relaxed);
    throw KvTransferError(e.what());
  }
}

}  // namespace tessera::disagg
