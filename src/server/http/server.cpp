#include "server/http/server.h"

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "server/http/connection.h"
#include "server/http/exchange_impl.h"
#include "server/http/server_state.h"
#include "server/http/wire.h"

namespace tessera::http {

namespace asio = boost::asio;
using boost::system::error_code;
using tcp = asio::ip::tcp;
using detail::Connection;

struct HttpServer::Impl {
  Impl(ServerOptions options, Handler handler)
      : state(std::make_shared<detail::ServerState>(std::move(options), std::move(handler))),
        io_context(std::max(1, state->options.io_threads)),
        work(asio::make_work_guard(io_context)),
        acceptor(asio::make_strand(io_context)),
        accept_retry(acceptor.get_executor()) {
    state->io_context = &io_context;
  }

  void bind();
  void accept_next();
  void on_accept(const error_code& ec, tcp::socket socket);
  void refuse(tcp::socket& socket);
  void close_acceptor();

  std::shared_ptr<detail::ServerState> state;
  // Declared before everything that uses it, so it is destroyed last.
  asio::io_context io_context;
  // Keeps run() going while nothing is pending (no listener, no connections); released
  // by stop() once everything is closed.
  asio::executor_work_guard<asio::io_context::executor_type> work;
  tcp::acceptor acceptor;
  asio::steady_timer accept_retry;  // backs off when accept() fails (out of descriptors)
  std::vector<std::thread> threads;
  uint16_t port = 0;
  std::mutex lifecycle_mutex;  // start / stop
  bool started = false;
  bool stopped = false;
};

void HttpServer::Impl::bind() {
  const auto& options = state->options;
  const std::string where = options.host + ":" + std::to_string(options.port);
  error_code ec;
  tcp::resolver resolver(io_context);
  const auto endpoints = resolver.resolve(options.host, std::to_string(options.port),
                                          tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec) fail("cannot listen on ", where, ": cannot resolve host: ", ec.message());
  std::string last_error = "no address";
  for (const auto& entry : endpoints) {
    const tcp::endpoint endpoint = entry.endpoint();
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (!ec) {
      port = acceptor.local_endpoint().port();
      return;
    }
    last_error = ec.message();
    error_code ignored;
    acceptor.close(ignored);
  }
  fail("cannot listen on ", where, ": ", last_error);
}

void HttpServer::Impl::accept_next() {
  acceptor.async_accept(asio::make_strand(io_context),
                        [this](const error_code& ec, tcp::socket socket) { on_accept(ec, std::move(socket)); });
}

void HttpServer::Impl::on_accept(const error_code& ec, tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
  if (ec) {
    // Out of descriptors (or similar): wait a little instead of spinning on accept().
    accept_retry.expires_after(std::chrono::milliseconds(50));
    accept_retry.async_wait([this](const error_code& wait_ec) {
      if (!wait_ec && acceptor.is_open()) accept_next();
    });
    return;
  }
  accept_next();
  if (state->stopping.load() ||
      state->open_connections.load() >= static_cast<size_t>(std::max(0, state->options.max_connections))) {
    refuse(socket);
    return;
  }
  state->accepted.fetch_add(1);
  state->open_connections.fetch_add(1);
  auto connection = std::make_shared<Connection>(std::move(socket), state);
  {
    std::lock_guard lock(state->registry_mutex);
    state->registry.emplace(connection.get(), connection);
  }
  asio::post(connection->executor(), [connection] { connection->start(); });
}

// Over max_connections: a best-effort 503 without blocking, then close.
void HttpServer::Impl::refuse(tcp::socket& socket) {
  state->refused.fetch_add(1);
  Response response = error_response(503, "the server has too many open connections");
  wire::Head head;
  head.status = 503;
  head.content_type = response.content_type;
  head.content_length = response.body.size();
  head.persistence = wire::Persistence::Close;
  const std::string bytes = wire::format_head(head) + response.body;
  error_code ec;
  socket.non_blocking(true, ec);
  if (!ec) socket.write_some(asio::buffer(bytes), ec);
  socket.shutdown(tcp::socket::shutdown_both, ec);
  socket.close(ec);
}

void HttpServer::Impl::close_acceptor() {
  error_code ec;
  acceptor.close(ec);
  accept_retry.cancel();
}

HttpServer::HttpServer(ServerOptions options, Handler handler) {
  TESSERA_CHECK(handler, "HttpServer needs a handler");
  TESSERA_CHECK(options.io_threads >= 1, "HttpServer io_threads must be at least 1, got ", options.io_threads);
  impl_ = std::make_unique<Impl>(std::move(options), std::move(handler));
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  std::lock_guard lock(impl_->lifecycle_mutex);
  TESSERA_CHECK(!impl_->started, "HttpServer::start() called twice");
  impl_->bind();
  impl_->started = true;
  impl_->accept_next();
  for (int i = 0; i < impl_->state->options.io_threads; ++i)
    impl_->threads.emplace_back([this] { impl_->io_context.run(); });
}

uint16_t HttpServer::port() const { return impl_->port; }

void HttpServer::stop_accepting() {
  impl_->state->draining.store(true);
  {
    std::lock_guard lock(impl_->lifecycle_mutex);
    if (!impl_->started || impl_->stopped) return;
  }
  auto closed = std::make_shared<std::promise<void>>();
  auto done = closed->get_future();
  asio::post(impl_->acceptor.get_executor(), [impl = impl_.get(), closed] {
    impl->close_acceptor();
    closed->set_value();
  });
  if (!impl_->io_context.get_executor().running_in_this_thread()) done.wait();
}

void HttpServer::stop() {
  std::lock_guard lock(impl_->lifecycle_mutex);
  if (!impl_->started || impl_->stopped) return;
  TESSERA_CHECK(!impl_->io_context.get_executor().running_in_this_thread(),
                "HttpServer::stop() called from one of its own I/O threads");
  impl_->stopped = true;
  auto& state = *impl_->state;
  state.stopping.store(true);
  state.draining.store(true);

  // 1. No new connections (an accept already completed is refused in on_accept).
  {
    std::promise<void> closed;
    asio::post(impl_->acceptor.get_executor(), [this, &closed] {
      impl_->close_acceptor();
      closed.set_value();
    });
    closed.get_future().wait();
  }

  // 2. Close every connection on its own strand, which abandons its exchange there, and
  //    wait until all of them have.
  std::vector<std::shared_ptr<Connection>> open;
  {
    std::lock_guard registry_lock(state.registry_mutex);
    for (auto& [key, connection] : state.registry) open.push_back(connection);
  }
  std::mutex mutex;
  std::condition_variable cv;
  size_t left = open.size();
  for (auto& connection : open) {
    asio::post(connection->executor(), [connection, &mutex, &cv, &left] {
      connection->close("server stopping");
      std::lock_guard done_lock(mutex);
      if (--left == 0) cv.notify_all();
    });
  }
  {
    std::unique_lock done_lock(mutex);
    cv.wait(done_lock, [&] { return left == 0; });
  }
  open.clear();

  // 3. Close the gate: exchange calls from other threads stop reaching the io_context.
  {
    std::unique_lock gate(state.gate);
    state.open = false;
  }

  // 4. What is still queued finishes (cancelled I/O, last drains); then run() returns.
  impl_->work.reset();
  for (auto& thread : impl_->threads) thread.join();
  impl_->threads.clear();
}

size_t HttpServer::open_connections() const { return impl_->state->open_connections.load(); }

ServerCounters HttpServer::counters() const {
  const auto& s = *impl_->state;
  ServerCounters c;
  c.open_connections = s.open_connections.load();
  c.live_connections = s.live_connections.load();
  c.live_exchanges = s.live_exchanges.load();
  c.answering = s.answering.load();
  c.accepted = s.accepted.load();
  c.refused = s.refused.load();
  c.requests = s.requests.load();
  c.rejected = s.rejected.load();
  c.abandoned = s.abandoned.load();
  c.read_timeouts = s.read_timeouts.load();
  c.write_timeouts = s.write_timeouts.load();
  return c;
}

}  // namespace tessera::http
