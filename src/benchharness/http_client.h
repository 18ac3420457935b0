#pragma once
// A small HTTP/1.1 client on Boost.Beast for the load generator: an asynchronous streaming
// POST (one connection per request, no thread per request; all calls share one io_context)
// that timestamps the first response byte and every server-sent event, and a blocking POST
// for set-up calls such as /tokenize. Plain HTTP only.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "benchharness/sse.h"

namespace tessera::bench {

using Clock = std::chrono::steady_clock;

// "http://host:port[/prefix]". A trailing "/v1" is dropped, because endpoint paths already
// start with /v1 (vLLM's --base-url convention).
struct Endpoint {
  std::string host;
  std::string port = "80";
  std::string prefix;  // path prefix without trailing '/', e.g. "" or "/proxy"
  static Endpoint parse(const std::string& base_url);
  std::string url() const;
};

struct StreamResult {
  int http_status = 0;                                 // 0: no response (connect error, timeout)
  std::string error;                                   // empty on success; otherwise what went wrong
  Clock::time_point start;                             // before connecting
  Clock::time_point first_byte;                        // first response byte read (== start when none)
  Clock::time_point end;                               // stream complete or failed
  std::vector<Clock::time_point> token_times;          // each event whose text is not empty
  std::string text;                                    // the concatenated generated text
  int64_t prompt_tokens = -1, completion_tokens = -1;  // from "usage", when sent
  double queue_ms = -1;                                // from "timings.queue_ms", when sent
  int n_events = 0;                                    // data events received
  bool saw_done = false;                               // "[DONE]" received
  std::string finish_reason;
};

struct StreamRequest {
  std::string path;     // e.g. "/v1/chat/completions" (the endpoint's prefix is added)
  std::string body;     // JSON
  std::string api_key;  // sent as "Authorization: Bearer ..." when not empty
  double timeout_s = 600;
  std::function<void()> on_token;  // runs on the io_context for every chunk with text (progress)
};

// Starts one streaming POST on `io`; `done` runs on `io` exactly once. `resolved` is the
// endpoint's address list (resolve once, then reuse).
void start_streaming_post(boost::asio::io_context& io, const Endpoint& endpoint,
                          const boost::asio::ip::tcp::resolver::results_type& resolved, StreamRequest request,
                          std::function<void(StreamResult)> done);

// Blocking POST of a JSON body; returns the status and the response body. Throws
// tessera::Error when the server cannot be reached.
struct HttpReply {
  int status = 0;
  std::string body;
};
HttpReply http_post_json(const Endpoint& endpoint, const std::string& path, const std::string& body,
                         const std::string& api_key = "", double timeout_s = 30);
// Blocking GET (e.g. /v1/models).
HttpReply http_get(const Endpoint& endpoint, const std::string& path, const std::string& api_key = "",
                   double timeout_s = 30);

// The message of an OpenAI-style error body ({"error": {"message": ...}}), or the body
// itself cut to 200 bytes.
std::string error_message_of(const std::string& body);

}  // namespace tessera::bench
