#include "benchharness/http_client.h"

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessera::bench {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

Endpoint Endpoint::parse(const std::string& base_url) {
  std::string rest = base_url;
  const std::string scheme = "http://";
  if (rest.rfind("https://", 0) == 0) fail("--base-url '", base_url, "': https is not supported (plain HTTP only)");
  if (rest.rfind(scheme, 0) == 0) rest = rest.substr(scheme.size());
  Endpoint e;
  const size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  e.prefix = slash == std::string::npos ? "" : rest.substr(slash);
  while (!e.prefix.empty() && e.prefix.back() == '/') e.prefix.pop_back();
  if (e.prefix.size() >= 3 && e.prefix.compare(e.prefix.size() - 3, 3, "/v1") == 0)
    e.prefix.resize(e.prefix.size() - 3);
  const size_t colon = authority.rfind(':');
  if (colon != std::string::npos && authority.find(']') == std::string::npos) {
    e.host = authority.substr(0, colon);
    e.port = authority.substr(colon + 1);
  } else {
    e.host = authority;
  }
  TESSERA_CHECK(!e.host.empty(), "--base-url '", base_url, "' has no host");
  TESSERA_CHECK(!e.port.empty() && e.port.find_first_not_of("0123456789") == std::string::npos, "--base-url '",
                base_url, "' has a bad port '", e.port, "'");
  return e;
}

std::string Endpoint::url() const { return "http://" + host + ":" + port + prefix; }

std::string error_message_of(const std::string& body) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_discarded() && j.is_object()) {
    if (const auto e = j.find("error"); e != j.end()) {
      if (e->is_object() && e->contains("message") && (*e)["message"].is_string()) return (*e)["message"];
      if (e->is_string()) return *e;
    }
    if (const auto d = j.find("detail"); d != j.end() && d->is_string()) return *d;  // FastAPI
  }
  return body.substr(0, 200);
}

namespace {

// One streaming request: connect, send, read the first byte, the header, then the body
// piece by piece (http::async_read_some returns as soon as bytes arrive, so each piece is
// timestamped when it came in).
class StreamingCall : public std::enable_shared_from_this<StreamingCall> {
 public:
  StreamingCall(asio::io_context& io, const Endpoint& ep, StreamRequest req, std::function<void(StreamResult)> done)
      : stream_(io),
        request_(std::move(req)),
        done_(std::move(done)),
        sse_([this](std::string_view data) { on_event(data); }) {
    http_req_.method(http::verb::post);
    http_req_.target(ep.prefix + request_.path);
    http_req_.version(11);
    http_req_.set(http::field::host, ep.host + ":" + ep.port);
    http_req_.set(http::field::user_agent, "tessera-bench");
    http_req_.set(http::field::content_type, "application/json");
    http_req_.set(http::field::accept, "text/event-stream");
    if (!request_.api_key.empty()) http_req_.set(http::field::authorization, "Bearer " + request_.api_key);
    http_req_.body() = request_.body;
    http_req_.prepare_payload();
    // No limit. Not boost::none: Boost 1.74 compares "length > body_limit" with an optional,
    // and any length is greater than none.
    header_parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
  }

  void start(const tcp::resolver::results_type& resolved) {
    result_.start = Clock::now();
    deadline_ =
        result_.start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(request_.timeout_s));
    arm();
    stream_.async_connect(resolved, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->finish("connect: " + ec.message());
      self->arm();
      http::async_write(self->stream_, self->http_req_, [self](beast::error_code ec, size_t) {
        if (ec) return self->finish("send: " + ec.message());
        self->read_first_byte();
      });
    });
  }

 private:
  void arm() { stream_.expires_at(deadline_); }

  void read_first_byte() {
    arm();
    auto buf = buffer_.prepare(4096);
    stream_.async_read_some(buf, [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (ec) return self->finish("read: " + ec.message());
      self->result_.first_byte = Clock::now();
      self->buffer_.commit(n);
      self->read_header();
    });
  }

  void read_header() {
    arm();
    http::async_read_header(stream_, buffer_, header_parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->finish("read header: " + ec.message());
                              self->result_.http_status = static_cast<int>(self->header_parser_.get().result_int());
                              // Same parser state, now with a body that hands us each piece as it arrives.
                              if (self->header_parser_.is_done())
                                return self->finish("");  // no body (e.g. Content-Length: 0)
                              self->body_parser_.emplace(std::move(self->header_parser_));
                              self->body_parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
                              self->read_body();
                            });
  }

  void read_body() {
    auto& body = body_parser_->get().body();
    body.data = chunk_;
    body.size = sizeof(chunk_);
    arm();
    http::async_read_some(stream_, buffer_, *body_parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return self->finish("read body: " + ec.message());
      const auto now = Clock::now();
      const size_t n = sizeof(self->chunk_) - self->body_parser_->get().body().size;
      self->piece_time_ = now;
      if (self->result_.http_status == 200)
        self->sse_.feed(std::string_view(self->chunk_, n));
      else
        self->error_body_.append(self->chunk_, n);
      if (self->body_parser_->is_done()) return self->finish("");
      self->read_body();
    });
  }

  void on_event(std::string_view data) {
    ++result_.n_events;
    const ChunkInfo c = parse_openai_chunk(data);
    if (c.done) {
      result_.saw_done = true;
      return;
    }
    if (!c.error.empty() && stream_error_.empty()) stream_error_ = c.error;
    if (!c.text.empty()) {
      result_.token_times.push_back(piece_time_);
      result_.text += c.text;
      if (request_.on_token) request_.on_token();
    }
    if (c.prompt_tokens >= 0) result_.prompt_tokens = c.prompt_tokens;
    if (c.completion_tokens >= 0) result_.completion_tokens = c.completion_tokens;
    if (c.queue_ms >= 0) result_.queue_ms = c.queue_ms;
    if (!c.finish_reason.empty()) result_.finish_reason = c.finish_reason;
  }

  void finish(std::string error) {
    if (finished_) return;
    finished_ = true;
    result_.end = Clock::now();
    if (result_.first_byte == Clock::time_point{}) result_.first_byte = result_.start;
    if (error.empty()) {
      if (result_.http_status != 200) {
        error = "HTTP " + std::to_string(result_.http_status) + ": " + error_message_of(error_body_);
      } else if (!stream_error_.empty()) {
        error = "stream error: " + stream_error_;
      } else if (!result_.saw_done && result_.finish_reason.empty()) {
        error = "stream ended without [DONE] or a finish_reason";
      }
    } else if (error.find("timed out") != std::string::npos || error.find("timeout") != std::string::npos) {
      error = "timeout after " + std::to_string(request_.timeout_s) + " s (" + error + ")";
    }
    result_.error = std::move(error);
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.close();
    done_(std::move(result_));
  }

  beast::tcp_stream stream_;
  StreamRequest request_;
  std::function<void(StreamResult)> done_;
  SseParser sse_;
  http::request<http::string_body> http_req_;
  beast::flat_buffer buffer_;
  http::response_parser<http::empty_body> header_parser_;
  std::optional<http::response_parser<http::buffer_body>> body_parser_;
  char chunk_[16384];
  Clock::time_point deadline_;
  Clock::time_point piece_time_;
  StreamResult result_;
  std::string error_body_;
  std::string stream_error_;
  bool finished_ = false;
};

}  // namespace

void start_streaming_post(asio::io_context& io, const Endpoint& endpoint, const tcp::resolver::results_type& resolved,
                          StreamRequest request, std::function<void(StreamResult)> done) {
  std::make_shared<StreamingCall>(io, endpoint, std::move(request), std::move(done))->start(resolved);
}

namespace {
HttpReply blocking_request(http::verb verb, const Endpoint& endpoint, const std::string& path, const std::string& body,
                           const std::string& api_key, double timeout_s) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  tcp::resolver resolver(io);
  beast::error_code ec;
  const auto resolved = resolver.resolve(endpoint.host, endpoint.port, ec);
  if (ec) fail("cannot resolve ", endpoint.host, ":", endpoint.port, ": ", ec.message());
  stream.expires_after(std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s)));
  stream.connect(resolved, ec);
  if (ec) fail("cannot connect to ", endpoint.url(), ": ", ec.message());
  http::request<http::string_body> req{verb, endpoint.prefix + path, 11};
  req.set(http::field::host, endpoint.host + ":" + endpoint.port);
  req.set(http::field::user_agent, "tessera-bench");
  if (verb == http::verb::post) req.set(http::field::content_type, "application/json");
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  req.body() = body;
  if (verb == http::verb::post) req.prepare_payload();
  http::write(stream, req, ec);
  const std::string what = std::string(http::to_string(verb)) + " " + endpoint.url() + path;
  if (ec) fail(what, ": ", ec.message());
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  http::read(stream, buffer, parser, ec);
  if (ec) fail(what, ": reading the reply: ", ec.message());
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  return {static_cast<int>(parser.get().result_int()), parser.get().body()};
}
}  // namespace

HttpReply http_post_json(const Endpoint& endpoint, const std::string& path, const std::string& body,
                         const std::string& api_key, double timeout_s) {
  return blocking_request(http::verb::post, endpoint, path, body, api_key, timeout_s);
}

HttpReply http_get(const Endpoint& endpoint, const std::string& path, const std::string& api_key, double timeout_s) {
  return blocking_request(http::verb::get, endpoint, path, "", api_key, timeout_s);
}

}  // namespace tessera::bench
