#include "server/http/connection.h"

#include <boost/asio/post.hpp>

#include <string_view>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <vector>

#include "server/http/exchange_impl.h"

namespace tessera::http::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using boost::system::error_code;
using tcp = asio::ip::tcp;

namespace {

// Bytes read per read_some, and what may wait unparsed beyond a full header (pipelined
// requests read ahead while a handler works).
// An idle or streaming connection always has a read pending, so its buffer is kept small;
// a body being uploaded is read in larger pieces.
constexpr size_t kReadChunk = 4 * 1024;
constexpr size_t kBodyReadChunk = 64 * 1024;
constexpr size_t kReadAhead = 64 * 1024;
// After the last response on a connection: how long to discard the peer's input.
constexpr std::chrono::milliseconds kMaxLinger{2000};
constexpr size_t kMaxBuffersPerWrite = 64;

std::string lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

bool iequals(std::string_view a, std::string_view b) { return lowercase(a) == lowercase(b); }

std::string_view sv(beast::string_view s) { return std::string_view(s.data(), s.size()); }

std::string endpoint_string(const tcp::socket& socket) {
  error_code ec;
  const auto endpoint = socket.remote_endpoint(ec);
  if (ec) return "unknown";
  const auto address = endpoint.address();
  const std::string host = address.is_v6() ? "[" + address.to_string() + "]" : address.to_string();
  return host + ":" + std::to_string(endpoint.port());
}

// The status for a parser error, and a message a client can act on.
std::pair<int, std::string> status_for_parse_error(const error_code& ec) {
  if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow)
    return {431, "request header fields too large"};
  if (ec == bhttp::error::body_limit) return {413, "request body too large"};
  if (ec == bhttp::error::bad_version) return {505, "HTTP version not supported"};
  if (ec == bhttp::error::bad_chunk || ec == bhttp::error::bad_chunk_extension)
    return {400, "malformed chunked body: " + ec.message()};
  if (ec == bhttp::error::bad_transfer_encoding)
    return {400, "malformed request: bad Transfer-Encoding (duplicated, or with Content-Length)"};
  if (ec == bhttp::error::bad_content_length)
    return {400,
            "malformed request: bad Content-Length (invalid, conflicting, or with "
            "Transfer-Encoding)"};
  return {400, "malformed request: " + ec.message()};
}

// Splits "path?query", accepting absolute-form targets ("http://host/path?q").
void split_target(std::string_view target, std::string& path, std::string& query) {
  for (std::string_view scheme : {"http://", "https://"}) {
    if (target.size() >= scheme.size() && iequals(target.substr(0, scheme.size()), scheme)) {
      const size_t slash = target.find_first_of("/?", scheme.size());
      target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
      break;
    }
  }
  const size_t q = target.find('?');
  path = std::string(target.substr(0, q));
  if (path.empty()) path = "/";
  query = q == std::string_view::npos ? std::string() : std::string(target.substr(q + 1));
}

}  // namespace

Connection::Connection(tcp::socket socket, std::shared_ptr<ServerState> state)
    : state_(std::move(state)),
      options_(state_->options),
      socket_(std::move(socket)),
      executor_(socket_.get_executor()),
      read_timer_(executor_),
      write_timer_(executor_),
      remote_(endpoint_string(socket_)),
      inbuf_(options_.max_header_bytes + kReadAhead) {
  state_->live_connections.fetch_add(1);
}

Connection::~Connection() { state_->live_connections.fetch_sub(1); }

void Connection::start() {
  if (phase_ == Phase::Closed) return;  // stop() got here first
  error_code ec;
  socket_.set_option(tcp::no_delay(true), ec);  // each SSE write goes out at once
  // A new connection must bring its first request within the read timeout.
  begin_request();
  arm_read_timer(options_.read_timeout);
  read_more();
}

// ---------------------------------------------------------------------------------------
// Reading

void Connection::begin_request() {
  set_phase(Phase::ReadRequest);
  parser_.emplace();
  parser_->header_limit(static_cast<std::uint32_t>(std::min<size_t>(options_.max_header_bytes, UINT32_MAX)));
  parser_->body_limit(static_cast<std::uint64_t>(options_.max_body_bytes));
  header_checked_ = false;
  pending_request_ = Request{};
  request_started_ = false;
}

void Connection::read_more() {
  if (reading_ || phase_ == Phase::Closed) return;
  const size_t room = inbuf_.max_size() - inbuf_.size();
  if (room == 0) {
    // While handling, the peer pipelined more than we buffer: stop reading until the
    // response is out. While reading a request, a line longer than the buffer.
    if (phase_ == Phase::ReadRequest) {
      if (parser_->is_header_done())
        reject(400, "malformed chunked body: chunk header line too long");
      else
        reject(431, "request header fields too large");
    }
    return;
  }
  reading_ = true;
  // Into a separate buffer: inbuf_ is parsed and consumed while the read is pending.
  const bool reading_body = phase_ == Phase::ReadRequest && parser_ && parser_->is_header_done();
  const size_t chunk = reading_body ? kBodyReadChunk : kReadChunk;
  if (readbuf_.size() != chunk) {
    readbuf_.assign(chunk, 0);
    readbuf_.shrink_to_fit();
  }
  socket_.async_read_some(asio::buffer(readbuf_.data(), std::min(room, chunk)),
                          [self = shared_from_this()](const error_code& ec, size_t n) { self->on_read(ec, n); });
}

void Connection::on_read(const error_code& ec, size_t n) {
  reading_ = false;
  if (phase_ == Phase::Closed) return;
  if (ec) {
    // EOF or reset: the peer is gone (a half-close counts too), in every phase. With a
    // write in flight, its completion decides: if that wrote the last byte of the
    // response, the exchange completed rather than being abandoned.
    if (writing_) {
      peer_gone_ = true;
      return;
    }
    close("peer closed the connection");
    return;
  }
  inbuf_.commit(asio::buffer_copy(inbuf_.prepare(n), asio::buffer(readbuf_.data(), n)));
  switch (phase_) {
    case Phase::ReadRequest:
      if (!request_started_) {
        request_started_ = true;
        arm_read_timer(options_.read_timeout);
      }
      parse();
      return;
    case Phase::Handling:
      read_more();  // keeps watching for the peer leaving; bytes wait for their turn
      return;
    case Phase::Lingering:
      inbuf_.consume(inbuf_.size());
      read_more();
      return;
    case Phase::Closed:
      return;
  }
}

namespace {
// Whether the request header (up to the first CRLF CRLF) has a line ending in a bare LF.
// Beast waits for CRLF CRLF and would sit on such a request until the read timeout; the
// contract answers 400 at once.
bool header_has_bare_lf(std::string_view data) {
  const size_t end = data.find("\r\n\r\n");
  const std::string_view head = data.substr(0, end);
  for (size_t i = head.find('\n'); i != std::string_view::npos; i = head.find('\n', i + 1))
    if (i == 0 || head[i - 1] != '\r') return true;
  return false;
}
}  // namespace

void Connection::parse() {
  while (phase_ == Phase::ReadRequest) {
    if (!parser_->is_header_done() && inbuf_.size() > 0) {
      const auto data = inbuf_.data();
      if (header_has_bare_lf(std::string_view(static_cast<const char*>(data.data()), data.size()))) {
        reject(400, "malformed line ending: a header line ends in a bare LF (lines end with CRLF)");
        return;
      }
    }
    if (parser_->is_header_done() && !header_checked_) {
      header_checked_ = true;
      if (!check_header()) return;
      parser_->eager(true);  // from here on, take all the body there is
    }
    if (parser_->is_done()) {
      dispatch();
      return;
    }
    if (inbuf_.size() == 0) {
      read_more();
      return;
    }
    error_code ec;
    const size_t used = parser_->put(inbuf_.data(), ec);
    inbuf_.consume(used);
    if (ec == bhttp::error::need_more) {
      read_more();
      return;
    }
    if (ec) {
      auto [status, message] = status_for_parse_error(ec);
      reject(status, std::move(message));
      return;
    }
  }
}

bool Connection::check_header() {
  const auto& message = parser_->get();
  const unsigned version = message.version();
  if (version < 10 || version >= 20) {
    reject(505, "HTTP version " + std::to_string(version / 10) + "." + std::to_string(version % 10) +
                    " not supported (HTTP/1.0 and 1.1 are)");
    return false;
  }
  http10_ = version == 10;

  size_t count = 0;
  size_t hosts = 0;
  for (const auto& field : message) {
    ++count;
    if (field.name() == bhttp::field::host) ++hosts;
  }
  if (count > options_.max_header_count) {
    reject(431, "too many header fields: " + std::to_string(count) + " (at most " +
                    std::to_string(options_.max_header_count) + ")");
    return false;
  }
  if (!http10_ && hosts != 1) {
    reject(400, hosts == 0 ? "missing Host header" : "more than one Host header");
    return false;
  }

  // Beast takes a request body only with Content-Length or a final "chunked"; any other
  // Transfer-Encoding would leave the body to be misread as the next request.
  const auto te = message.find(bhttp::field::transfer_encoding);
  if (te != message.end()) {
    if (!parser_->chunked()) {
      reject(400, "Transfer-Encoding must end with chunked");
      return false;
    }
    if (!iequals(sv(te->value()), "chunked")) {
      reject(501, "unsupported Transfer-Encoding '" + std::string(te->value()) + "' (only chunked)");
      return false;
    }
  }
  const bool has_length = message.find(bhttp::field::content_length) != message.end();
  const auto method = message.method();
  if (!has_length && !parser_->chunked() &&
      (method == bhttp::verb::post || method == bhttp::verb::put || method == bhttp::verb::patch)) {
    reject(411,
           "a " + std::string(message.method_string()) + " request needs Content-Length or chunked Transfer-Encoding");
    return false;
  }

  pending_request_.method = std::string(message.method_string());
  pending_request_.target = std::string(message.target());
  split_target(pending_request_.target, pending_request_.path, pending_request_.query);
  pending_request_.remote = remote_;
  pending_request_.headers.reserve(count);
  for (const auto& field : message)
    pending_request_.headers.emplace_back(lowercase(sv(field.name_string())), std::string(field.value()));

  if (options_.header_filter) {
    std::optional<Response> refusal;
    try {
      refusal = options_.header_filter(pending_request_);
    } catch (const std::exception& e) {
      refusal = error_response(500, std::string("header filter failed: ") + e.what());
    }
    if (refusal) {
      state_->rejected.fetch_add(1);
      // The body was never read, so the connection cannot carry another request.
      const bool body_pending = !parser_->is_done();
      keep_alive_ = !body_pending && message.keep_alive() && !state_->draining.load();
      head_request_ = method == bhttp::verb::head;
      send_final_response(std::move(*refusal), keep_alive_);
      return false;
    }
  }

  const auto expect = message.find(bhttp::field::expect);
  if (expect != message.end()) {
    if (!iequals(sv(expect->value()), "100-continue")) {
      reject(417, "unsupported Expect '" + std::string(expect->value()) + "'");
      return false;
    }
    if (!http10_ && !parser_->is_done()) queue("HTTP/1.1 100 Continue\r\n\r\n");
  }
  return true;
}

void Connection::dispatch() {
  auto message = parser_->release();
  parser_.reset();
  if (inbuf_.capacity() > 2 * kReadChunk) inbuf_.shrink_to_fit();  // after a large header
  Request request = std::move(pending_request_);
  request.body = std::move(message.body());
  request.received_at = std::chrono::steady_clock::now();

  keep_alive_ = message.keep_alive() && !state_->draining.load();
  head_request_ = message.method() == bhttp::verb::head;
  set_phase(Phase::Handling);
  ++read_timer_generation_;  // the handler may take as long as it needs
  read_timer_.cancel();
  reply_ = Reply::Waiting;
  ++sequence_;
  state_->requests.fetch_add(1);

  auto exchange = std::make_shared<ExchangeImpl>(std::move(request), weak_from_this(), sequence_, state_);
  current_ = exchange;
  read_more();  // notice a peer that leaves while the handler works
  try {
    state_->handler(exchange);
  } catch (const std::exception& e) {
    exchange->respond(error_response(500, e.what()));  // ignored if it had answered
  } catch (...) {
    exchange->respond(error_response(500, "the request handler failed"));
  }
}

void Connection::reject(int status, std::string message) {
  state_->rejected.fetch_add(1);
  keep_alive_ = false;  // what follows the bad bytes cannot be trusted
  head_request_ = false;
  send_final_response(error_response(status, message), false);
}

// A response from the transport itself (no exchange): errors and filter refusals.
void Connection::send_final_response(Response response, bool keep_alive) {
  set_phase(Phase::Handling);
  ++read_timer_generation_;
  read_timer_.cancel();
  parser_.reset();
  current_.reset();
  reply_ = Reply::Final;
  keep_alive_ = keep_alive;
  wire::Head head;
  head.status = response.status;
  head.content_type = response.content_type;
  head.content_length = response.body.size();
  head.persistence = persistence();
  head.extra = &response.headers;
  std::string bytes = wire::format_head(head);
  if (!head_request_) bytes += response.body;
  queue_final(std::move(bytes));
  read_more();
}

// ---------------------------------------------------------------------------------------
// Answers from the exchange

bool Connection::is_current(uint64_t sequence) const {
  return phase_ == Phase::Handling && sequence == sequence_ && !current_.expired();
}

wire::Persistence Connection::persistence() const {
  if (!keep_alive_) return wire::Persistence::Close;
  return http10_ ? wire::Persistence::KeepAlive : wire::Persistence::Default;
}

void Connection::exchange_respond(uint64_t sequence, Response response) {
  if (!is_current(sequence) || reply_ != Reply::Waiting) return;
  if (response.status < 200 || response.status > 999) {
    response = error_response(500, "the handler answered with invalid status " + std::to_string(response.status));
  }
  reply_ = Reply::Final;
  const bool no_body = wire::status_has_no_body(response.status);
  wire::Head head;
  head.status = response.status;
  head.content_type = no_body ? std::string_view() : std::string_view(response.content_type);
  if (!no_body) head.content_length = response.body.size();
  head.persistence = persistence();
  head.extra = &response.headers;
  std::string bytes = wire::format_head(head);
  if (!head_request_ && !no_body) bytes += response.body;
  queue_final(std::move(bytes));
}

void Connection::exchange_start_stream(uint64_t sequence, Headers extra_headers) {
  if (!is_current(sequence) || reply_ != Reply::Waiting) return;
  reply_ = Reply::Streaming;
  // HTTP/1.0 has no chunked encoding: the body ends when the connection does.
  if (http10_) keep_alive_ = false;
  wire::Head head;
  head.status = 200;
  head.content_type = "text/event-stream";
  head.cache_control = "no-cache";
  head.chunked = !http10_;
  head.persistence = keep_alive_ ? wire::Persistence::KeepAlive : wire::Persistence::Close;
  head.extra = &extra_headers;
  queue(wire::format_head(head));
}

void Connection::exchange_write(uint64_t sequence, std::string data,
                                const std::shared_ptr<std::atomic<size_t>>& counter) {
  const size_t size = data.size();
  if (!is_current(sequence) || reply_ != Reply::Streaming || head_request_) {
    counter->fetch_sub(size);
    return;
  }
  if (counter->load() > options_.max_queued_bytes) {
    counter->fetch_sub(size);
    close("the peer reads too slowly: stream backlog over max_queued_bytes");
    return;
  }
  queue(http10_ ? std::move(data) : wire::chunk(data), size, counter);
}

void Connection::exchange_end_stream(uint64_t sequence) {
  if (!is_current(sequence) || reply_ != Reply::Streaming) return;
  reply_ = Reply::Final;
  queue_final(http10_ || head_request_ ? std::string() : std::string(wire::kLastChunk));
}

void Connection::exchange_dropped(uint64_t sequence) {
  if (phase_ != Phase::Handling || sequence != sequence_) return;
  if (reply_ == Reply::Waiting) {
    // Answer for the handler, so the client is not left waiting forever.
    reply_ = Reply::Final;
    Response response = error_response(500,
                                       "the request handler dropped the request "
                                       "without answering it");
    wire::Head head;
    head.status = response.status;
    head.content_type = response.content_type;
    head.content_length = response.body.size();
    head.persistence = persistence();
    std::string bytes = wire::format_head(head);
    if (!head_request_) bytes += response.body;
    queue_final(std::move(bytes));
  } else if (reply_ == Reply::Streaming) {
    close("the request handler dropped a stream without ending it");
  }
}

// ---------------------------------------------------------------------------------------
// Writing

void Connection::queue(std::string bytes, size_t accounted, std::shared_ptr<std::atomic<size_t>> counter) {
  if (phase_ == Phase::Closed) {
    if (counter) counter->fetch_sub(accounted);
    return;
  }
  if (!bytes.empty()) outbox_.push_back(OutChunk{std::move(bytes), accounted, std::move(counter)});
  flush();
}

void Connection::queue_final(std::string bytes) {
  final_queued_ = true;
  queue(std::move(bytes));
}

void Connection::flush() {
  if (writing_ || phase_ == Phase::Closed) return;
  if (outbox_.empty()) {
    if (final_queued_) {
      final_queued_ = false;
      // Complete now, so a peer that closes right after reading is not taken for one that
      // left early; what comes next is deferred (the caller may be a drain or the parser).
      if (auto exchange = current_.lock()) exchange->complete_now();
      current_.reset();
      reply_ = Reply::None;
      asio::post(executor_, [self = shared_from_this()] { self->on_response_written(); });
    }
    return;
  }
  std::vector<asio::const_buffer> buffers;
  buffers.reserve(std::min(outbox_.size(), kMaxBuffersPerWrite));
  for (const auto& chunk : outbox_) {
    if (buffers.size() == kMaxBuffersPerWrite) break;
    const size_t skip = buffers.empty() ? outbox_offset_ : 0;
    buffers.push_back(asio::buffer(chunk.bytes.data() + skip, chunk.bytes.size() - skip));
  }
  writing_ = true;
  arm_write_timer();
  socket_.async_write_some(buffers,
                           [self = shared_from_this()](const error_code& ec, size_t n) { self->on_write(ec, n); });
}

void Connection::on_write(const error_code& ec, size_t n) {
  writing_ = false;
  ++write_timer_generation_;
  write_timer_.cancel();
  if (phase_ == Phase::Closed) return;
  if (ec) {
    close("writing to the peer failed");
    return;
  }
  while (n > 0 && !outbox_.empty()) {
    OutChunk& front = outbox_.front();
    const size_t left = front.bytes.size() - outbox_offset_;
    if (n < left) {
      outbox_offset_ += n;
      break;
    }
    n -= left;
    if (front.counter) front.counter->fetch_sub(front.accounted);
    outbox_.pop_front();
    outbox_offset_ = 0;
  }
  flush();
  if (peer_gone_) close("peer closed the connection");
}

void Connection::on_response_written() {
  if (phase_ != Phase::Handling) return;
  if (!keep_alive_) {
    start_linger();
    return;
  }
  begin_request();
  if (inbuf_.size() > 0) {
    request_started_ = true;  // pipelined: its bytes are already here
    arm_read_timer(options_.read_timeout);
    parse();
  } else {
    arm_read_timer(options_.keep_alive_timeout);
    read_more();
  }
}

// ---------------------------------------------------------------------------------------
// Timers and closing

void Connection::arm_read_timer(std::chrono::milliseconds after) {
  const uint64_t generation = ++read_timer_generation_;
  read_timer_.expires_after(after);
  read_timer_.async_wait([self = shared_from_this(), generation](const error_code& ec) {
    if (ec || generation != self->read_timer_generation_) return;
    self->on_read_timer();
  });
}

void Connection::on_read_timer() {
  switch (phase_) {
    case Phase::ReadRequest:
      state_->read_timeouts.fetch_add(1);
      if (request_started_) {
        reject(408, "the request was not received within " + std::to_string(options_.read_timeout.count()) + " ms");
      } else {
        close("idle connection timed out");
      }
      return;
    case Phase::Lingering:
      close("linger time over");
      return;
    case Phase::Handling:
    case Phase::Closed:
      return;
  }
}

void Connection::arm_write_timer() {
  const uint64_t generation = ++write_timer_generation_;
  write_timer_.expires_after(options_.write_timeout);
  write_timer_.async_wait([self = shared_from_this(), generation](const error_code& ec) {
    if (ec || generation != self->write_timer_generation_ || !self->writing_) return;
    self->state_->write_timeouts.fetch_add(1);
    self->close("write timed out: the peer stopped reading");
  });
}

void Connection::start_linger() {
  set_phase(Phase::Lingering);
  error_code ec;
  socket_.shutdown(tcp::socket::shutdown_send, ec);  // FIN after the response
  if (ec) {
    close("shutdown failed");
    return;
  }
  inbuf_.consume(inbuf_.size());
  arm_read_timer(std::min(options_.read_timeout, kMaxLinger));
  read_more();
}

void Connection::abandon_current() {
  if (reply_ == Reply::None) return;
  reply_ = Reply::None;
  if (auto exchange = current_.lock()) exchange->abandon_now();
  current_.reset();
}

// Every phase change goes through here: the server counts the connections answering a
// request (a drain waits for them to write their last bytes before stopping).
void Connection::set_phase(Phase next) {
  if (phase_ == Phase::Handling && next != Phase::Handling) state_->answering.fetch_sub(1);
  if (phase_ != Phase::Handling && next == Phase::Handling) state_->answering.fetch_add(1);
  phase_ = next;
}

void Connection::close(const char* reason) {
  (void)reason;  // kept at the call sites: it documents why
  if (phase_ == Phase::Closed) return;
  set_phase(Phase::Closed);
  ++read_timer_generation_;
  ++write_timer_generation_;
  read_timer_.cancel();
  write_timer_.cancel();
  error_code ec;
  socket_.close(ec);
  for (auto& chunk : outbox_)
    if (chunk.counter) chunk.counter->fetch_sub(chunk.accounted);
  outbox_.clear();
  outbox_offset_ = 0;
  final_queued_ = false;
  parser_.reset();
  abandon_current();
  state_->open_connections.fetch_sub(1);
  // Last: the registry may hold the last reference other than our caller's.
  auto self = shared_from_this();
  std::lock_guard lock(state_->registry_mutex);
  state_->registry.erase(this);
}

}  // namespace tessera::http::detail
