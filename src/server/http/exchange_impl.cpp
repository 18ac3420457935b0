#include "server/http/exchange_impl.h"

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <cstdio>
#include <exception>

#include "server/http/connection.h"

namespace tessera::http::detail {

namespace asio = boost::asio;

// A drain hands the strand back after this many operations, so one busy stream cannot hold
// an I/O thread while other connections wait.
constexpr int kOpsPerDrain = 256;

void run_guarded(const std::function<void()>& fn, const char* what) noexcept {
  try {
    fn();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tessera http: %s threw: %s\n", what, e.what());
  } catch (...) {
    std::fprintf(stderr, "tessera http: %s threw a non-standard exception\n", what);
  }
}

ExchangeImpl::ExchangeImpl(Request request, std::weak_ptr<Connection> connection, uint64_t sequence,
                           std::shared_ptr<ServerState> state)
    : request_(std::move(request)),
      connection_(std::move(connection)),
      sequence_(sequence),
      state_(std::move(state)),
      queued_(std::make_shared<std::atomic<size_t>>(0)) {
  state_->live_exchanges.fetch_add(1);
}

ExchangeImpl::~ExchangeImpl() {
  state_->live_exchanges.fetch_sub(1);
  if (completed_.load() || abandoned_.load()) return;
  // Every queued operation held a reference, so all of them have run: a response that was
  // answered and is not an unfinished stream is already with the connection.
  const bool unfinished_stream = stream_started_.load() && !stream_ended_.load();
  if (answered_.load() && !unfinished_stream) return;
  std::shared_lock gate(state_->gate);
  if (!state_->open) return;
  if (auto connection = connection_.lock()) {
    const uint64_t sequence = sequence_;
    asio::post(connection->executor(), [connection, sequence] { connection->exchange_dropped(sequence); });
  }
}

void ExchangeImpl::respond(Response response) {
  if (answered_.exchange(true)) return;
  enqueue(Op{OpKind::Respond, std::move(response), {}, {}, {}});
}

void ExchangeImpl::start_stream(Headers extra_headers) {
  if (answered_.exchange(true)) return;
  stream_started_.store(true);
  enqueue(Op{OpKind::StartStream, {}, std::move(extra_headers), {}, {}});
}

void ExchangeImpl::write(std::string data) {
  // Cheap refusals first: the engine thread calls this for every token.
  if (data.empty() || abandoned_.load() || !stream_started_.load() || stream_ended_.load()) return;
  queued_->fetch_add(data.size());
  enqueue(Op{OpKind::Write, {}, {}, std::move(data), {}});
}

void ExchangeImpl::end_stream() {
  if (!stream_started_.load() || stream_ended_.exchange(true)) return;
  enqueue(Op{OpKind::EndStream, {}, {}, {}, {}});
}

void ExchangeImpl::post(std::function<void()> fn) {
  if (!fn) return;
  enqueue(Op{OpKind::Post, {}, {}, {}, std::move(fn)});
}

void ExchangeImpl::on_abandon(std::function<void()> fn) {
  if (!fn) return;
  enqueue(Op{OpKind::OnAbandon, {}, {}, {}, std::move(fn)});
}

void ExchangeImpl::enqueue(Op op) {
  {
    std::lock_guard lock(mutex_);
    ops_.push_back(std::move(op));
    if (draining_) return;  // the running drain will get to it
    draining_ = true;
  }
  schedule_drain();
}

void ExchangeImpl::schedule_drain() {
  auto self = shared_from_this();
  {
    std::shared_lock gate(state_->gate);
    if (state_->open) {
      if (auto connection = connection_.lock()) {
        asio::post(connection->executor(), [self, connection] { self->drain(connection.get()); });
      } else {
        // The connection is gone, so nothing it ran can still be queued: ordering holds.
        asio::post(*state_->io_context, [self] { self->drain(nullptr); });
      }
      return;
    }
  }
  drop_after_stop();
}

void ExchangeImpl::drain(Connection* connection) {
  for (int done = 0;; ++done) {
    Op op;
    {
      std::lock_guard lock(mutex_);
      if (ops_.empty()) {
        draining_ = false;
        return;
      }
      if (done == kOpsPerDrain) break;  // still draining_: schedule the rest below
      op = std::move(ops_.front());
      ops_.pop_front();
    }
    run(op, connection);
  }
  schedule_drain();
}

void ExchangeImpl::run(Op& op, Connection* connection) {
  switch (op.kind) {
    case OpKind::Post:
      run_guarded(op.fn, "a function posted to an exchange");
      return;
    case OpKind::OnAbandon: {
      {
        std::lock_guard lock(mutex_);
        if (!abandoned_.load() && !completed_.load()) {
          abandon_hooks_.push_back(std::move(op.fn));
          return;
        }
      }
      if (abandoned_.load()) run_guarded(op.fn, "an on_abandon function");
      return;
    }
    case OpKind::Write:
      if (connection) {
        connection->exchange_write(sequence_, std::move(op.data), queued_);
      } else {
        queued_->fetch_sub(op.data.size());
      }
      return;
    case OpKind::Respond:
      if (connection) connection->exchange_respond(sequence_, std::move(op.response));
      return;
    case OpKind::StartStream:
      if (connection) connection->exchange_start_stream(sequence_, std::move(op.headers));
      return;
    case OpKind::EndStream:
      if (connection) connection->exchange_end_stream(sequence_);
      return;
  }
}

void ExchangeImpl::drop_after_stop() {
  std::deque<Op> ops;
  {
    std::lock_guard lock(mutex_);
    ops.swap(ops_);
    draining_ = false;
  }
  // The server stopped after abandoning every open exchange, so there is no executor left;
  // an abandon hook registered late still deserves to run.
  for (Op& op : ops) {
    if (op.kind == OpKind::OnAbandon && abandoned_.load()) run_guarded(op.fn, "an on_abandon function");
    if (op.kind == OpKind::Write) queued_->fetch_sub(op.data.size());
  }
}

void ExchangeImpl::abandon_now() {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard lock(mutex_);
    if (completed_.load() || abandoned_.exchange(true)) return;
    hooks.swap(abandon_hooks_);
  }
  state_->abandoned.fetch_add(1);
  for (auto& hook : hooks) run_guarded(hook, "an on_abandon function");
}

void ExchangeImpl::complete_now() {
  std::vector<std::function<void()>> hooks;  // destroyed outside the lock
  std::lock_guard lock(mutex_);
  if (abandoned_.load()) return;
  completed_.store(true);
  hooks.swap(abandon_hooks_);
}

}  // namespace tessera::http::detail
