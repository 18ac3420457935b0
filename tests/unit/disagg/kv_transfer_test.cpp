// Prefill/decode disaggregation between two engines in one process, over the TCP transport
// on loopback, with dummy llama3-tiny weights (same seed on both sides): greedy output after a
// transferred prefill equals the colocated output token for token; the decode side starts
// after the imported blocks; every KV block is free again on both sides after a completed
// pull, a stalled or broken-off pull (decode side's reservation given back, local prefill
// instead), an expired lease, and a refused format or tenant.
#include <gtest/gtest.h>

#include <boost/asio.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>
#include <thread>

#include "disagg/kv_wire.h"
#include "disagg/tcp_transport.h"
#include "engine/engine.h"
#include "engine/engine_model.h"

using namespace tessera;
using namespace tessera::disagg;
using namespace std::chrono_literals;

namespace {

ModelEngineOptions tiny() {
  ModelEngineOptions o;
  o.session.model = "dummy:llama3-tiny";
  o.session.backend.threads = 1;
  o.session.block_size = 4;
  o.scheduler.max_num_batched_tokens = 64;
  o.scheduler.max_num_seqs = 4;
  o.scheduler.max_model_len = 128;
  o.max_kv_blocks = 64;
  o.kv_cache_bytes = 8ll << 20;
  o.warmup = false;
  return o;
}

Request greedy(int max_tokens, const std::string& salt = "tenant-a") {
  Request r;
  for (int i = 0; i < 23; ++i) r.prompt.push_back((i * 37 + 11) % 4000);
  r.sampling.temperature = 0;
  r.sampling.max_tokens = max_tokens;
  r.sampling.ignore_eos = true;
  r.tenant_salt = salt;
  return r;
}

std::vector<int32_t> run(Engine& e, Request r) {
  SubmitResult s = e.submit(std::move(r));
  EXPECT_TRUE(s.ok()) << (s.rejection ? s.rejection->message : "");
  if (!s.ok()) return {};
  RequestOutput out = s.stream->collect();
  EXPECT_EQ(out.error, "");
  return out.tokens.at(0);
}

// Waits until pred() holds (the engine thread publishes stats after each message or step).
bool eventually(const std::function<bool()>& pred) {
  for (int i = 0; i < 400; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

bool all_free(const Engine& e) {
  const EngineStats s = e.stats();
  return s.kv_free_blocks == s.kv_total_blocks && s.transfer.active_leases == 0 &&
         s.transfer.active_reservations == 0 && s.running == 0 && s.waiting == 0;
}

struct Sides : ::testing::Test {
  static void SetUpTestSuite() {
    prefill_model_ = new ModelEngine(tiny());
    decode_model_ = new ModelEngine(tiny());
    Engine colocated(decode_model_->config(), decode_model_->executor());
    reference_ = new std::vector<int32_t>(run(colocated, greedy(8)));
  }
  static void TearDownTestSuite() {
    delete prefill_model_;
    delete decode_model_;
    delete reference_;
  }
  void SetUp() override {
    // Whatever an earlier run left in the decode side's KV memory (the same prompt's KV, in
    // the same blocks) must not make a transfer that moved nothing look right.
    KvCache& kv = decode_model_->kv();
    for (int l = 0; l < kv.spec().n_layers; ++l) {
      const KvLayerView v = kv.layer(l);
      std::memset(v.k, 0x3c, static_cast<size_t>(v.n_blocks) * v.n_kv_heads * v.k_page_bytes);
      std::memset(v.v, 0x3c, static_cast<size_t>(v.n_blocks) * v.n_kv_heads * v.v_page_bytes);
    }
    prefill_ = std::make_unique<Engine>(prefill_model_->config(), prefill_model_->executor());
    decode_ = std::make_unique<Engine>(decode_model_->config(), decode_model_->executor());
    source_ = std::make_unique<EngineLeaseSource>(*prefill_);
    start_server();
  }
  // (Re)starts the prefill side's KV server, with a shared secret or without.
  void start_server(const std::string& secret = {}) {
    if (server_) server_->stop();
    server_ = std::make_unique<TcpKvServer>(*source_, TcpKvServerOptions{"127.0.0.1", 0, 2000ms, secret}, &counters_);
    server_->start();
  }
  void TearDown() override {
    server_->stop();
    prefill_->stop();
    decode_->stop();
  }
  // The prefill worker's part: the prompt with max_tokens 1 under a lease.
  KvHandle prefill(double lease_seconds = 30) {
    Request r = greedy(1);
    r.kv_lease_seconds = lease_seconds;
    SubmitResult s = prefill_->submit(r);
    EXPECT_TRUE(s.ok());
    const RequestOutput out = s.stream->collect();
    EXPECT_EQ(out.tokens.at(0).at(0), reference_->at(0));  // it produces the first token too
    const auto& lease = s.stream->progress()->kv_lease;
    EXPECT_TRUE(lease.has_value());
    KvHandle h;
    h.host = "127.0.0.1";
    h.port = server_->port();
    h.lease = lease ? lease->id : 0;
    h.n_blocks = lease ? lease->n_blocks : 0;
    return h;
  }

  // Pulls `h`, which must fail with an error containing `expected`.
  void expect_pull_error(const KvHandle& h, const KvIdentity& id, std::shared_ptr<HostKvTier> staging,
                         std::chrono::milliseconds timeout, const std::string& expected, KvPuller* puller = nullptr) {
    try {
      (puller ? *puller : puller_).pull(h, id, std::move(staging), timeout);
      ADD_FAILURE() << "the pull returned; expected: " << expected;
    } catch (const KvTransferError& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  }

  static ModelEngine* prefill_model_;
  static ModelEngine* decode_model_;
  static std::vector<int32_t>* reference_;
  KvTransferCounters counters_;
  std::unique_ptr<Engine> prefill_, decode_;
  std::unique_ptr<EngineLeaseSource> source_;
  std::unique_ptr<TcpKvServer> server_;
  TcpKvPuller puller_{&counters_};
};
ModelEngine* Sides::prefill_model_ = nullptr;
ModelEngine* Sides::decode_model_ = nullptr;
std::vector<int32_t>* Sides::reference_ = nullptr;

// A peer that accepts one connection, reads what comes, and then does `act` with the socket.
class FakePeer {
 public:
  explicit FakePeer(std::function<void(boost::asio::ip::tcp::socket&)> act) : acceptor_(io_) {
    using boost::asio::ip::tcp;
    acceptor_.open(tcp::v4());
    acceptor_.bind(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), 0));
    acceptor_.listen();
    thread_ = std::thread([this, act] {
      tcp::socket s(io_);
      acceptor_.accept(s);
      act(s);
    });
  }
  ~FakePeer() { thread_.join(); }
  uint16_t port() const { return acceptor_.local_endpoint().port(); }

 private:
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_;
  std::thread thread_;
};

}  // namespace

TEST_F(Sides, TransferredPrefillEqualsColocatedAndFreesEverything) {
  ASSERT_EQ(reference_->size(), 8u);
  const KvHandle h = prefill();
  EXPECT_EQ(h.n_blocks, (23 - 1) / 4);  // the blocks a decode side can use
  EXPECT_EQ(prefill_->stats().transfer.leased_blocks, h.n_blocks);

  const KvImportReservation res = decode_->reserve_kv_import(h.n_blocks);
  EXPECT_EQ(decode_->stats().transfer.reserved_blocks, h.n_blocks);
  auto payload = puller_.pull(h, decode_->kv_identity(), res.staging, 5000ms);
  EXPECT_EQ(payload->n_blocks(), h.n_blocks);
  EXPECT_EQ(payload->tenant_salt, "tenant-a");
  Request r = greedy(8);
  r.kv_import = KvImport{res.id, payload};
  SubmitResult s = decode_->submit(r);
  ASSERT_TRUE(s.ok()) << s.rejection->message;
  const RequestOutput out = s.stream->collect();
  EXPECT_EQ(out.tokens.at(0), *reference_);
  EXPECT_EQ(s.stream->progress()->cached_prompt_tokens, h.n_blocks * 4);  // started after the imported blocks

  // The prefill side released its lease on the acknowledgement; nothing is held anywhere.
  EXPECT_TRUE(eventually([&] { return all_free(*prefill_); }));
  EXPECT_TRUE(eventually([&] { return all_free(*decode_); }));
  EXPECT_EQ(prefill_->stats().transfer.leases_released, 1);
  EXPECT_EQ(decode_->stats().transfer.imported_blocks, h.n_blocks);
  EXPECT_TRUE(eventually([&] { return counters_.served.load() == 1; }));
  EXPECT_EQ(counters_.pulled.load(), 1);
  EXPECT_EQ(counters_.bytes_received.load(), counters_.bytes_sent.load());
  EXPECT_GT(counters_.bytes_received.load(), h.n_blocks * decode_->kv_identity().block_bytes());
}

TEST_F(Sides, StalledTransferTimesOutAndTheDecodeSidePrefillsLocally) {
  const KvHandle real = prefill(0.3);
  // A prefill worker that accepts and then says nothing.
  FakePeer stalled([](boost::asio::ip::tcp::socket& s) { std::this_thread::sleep_for(800ms); });
  KvHandle h = real;
  h.port = stalled.port();
  const KvImportReservation res = decode_->reserve_kv_import(h.n_blocks);
  expect_pull_error(h, decode_->kv_identity(), res.staging, 300ms, "timed out");
  EXPECT_EQ(counters_.pull_timeouts.load(), 1);
  decode_->cancel_kv_import(res.id);
  EXPECT_TRUE(all_free(*decode_));
  EXPECT_EQ(run(*decode_, greedy(8)), *reference_);  // the fallback: local prefill
  // The real lease was never pulled: it expires and frees its blocks.
  EXPECT_TRUE(eventually([&] { return all_free(*prefill_); }));
  EXPECT_EQ(prefill_->stats().transfer.leases_expired, 1);
}

TEST_F(Sides, PrefillWorkerDyingMidTransferFreesTheReservation) {
  const KvHandle real = prefill(0.3);
  // A prefill worker that sends a valid Header and one block of two, then dies.
  const KvIdentity id = decode_->kv_identity();
  FakePeer dying([&](boost::asio::ip::tcp::socket& s) {
    boost::asio::write(s, boost::asio::buffer(encode_frame(MsgType::Challenge, encode_challenge({}))));
    std::vector<uint8_t> pull(1024);
    s.read_some(boost::asio::buffer(pull));
    HeaderMsg hm{id, std::vector<int32_t>(8, 5), "tenant-a", "", 2};
    boost::asio::write(s, boost::asio::buffer(encode_frame(MsgType::Header, encode_header(hm))));
    std::vector<uint8_t> block(4 + id.block_bytes(), 0);
    boost::asio::write(s, boost::asio::buffer(encode_frame(MsgType::Block, block)));
    s.close();
  });
  KvHandle h = real;
  h.port = dying.port();
  const KvImportReservation res = decode_->reserve_kv_import(h.n_blocks);
  expect_pull_error(h, id, res.staging, 2000ms, "reading a block header");
  decode_->cancel_kv_import(res.id);
  EXPECT_TRUE(all_free(*decode_));
  // And a worker that is gone altogether: connection refused, named.
  server_->stop();
  h.port = real.port;
  const KvImportReservation res2 = decode_->reserve_kv_import(h.n_blocks);
  expect_pull_error(h, id, res2.staging, 2000ms, "connecting to 127.0.0.1");
  decode_->cancel_kv_import(res2.id);
  EXPECT_TRUE(all_free(*decode_));
  EXPECT_EQ(counters_.pull_failures.load(), 2);
  EXPECT_TRUE(eventually([&] { return all_free(*prefill_); }));  // its lease expired
}

TEST_F(Sides, ExpiredLeaseIsRefusedByName) {
  const KvHandle h = prefill(0.05);
  EXPECT_TRUE(eventually([&] { return all_free(*prefill_); }));
  const KvImportReservation res = decode_->reserve_kv_import(h.n_blocks);
  expect_pull_error(h, decode_->kv_identity(), res.staging, 2000ms, "is unknown: it expired");
  decode_->cancel_kv_import(res.id);
  EXPECT_TRUE(all_free(*decode_));
}

TEST_F(Sides, FormatMismatchIsRefusedAndTheLeaseStays) {
  const KvHandle h = prefill();
  KvIdentity other = decode_->kv_identity();
  other.kv_format = "fp8_e4m3";
  auto staging = std::make_shared<HostKvTier>(*decode_model_->executor().kv_spec(), h.n_blocks);
  expect_pull_error(h, other, staging, 2000ms, "KV format mismatch (KV format: here 'f16', there 'fp8_e4m3')");
  EXPECT_EQ(prefill_->stats().transfer.active_leases, 1);  // still pullable by a matching side
  prefill_->release_kv_lease(h.lease);
  EXPECT_TRUE(all_free(*prefill_));
}

TEST_F(Sides, BlocksNeverCrossTenants) {
  const KvHandle h = prefill();
  const KvImportReservation res = decode_->reserve_kv_import(h.n_blocks);
  auto payload = puller_.pull(h, decode_->kv_identity(), res.staging, 5000ms);
  Request r = greedy(8, "tenant-b");
  r.kv_import = KvImport{res.id, payload};
  SubmitResult s = decode_->submit(r);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.rejection->message.find("another tenant"), std::string::npos) << s.rejection->message;
  decode_->cancel_kv_import(res.id);
  EXPECT_TRUE(all_free(*decode_));
  EXPECT_TRUE(eventually([&] { return all_free(*prefill_); }));
}

TEST_F(Sides, ReservationRefusedCleanlyWhenTheCacheIsFull) {
  try {
    decode_->reserve_kv_import(1000);
    ADD_FAILURE() << "reserved more blocks than the cache has";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("KV import of 1000 blocks"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(all_free(*decode_));
}

// Authentication (kv_auth.h, RELIABILITY.md: unauthenticated peers, replayed payloads): with
// the same secret on both sides the pull works; a decode side without it, or with another, is
// refused before it learns anything and the lease stays for the right one; a decode side with a
// secret refuses a prefill side without one; a Pull recorded from one connection and replayed
// on another fails against the new server nonce.
TEST_F(Sides, SharedSecretAuthenticatesBothEndsAndRefusesEveryoneElse) {
  const std::string secret = "0123456789abcdef-shared-secret";
  start_server(secret);
  const KvHandle h = prefill();
  const KvIdentity id = decode_->kv_identity();
  {
    TcpKvPuller none(&counters_);
    const KvImportReservation res = decode_->reserve_kv_import(h.n_blocks);
    expect_pull_error(h, id, res.staging, 2000ms, "requires authentication", &none);
    decode_->cancel_kv_import(res.id);
  }
  {
    TcpKvPuller wrong(&counters_, "another-secret-of-16-bytes");
    const KvImportReservation res = decode_->reserve_kv_import(h.n_blocks);
    expect_pull_error(h, id, res.staging, 2000ms, "unauthenticated peer", &wrong);
    decode_->cancel_kv_import(res.id);
  }
  EXPECT_TRUE(eventually([&] { return counters_.unauthenticated.load() == 1; }));
  EXPECT_EQ(prefill_->stats().transfer.leases_released, 0);  // nothing served: the lease stays
  // A replay: the right side's Pull (with its MAC) recorded by a fake prefill worker, then
  // sent as it was to the real one.
  std::vector<uint8_t> recorded;
  {
    FakePeer recorder([&](boost::asio::ip::tcp::socket& s) {
      boost::asio::write(s, boost::asio::buffer(encode_frame(MsgType::Challenge, encode_challenge({{}, true}))));
      std::vector<uint8_t> buf(4096);
      boost::system::error_code ec;
      const size_t n = s.read_some(boost::asio::buffer(buf), ec);
      recorded.assign(buf.begin(), buf.begin() + static_cast<ptrdiff_t>(n));
      s.close();
    });
    TcpKvPuller right(&counters_, secret);
    KvHandle fake = h;
    fake.port = recorder.port();
    const KvImportReservation res = decode_->reserve_kv_import(h.n_blocks);
    expect_pull_error(fake, id, res.staging, 2000ms, "", &right);
    decode_->cancel_kv_import(res.id);
  }
  ASSERT_GT(recorded.size(), kFrameHeaderBytes + kMacBytes);
  {
    boost::asio::io_context io;
    boost::asio::ip::tcp::socket s(io);
    s.connect({boost::asio::ip::make_address("127.0.0.1"), h.port});
    std::vector<uint8_t> challenge(4096);
    s.read_some(boost::asio::buffer(challenge));  // the server's fresh nonce
    boost::asio::write(s, boost::asio::buffer(recorded));
    std::vector<uint8_t> answer(4096);
    boost::system::error_code ec;
    const size_t n = boost::asio::read(s, boost::asio::buffer(answer), ec);  // until the server closes
    const FrameHeader fh = decode_frame_header(std::span(answer.data(), n));
    EXPECT_EQ(fh.type, MsgType::Error);
    const std::string text = decode_text(std::span(answer.data() + kFrameHeaderBytes, fh.body_bytes));
    EXPECT_NE(text.find("unauthenticated peer"), std::string::npos) << text;
  }
  EXPECT_TRUE(eventually([&] { return counters_.unauthenticated.load() == 2; }));
  // The right secret: the blocks arrive and the output is the colocated one.
  TcpKvPuller right(&counters_, secret);
  const KvImportReservation res = decode_->reserve_kv_import(h.n_blocks);
  auto payload = right.pull(h, id, res.staging, 5000ms);
  EXPECT_EQ(payload->n_blocks(), h.n_blocks);
  Request r = greedy(8);
  r.kv_import = KvImport{res.id, payload};
  SubmitResult s = decode_->submit(r);
  ASSERT_TRUE(s.ok()) << s.rejection->message;
  EXPECT_EQ(s.stream->collect().tokens.at(0), *reference_);
  EXPECT_TRUE(eventually([&] { return all_free(*prefill_); }));
  EXPECT_TRUE(eventually([&] { return all_free(*decode_); }));
  // A decode side with a secret refuses a prefill side without one.
  start_server();
  const KvHandle plain = prefill();
  const KvImportReservation res2 = decode_->reserve_kv_import(plain.n_blocks);
  expect_pull_error(plain, id, res2.staging, 2000ms, "does not authenticate", &right);
  decode_->cancel_kv_import(res2.id);
  EXPECT_TRUE(all_free(*decode_));
}
