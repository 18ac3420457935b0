#pragma once
// The router's HTTP/1.1 client to its workers (Boost.Beast on a private io_context): one
// connection per call, the response handed over as it arrives (head, then body pieces), so a
// streamed answer passes through chunk by chunk. Plain HTTP only. Every step has a deadline
// (connect; then each write or read must make progress within the idle timeout), and a call
// can be cancelled (the client went away), which closes the connection: the worker sees its
// client leave and aborts the request.
//
// Why not src/benchharness/http_client: that layer sits above the server (cmake/layers.cmake)
// and parses the answer as the load generator's events; the router needs raw passthrough.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/http/exchange.h"

namespace tessera::router {

// "http://host:port[/prefix]" (a trailing '/' or "/v1" is dropped: paths start with /v1).
struct UpstreamUrl {
  std::string host;
  std::string port = "80";
  std::string prefix;
  std::string text;  // "http://host:port[/prefix]", for messages and metric labels
  // Throws tessera::Error naming the URL and what is wrong with it.
  static UpstreamUrl parse(const std::string& url);
};

struct UpstreamRequest {
  std::string method = "POST";
  std::string path;       // "/v1/completions"; the URL's prefix is put before it
  std::string body;       // JSON
  http::Headers headers;  // sent as they are (Authorization, X-Request-Id...)
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds idle_timeout{600000};
};

// Called on the client's thread, in order: on_head once when the status line and headers are
// in, on_data for each piece of the body, on_done exactly once ("" when the whole response
// arrived, else what failed: "connecting to http://...: Connection refused", "timed out").
struct UpstreamHandlers {
  std::function<void(int status, std::string content_type)> on_head;
  std::function<void(std::string data)> on_data;
  std::function<void(std::string error)> on_done;
};

class UpstreamCall {
 public:
  virtual ~UpstreamCall() = default;
  // Thread-safe: closes the connection; on_done follows with "cancelled" (unless done).
  virtual void cancel() = 0;
};

class UpstreamClient {
 public:
  explicit UpstreamClient(int threads = 1);
  // Stops the threads: calls still running are dropped (their handlers destroyed, no on_done).
  ~UpstreamClient();
  UpstreamClient(const UpstreamClient&) = delete;
  UpstreamClient& operator=(const UpstreamClient&) = delete;

  std::shared_ptr<UpstreamCall> start(const UpstreamUrl& url, UpstreamRequest request, UpstreamHandlers handlers);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera::router
