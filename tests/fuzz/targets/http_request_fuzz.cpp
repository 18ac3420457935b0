// HTTP request parsing, through the real transport (src/server/http: Beast's parser plus the
// server's own header checks, chunked bodies, pipelining, 100-continue, keep-alive): the
// input goes to an in-process HttpServer over loopback, the client half-closes, and reads
// until the server closes. Findings: a crash or sanitizer report in the server, a reply that
// is not HTTP/1.x, a 500 (the handler never throws), or a connection the server neither
// answers nor closes within 5 s.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "server/http/server.h"

namespace {
using tessera::http::Exchange;

// Echoes what the transport parsed, so the parsed fields are read (ASan sees them); /stream
// answers with server-sent events, /deny is refused by the header filter before its body.
void handle(std::shared_ptr<Exchange> ex) {
  const tessera::http::Request& r = ex->request();
  if (r.path == "/stream") {
    ex->start_stream();
    ex->write("data: " + r.method + "\n\n");
    ex->write("data: " + std::to_string(r.body.size()) + "\n\n");
    ex->end_stream();
    return;
  }
  tessera::http::Response resp;
  resp.content_type = "text/plain";
  resp.body = r.method + " " + r.path + "?" + r.query + " " + std::to_string(r.headers.size()) + " " +
              std::to_string(r.body.size());
  ex->respond(std::move(resp));
}

tessera::http::HttpServer& server() {
  static tessera::http::HttpServer* s = [] {
    tessera::http::ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.io_threads = 1;
    o.max_body_bytes = 4096;  // small limits, so inputs reach them
    o.max_header_bytes = 2048;
    o.max_header_count = 20;
    o.read_timeout = std::chrono::milliseconds(2000);
    o.keep_alive_timeout = std::chrono::milliseconds(2000);
    o.header_filter = [](const tessera::http::Request& r) -> std::optional<tessera::http::Response> {
      if (r.path == "/deny") return tessera::http::error_response(401, "denied");
      return std::nullopt;
    };
    auto* srv = new tessera::http::HttpServer(o, handle);  // lives for the whole run
    srv->start();
    return srv;
  }();
  return *s;
}

// A fresh source address every 60000 connections: loopback TIME_WAIT would otherwise use up
// the ephemeral ports of 127.0.0.1 within a minute of fuzzing.
int connect_client(uint16_t port) {
  static uint32_t n = 0;
  const uint32_t source_host = 0x7f000100u + (n++ / 60000) % 0xfe00u;  // 127.0.1.0 and up
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(source_host);
  if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0) {
    close(fd);
    return -1;
  }
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(port);
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  return fd;
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  server();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 16 * 1024) return 0;
  const int fd = connect_client(server().port());
  if (fd < 0) {
    std::perror("fuzz: connect");
    return 0;  // the machine, not the server
  }
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may answer and close before reading everything
    sent += static_cast<size_t>(n);
  }
  shutdown(fd, SHUT_WR);
  std::string reply;
  char buf[8192];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        std::fprintf(stderr, "fuzz: the server neither answered nor closed within 5 s\n");
        __builtin_trap();
      }
      break;  // reset by the server: allowed after an error response
    }
    reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  if (!reply.empty() && reply.rfind("HTTP/1.", 0) != 0) __builtin_trap();
  if (reply.find("HTTP/1.1 500 ") != std::string::npos || reply.find("HTTP/1.0 500 ") != std::string::npos)
    __builtin_trap();
  return 0;
}
