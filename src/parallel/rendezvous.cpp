// A minimal TCP exchange: each peer sends "TSRV" + world_size + rank (three u32, little
// endian); rank 0 answers with the blob's length (u32) and bytes. Blocking sockets with
// poll() deadlines; a peer retries its connection until rank 0 listens or the timeout ends.
#include "parallel/rendezvous.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/error.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x56525354;  // "TSRV"
constexpr uint32_t kMaxBlob = 1 << 20;

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

int ms_left(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(std::min<int64_t>(left, 1 << 30)) : 0;
}

// Waits until fd is readable (events POLLIN) or writable (POLLOUT); false at the deadline.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) fail("rendezvous: poll: ", std::strerror(errno));
  }
}

void send_all(int fd, const void* data, size_t n, Clock::time_point deadline, const char* what) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    if (!wait_for(fd, POLLOUT, deadline)) fail("rendezvous: timed out sending ", what);
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail("rendezvous: sending ", what, ": ", std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void recv_all(int fd, void* data, size_t n, Clock::time_point deadline, const char* what) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    if (!wait_for(fd, POLLIN, deadline)) fail("rendezvous: timed out receiving ", what);
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k == 0) fail("rendezvous: the connection closed while receiving ", what);
    if (k < 0) fail("rendezvous: receiving ", what, ": ", std::strerror(errno));
    p += k;
    n -= static_cast<size_t>(k);
  }
}

addrinfo* resolve(const RendezvousOptions& o, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(o.master_port);
  const int rc = ::getaddrinfo(o.master_addr.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) fail("rendezvous: cannot resolve master address '", o.master_addr, "': ", gai_strerror(rc));
  return res;
}

std::string serve(const RendezvousOptions& o, const std::string& blob, Clock::time_point deadline) {
  addrinfo* res = resolve(o, true);
  Socket listener;
  std::string last_error = "no address";
  for (addrinfo* a = res; a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
    if (s.fd() < 0) continue;
    const int one = 1;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd(), a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.fd(), 128) == 0) {
      listener = std::move(s);
      break;
    }
    last_error = std::strerror(errno);
  }
  ::freeaddrinfo(res);
  if (listener.fd() < 0)
    fail("rendezvous: rank 0 cannot listen on ", o.master_addr, ":", o.master_port, ": ", last_error);

  const int world = o.world_size();
  std::vector<bool> seen(world, false);
  seen[0] = true;
  for (int joined = 1; joined < world; ++joined) {
    if (!wait_for(listener.fd(), POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < world; ++r)
        if (!seen[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      fail("rendezvous: timed out after ", o.timeout_s, " s waiting for rank(s) ", missing, " of ", world, " at ",
           o.master_addr, ":", o.master_port);
    }
    Socket peer(::accept(listener.fd(), nullptr, nullptr));
    if (peer.fd() < 0) fail("rendezvous: accept: ", std::strerror(errno));
    uint32_t hello[3];
    recv_all(peer.fd(), hello, sizeof(hello), deadline, "a peer's greeting");
    TESSERA_CHECK(hello[0] == kMagic, "rendezvous: a connection to ", o.master_addr, ":", o.master_port,
                  " is not a tessera rank");
    const uint32_t peer_world = hello[1], peer_rank = hello[2];
    TESSERA_CHECK(peer_world == static_cast<uint32_t>(world), "rendezvous: rank ", peer_rank, " says the world has ",
                  peer_world, " ranks, rank 0 says ", world, " (check --nnodes and the per-node rank count)");
    TESSERA_CHECK(peer_rank >= 1 && peer_rank < static_cast<uint32_t>(world), "rendezvous: a peer claims rank ",
                  peer_rank, " of a world of ", world);
    TESSERA_CHECK(!seen[peer_rank], "rendezvous: rank ", peer_rank, " joined twice (check --node-rank)");
    seen[peer_rank] = true;
    const uint32_t len = static_cast<uint32_t>(blob.size());
    send_all(peer.fd(), &len, sizeof(len), deadline, "the blob's length");
    send_all(peer.fd(), blob.data(), blob.size(), deadline, "the blob");
  }
  return blob;
}

std::string join(const RendezvousOptions& o, Clock::time_point deadline) {
  std::string last_error;
  while (true) {  // rank 0 may not listen yet: retry until the deadline
    addrinfo* res = resolve(o, false);
    for (addrinfo* a = res; a; a = a->ai_next) {
      Socket s(::socket(a->ai_family, a->ai_socktype, a->ai_protocol));
      if (s.fd() < 0) continue;
      if (::connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) {
        last_error = std::strerror(errno);
        continue;
      }
      ::freeaddrinfo(res);
      const uint32_t hello[3] = {kMagic, static_cast<uint32_t>(o.world_size()), static_cast<uint32_t>(o.global_rank())};
      send_all(s.fd(), hello, sizeof(hello), deadline, "the greeting");
      uint32_t len = 0;
      recv_all(s.fd(), &len, sizeof(len), deadline, "the blob's length from rank 0");
      TESSERA_CHECK(len <= kMaxBlob, "rendezvous: rank 0 announced a blob of ", len, " bytes (limit ", kMaxBlob, ")");
      std::string blob(len, '\0');
      recv_all(s.fd(), blob.data(), len, deadline, "the blob from rank 0");
      return blob;
    }
    ::freeaddrinfo(res);
    if (ms_left(deadline) == 0)
      fail("rendezvous: rank ", o.global_rank(), " could not reach rank 0 at ", o.master_addr, ":", o.master_port,
           " within ", o.timeout_s, " s (", last_error, ")");
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, ms_left(deadline))));
  }
}

}  // namespace

void RendezvousOptions::validate() const {
  TESSERA_CHECK(!master_addr.empty(), "rendezvous: --master-addr is empty");
  TESSERA_CHECK(master_port >= 1 && master_port <= 65535, "rendezvous: --master-port ", master_port,
                " is outside 1..65535");
  TESSERA_CHECK(nnodes >= 1, "rendezvous: --nnodes ", nnodes, " must be at least 1");
  TESSERA_CHECK(node_rank >= 0 && node_rank < nnodes, "rendezvous: --node-rank ", node_rank, " is outside 0..",
                nnodes - 1, " (--nnodes ", nnodes, ")");
  TESSERA_CHECK(ranks_per_node >= 1, "rendezvous: ", ranks_per_node, " ranks per node");
  TESSERA_CHECK(local_rank >= 0 && local_rank < ranks_per_node, "rendezvous: local rank ", local_rank,
                " is outside 0..", ranks_per_node - 1);
  TESSERA_CHECK(timeout_s > 0, "rendezvous: timeout ", timeout_s, " s must be positive");
}

std::string rendezvous_broadcast(const RendezvousOptions& o, const std::string& blob) {
  o.validate();
  const auto deadline = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  if (o.world_size() == 1) return blob;
  if (o.global_rank() == 0) {
    TESSERA_CHECK(blob.size() <= kMaxBlob, "rendezvous: a blob of ", blob.size(), " bytes (limit ", kMaxBlob, ")");
    return serve(o, blob, deadline);
  }
  return join(o, deadline);
}

}  // namespace tessera
