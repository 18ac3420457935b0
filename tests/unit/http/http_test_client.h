#pragma once
// A tiny blocking HTTP/1.1 client over plain POSIX sockets, independent of Beast, so the
// tests check the server's bytes against an implementation that shares no code with it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "server/http/exchange.h"

namespace tessera::http::test {

struct TestResponse {
  int status = 0;
  std::string status_line;
  std::vector<std::pair<std::string, std::string>> headers;  // names lowercased
  std::string body;                                          // de-chunked

  std::optional<std::string> header(std::string_view name) const {
    for (const auto& [k, v] : headers)
      if (k == name) return v;
    return std::nullopt;
  }
};

inline std::string to_lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

// Polls `done` until it holds or `limit` passes; for state that settles asynchronously
// (counters after a socket closes). Not a timing assertion: the limit is generous.
inline bool eventually(const std::function<bool()>& done,
                       std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return done();
}

inline int connect_loopback(uint16_t port, int receive_timeout_ms = 5000) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(std::string("connect: ") + std::strerror(err));
  }
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  timeval tv{receive_timeout_ms / 1000, (receive_timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}

class TestConn {
 public:
  explicit TestConn(uint16_t port, int receive_timeout_ms = 5000) : fd_(connect_loopback(port, receive_timeout_ms)) {}
  ~TestConn() { close(); }
  TestConn(const TestConn&) = delete;
  TestConn& operator=(const TestConn&) = delete;

  int fd() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Closes with a reset instead of a FIN (SO_LINGER 0).
  void reset() {
    linger l{1, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
    close();
  }

  // False when the peer has closed or reset (a send error, not an exception).
  bool send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      data.remove_prefix(static_cast<size_t>(n));
    }
    return true;
  }

  // Status line and headers; nullopt if the connection ends first.
  std::optional<TestResponse> read_head() {
    size_t end;
    while ((end = buf_.find("\r\n\r\n")) == std::string::npos)
      if (!fill()) return std::nullopt;
    TestResponse r;
    std::string_view head(buf_.data(), end);
    const size_t eol = head.find("\r\n");
    r.status_line = std::string(head.substr(0, eol));
    if (r.status_line.size() >= 12) r.status = std::stoi(r.status_line.substr(9, 3));
    size_t pos = eol == std::string_view::npos ? head.size() : eol + 2;
    while (pos < head.size()) {
      size_t next = head.find("\r\n", pos);
      if (next == std::string_view::npos) next = head.size();
      const std::string_view line = head.substr(pos, next - pos);
      const size_t colon = line.find(':');
      std::string value(line.substr(colon + 1));
      while (!value.empty() && value.front() == ' ') value.erase(value.begin());
      r.headers.emplace_back(to_lower(std::string(line.substr(0, colon))), value);
      pos = next + 2;
    }
    buf_.erase(0, end + 4);
    return r;
  }

  // A whole response. `head_request`: no body follows whatever the headers say.
  std::optional<TestResponse> read_response(bool head_request = false) {
    auto r = read_head();
    if (!r) return std::nullopt;
    if (r->status == 100) return read_response(head_request);  // interim
    if (head_request || r->status == 204 || r->status == 304) return r;
    if (auto te = r->header("transfer-encoding"); te && to_lower(*te) == "chunked") {
      for (;;) {
        auto chunk = read_chunk();
        if (!chunk) return std::nullopt;
        if (chunk->empty()) break;
        r->body += *chunk;
      }
    } else if (auto cl = r->header("content-length")) {
      const size_t n = std::stoul(*cl);
      while (buf_.size() < n)
        if (!fill()) return std::nullopt;
      r->body = buf_.substr(0, n);
      buf_.erase(0, n);
    } else {
      while (fill()) {
      }
      r->body = std::move(buf_);
      buf_.clear();
    }
    return r;
  }

  // The next chunk's data ("" for the last chunk, trailers skipped); nullopt on EOF.
  std::optional<std::string> read_chunk() {
    size_t eol;
    while ((eol = buf_.find("\r\n")) == std::string::npos)
      if (!fill()) return std::nullopt;
    const size_t size = std::stoul(buf_.substr(0, eol), nullptr, 16);
    if (size == 0) {
      size_t end;
      while ((end = buf_.find("\r\n", eol + 2)) == std::string::npos)
        if (!fill()) return std::nullopt;
      buf_.erase(0, end + 2);
      return std::string();
    }
    while (buf_.size() < eol + 2 + size + 2)
      if (!fill()) return std::nullopt;
    std::string data = buf_.substr(eol + 2, size);
    buf_.erase(0, eol + 2 + size + 2);
    return data;
  }

  // Everything until the peer closes.
  std::string read_to_close() {
    while (fill()) {
      if (buf_.size() > (64u << 20)) break;
    }
    std::string all = std::move(buf_);
    buf_.clear();
    return all;
  }

  // True when the peer closes (EOF or reset) before the receive timeout, with nothing
  // else unread in between beyond what `allow_bytes` permits.
  bool peer_closed(bool allow_bytes = false) {
    if (!buf_.empty() && !allow_bytes) return false;
    char c[4096];
    for (;;) {
      const ssize_t n = ::recv(fd_, c, sizeof c, 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET || errno == EPIPE;
      if (!allow_bytes) return false;
    }
  }

  std::string& buffer() { return buf_; }

 private:
  bool fill() {
    char tmp[16384];
    const ssize_t n = ::recv(fd_, tmp, sizeof tmp, 0);
    if (n <= 0) return false;
    buf_.append(tmp, static_cast<size_t>(n));
    return true;
  }

  int fd_;
  std::string buf_;
};

inline std::string get_request(std::string_view path, std::string_view extra_headers = "") {
  return "GET " + std::string(path) + " HTTP/1.1\r\nHost: test\r\n" + std::string(extra_headers) + "\r\n";
}

inline std::string post_request(std::string_view path, std::string_view body, std::string_view extra_headers = "") {
  return "POST " + std::string(path) +
         " HTTP/1.1\r\nHost: test\r\nContent-Type: "
         "application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n" + std::string(extra_headers) + "\r\n" + std::string(body);
}

// Options of a test server: any free port, 2 I/O threads, timeouts a loaded CI machine meets.
inline ServerOptions test_server_options() {
  using namespace std::chrono_literals;
  ServerOptions o;
  o.port = 0;
  o.io_threads = 2;
  o.read_timeout = 3000ms;
  o.write_timeout = 3000ms;
  o.keep_alive_timeout = 5000ms;
  return o;
}

}  // namespace tessera::http::test
