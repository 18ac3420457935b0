#include "server/router/upstream.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <limits>
#include <optional>

#include "core/error.h"

namespace tessera::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

UpstreamUrl UpstreamUrl::parse(const std::string& url) {
  constexpr std::string_view kScheme = "http://";
  TESSERA_CHECK(url.starts_with(kScheme), "worker URL '", url, "' must start with http:// (https is not supported)");
  std::string rest = url.substr(kScheme.size());
  UpstreamUrl u;
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    u.prefix = rest.substr(slash);
    rest.resize(slash);
  }
  while (!u.prefix.empty() && u.prefix.back() == '/') u.prefix.pop_back();
  if (u.prefix.ends_with("/v1")) u.prefix.resize(u.prefix.size() - 3);
  const size_t colon = rest.rfind(':');
  const bool bracketed = !rest.empty() && rest.front() == '[';
  if (colon != std::string::npos && (!bracketed || colon > rest.find(']'))) {
    u.port = rest.substr(colon + 1);
    rest.resize(colon);
    TESSERA_CHECK(!u.port.empty() && u.port.size() <= 5 &&
                      u.port.find_first_not_of("0123456789") == std::string::npos && std::stoi(u.port) >= 1 &&
                      std::stoi(u.port) <= 65535,
                  "worker URL '", url, "': the port '", u.port, "' is not a number in 1..65535");
  }
  if (bracketed && rest.size() > 2 && rest.back() == ']') rest = rest.substr(1, rest.size() - 2);
  TESSERA_CHECK(!rest.empty(), "worker URL '", url, "' names no host");
  u.host = rest;
  u.text = "http://" + (u.host.find(':') != std::string::npos ? "[" + u.host + "]" : u.host) + ":" + u.port + u.prefix;
  return u;
}

namespace {

class Call final : public UpstreamCall, public std::enable_shared_from_this<Call> {
 public:
  Call(asio::io_context& io, UpstreamUrl url, UpstreamRequest request, UpstreamHandlers handlers)
      : strand_(asio::make_strand(io)),
        resolver_(strand_),
        stream_(strand_),
        url_(std::move(url)),
        request_(std::move(request)),
        handlers_(std::move(handlers)) {}

  void run() {
    auto self = shared_from_this();
    asio::post(strand_, [self] {
      if (self->done_) return;
      self->resolver_.async_resolve(self->url_.host, self->url_.port,
                                    [self](beast::error_code ec, tcp::resolver::results_type found) {
                                      if (ec) return self->finish("resolving " + self->url_.host + ": " + ec.message());
                                      self->connect(found);
                                    });
    });
  }

  void cancel() override {
    auto self = shared_from_this();
    asio::post(strand_, [self] {
      self->resolver_.cancel();
      beast::error_code ignored;
      self->stream_.socket().close(ignored);
      self->finish("cancelled");
    });
  }

 private:
  void connect(const tcp::resolver::results_type& found) {
    auto self = shared_from_this();
    stream_.expires_after(request_.connect_timeout);
    stream_.async_connect(found, [self](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->finish("connecting to " + self->url_.text + ": " + self->describe(ec));
      self->send();
    });
  }

  void send() {
    req_.emplace(request_.method == "GET" ? bhttp::verb::get : bhttp::verb::post, url_.prefix + request_.path, 11);
    req_->set(bhttp::field::host, url_.host + ":" + url_.port);
    for (const auto& [name, value] : request_.headers) req_->set(name, value);
    if (req_->method() == bhttp::verb::post) {
      req_->set(bhttp::field::content_type, "application/json");
      req_->body() = std::move(request_.body);
    }
    req_->prepare_payload();
    auto self = shared_from_this();
    stream_.expires_after(request_.idle_timeout);
    bhttp::async_write(stream_, *req_, [self](beast::error_code ec, size_t) {
      if (ec) return self->finish("sending to " + self->url_.text + ": " + self->describe(ec));
      self->read_head();
    });
  }

  void read_head() {
    // A worker's answer is bounded by its own limits. Not boost::none: this Beast compares a
    // Content-Length with the optional directly, and any length is "greater" than none.
    parser_.body_limit(std::numeric_limits<std::uint64_t>::max());
    auto self = shared_from_this();
    stream_.expires_after(request_.idle_timeout);
    bhttp::async_read_header(stream_, buffer_, parser_, [self](beast::error_code ec, size_t) {
      if (ec) return self->finish("reading the answer of " + self->url_.text + ": " + self->describe(ec));
      const auto& head = self->parser_.get();
      if (self->handlers_.on_head)
        self->handlers_.on_head(static_cast<int>(head.result_int()), std::string(head[bhttp::field::content_type]));
      self->read_body();
    });
  }

  void read_body() {
    if (parser_.is_done()) return finish("");
    parser_.get().body().data = chunk_;
    parser_.get().body().size = sizeof chunk_;
    auto self = shared_from_this();
    stream_.expires_after(request_.idle_timeout);
    bhttp::async_read_some(stream_, buffer_, parser_, [self](beast::error_code ec, size_t) {
      if (ec == bhttp::error::need_buffer) ec = {};  // the piece filled chunk_
      const size_t n = sizeof self->chunk_ - self->parser_.get().body().size;
      if (n > 0 && !self->done_ && self->handlers_.on_data) self->handlers_.on_data(std::string(self->chunk_, n));
      if (ec) return self->finish("reading the answer of " + self->url_.text + ": " + self->describe(ec));
      self->read_body();
    });
  }

  std::string describe(const beast::error_code& ec) const {
    return ec == beast::error::timeout ? "timed out" : ec.message();
  }

  void finish(const std::string& error) {
    if (done_) return;
    done_ = true;
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
    if (handlers_.on_done) handlers_.on_done(error);
    handlers_ = {};  // they may hold the call: break the cycle
  }

  asio::strand<asio::io_context::executor_type> strand_;
  tcp::resolver resolver_;
  beast::tcp_stream stream_;
  UpstreamUrl url_;
  UpstreamRequest request_;
  UpstreamHandlers handlers_;
  std::optional<bhttp::request<bhttp::string_body>> req_;
  beast::flat_buffer buffer_;
  bhttp::response_parser<bhttp::buffer_body> parser_;
  char chunk_[16384];
  bool done_ = false;  // on the strand only
};

}  // namespace

struct UpstreamClient::Impl {
  asio::io_context io;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(io);
  std::vector<std::thread> threads;
};

UpstreamClient::UpstreamClient(int threads) : impl_(std::make_unique<Impl>()) {
  TESSERA_CHECK(threads >= 1, "router: at least one client thread, not ", threads);
  for (int i = 0; i < threads; ++i) impl_->threads.emplace_back([this] { impl_->io.run(); });
}

UpstreamClient::~UpstreamClient() {
  impl_->work.reset();
  impl_->io.stop();
  for (std::thread& t : impl_->threads) t.join();
}

std::shared_ptr<UpstreamCall> UpstreamClient::start(const UpstreamUrl& url, UpstreamRequest request,
                                                    UpstreamHandlers handlers) {
  auto call = std::make_shared<Call>(impl_->io, url, std::move(request), std::move(handlers));
  call->run();
  return call;
}

}  // namespace tessera::router
