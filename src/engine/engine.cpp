#include "engine/engine.h"

#include <future>
#include <type_traits>

#include "core/error.h"

namespace tessera {

Engine::Engine(const EngineConfig& config, Executor& executor) : core_(config, executor), admission_(config.admission) {
  stats_ = core_.stats();
  thread_ = std::thread([this] { run(); });
}

Engine::~Engine() { stop(); }

namespace {
// What a request may hold of its tenant's token limit: its prompt and every choice's output.
int64_t budget_tokens(const Request& r) {
  return static_cast<int64_t>(r.prompt.size()) + static_cast<int64_t>(r.sampling.max_tokens) * r.n;
}
}  // namespace

SubmitResult Engine::submit(Request request, std::function<void()> on_event) {
  SubmitResult result;
  if (auto invalid = core_.validate(request)) {  // reads the configuration only
    result.rejection = std::move(invalid);
    return result;
  }
  const auto n_prompt = static_cast<int64_t>(request.prompt.size());
  if (auto refused = admission_.admit(request.tenant, n_prompt, budget_tokens(request), request.n)) {
    result.rejection = std::move(refused);
    return result;
  }
  result.stream = std::make_shared<RequestStream>(request.n, std::move(on_event));
  {
    std::lock_guard lock(mutex_);
    if (stop_) {
      admission_.finished(request.tenant, false, n_prompt, budget_tokens(request), request.n);
      result.stream.reset();
      result.rejection = Rejection{RejectReason::Draining, "the engine has stopped"};
      return result;
    }
    result.id = next_id_++;
    ++in_flight_;
    inbox_.push_back(
        Message{Message::Kind::Add, result.id, std::move(request), result.stream, 0, FinishReason::None, {}});
  }
  wake_.notify_one();
  return result;
}

void Engine::post(Message message) {
  {
    std::lock_guard lock(mutex_);
    if (stop_) return;  // stop() aborts everything anyway
    inbox_.push_back(std::move(message));
  }
  wake_.notify_one();
}

void Engine::abort(RequestId id) { post(Message{Message::Kind::Abort, id, {}, nullptr, 0, FinishReason::None, {}}); }

void Engine::finish_sequence(RequestId id, int32_t choice, FinishReason reason) {
  TESSERA_CHECK(reason != FinishReason::None, "engine: finish_sequence of request ", id, " choice ", choice,
                " needs a finish reason");
  post(Message{Message::Kind::FinishChoice, id, {}, nullptr, choice, reason, {}});
}

void Engine::drain(std::chrono::milliseconds timeout) {
  admission_.set_draining(true);
  std::unique_lock lock(mutex_);
  if (!idle_.wait_for(lock, timeout, [&] { return in_flight_ == 0 || stop_; })) {
    inbox_.push_back(Message{Message::Kind::AbortAll, 0, {}, nullptr, 0, FinishReason::None, {}});  // out of time
    wake_.notify_one();
    idle_.wait(lock, [&] { return in_flight_ == 0 || stop_; });
  }
}

void Engine::stop() {
  admission_.set_draining(true);
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

size_t Engine::n_in_flight() const {
  std::lock_guard lock(mutex_);
  return in_flight_;
}

size_t Engine::n_queued_messages() const {
  std::lock_guard lock(mutex_);
  return inbox_.size();
}

bool Engine::stopping() const {
  std::lock_guard lock(mutex_);
  return stop_;
}

std::string Engine::internal_error() const {
  std::lock_guard lock(mutex_);
  return internal_error_;
}

const EngineCore& Engine::core() const {
  TESSERA_CHECK(!thread_.joinable(), "engine: core() is for after stop()");
  return core_;
}

template <typename Fn>
auto Engine::call(Fn fn) -> decltype(fn(std::declval<EngineCore&>())) {
  using Result = decltype(fn(std::declval<EngineCore&>()));
  auto done = std::make_shared<std::promise<Result>>();
  std::future<Result> result = done->get_future();
  Message m;
  m.kind = Message::Kind::Call;
  // Stats are published before the caller returns, so they show what the call did.
  m.call = [this, fn = std::move(fn), done](EngineCore& core) {
    try {
      if constexpr (std::is_void_v<Result>) {
        fn(core);
        publish();
        done->set_value();
      } else {
        Result r = fn(core);
        publish();
        done->set_value(std::move(r));
      }
    } catch (...) {
      done->set_exception(std::current_exception());
    }
  };
  {
    std::lock_guard lock(mutex_);
    TESSERA_CHECK(!stop_, "engine: stopped");
    inbox_.push_back(std::move(m));
  }
  wake_.notify_one();
  return result.get();
}

KvIdentity Engine::kv_identity() const { return core_.kv_identity(); }  // configuration only

std::shared_ptr<const KvBlocksPayload> Engine::export_kv_lease(uint64_t id) {
  return call([id](EngineCore& core) { return core.export_lease(id); });
}

void Engine::release_kv_lease(uint64_t id) {
  call([id](EngineCore& core) { core.release_lease(id); });
}

KvImportReservation Engine::reserve_kv_import(int32_t n_blocks) {
  return call([n_blocks](EngineCore& core) { return core.reserve_import(n_blocks); });
}

void Engine::cancel_kv_import(uint64_t id) {
  call([id](EngineCore& core) { core.cancel_import(id); });
}

void Engine::handle(Message& message) {
  switch (message.kind) {
    case Message::Kind::Add: {
      Live live{message.stream, message.request.tenant, static_cast<int64_t>(message.request.prompt.size()),
                budget_tokens(message.request), false};
      try {
        core_.add(message.id, message.request);
      } catch (const std::exception& e) {  // validated at submit: only a bug gets here
        admission_.finished(live.tenant, false, live.n_prompt, live.budget_tokens, live.stream->n_choices());
        message.stream->push(StreamEvent{0, -1, FinishReason::Error, e.what(), {}}, true);
        std::lock_guard lock(mutex_);
        --in_flight_;
        idle_.notify_all();
        return;
      }
      live_.emplace(message.id, std::move(live));
      return;
    }
    case Message::Kind::Abort: {
      auto events = core_.abort(message.id);
      deliver(events, "");
      return;
    }
    case Message::Kind::FinishChoice: {
      auto events = core_.finish_choice(message.id, message.choice, message.reason);
      deliver(events, "");
      return;
    }
    case Message::Kind::AbortAll: {
      auto events = core_.abort_all(FinishReason::Abort);
      deliver(events, "");
      return;
    }
    case Message::Kind::Call:
      message.call(core_);
      return;
  }
}

void Engine::end_all_live(const std::string& error) {
  for (auto& [id, live] : live_) {
    for (int c = 0; c < live.stream->n_choices(); ++c)
      live.stream->push(StreamEvent{c, -1, FinishReason::Error, error, {}}, c + 1 == live.stream->n_choices());
    admission_.finished(live.tenant, live.started, live.n_prompt, live.budget_tokens, live.stream->n_choices());
  }
  std::lock_guard lock(mutex_);
  in_flight_ -= live_.size();
  live_.clear();
  idle_.notify_all();
}

void Engine::publish_progress(const StepResult& step) {
  for (const RequestStart& start : step.started) {
    const auto it = live_.find(start.id);
    if (it == live_.end()) continue;
    Live& live = it->second;
    live.started = true;
    admission_.started(live.n_prompt);
    live.stream->update_progress([&](RequestProgress& p) {
      p.scheduled_at = start.scheduled_at;
      p.cached_prompt_tokens = start.cached_prompt_tokens;
    });
  }
  for (const auto& [id, lease] : step.leases) {
    const auto it = live_.find(id);
    if (it == live_.end()) continue;
    it->second.stream->update_progress([&](RequestProgress& p) { p.kv_lease = lease; });
  }
  for (const auto& [id, entries] : step.prompt_logprobs) {
    const auto it = live_.find(id);
    if (it == live_.end()) continue;
    it->second.stream->update_progress([&](RequestProgress& p) { p.prompt_logprobs = entries; });
  }
}

void Engine::deliver(std::vector<SeqEvent>& events, const std::string& error) {
  size_t ended = 0;
  for (SeqEvent& e : events) {
    const auto it = live_.find(e.request);
    if (it == live_.end()) continue;
    StreamEvent out{e.choice, e.token, e.finish, e.finish == FinishReason::Error ? error : std::string(),
                    std::move(e.logprobs)};
    it->second.stream->push(std::move(out), e.request_done);
    if (e.request_done) {
      admission_.finished(it->second.tenant, it->second.started, it->second.n_prompt, it->second.budget_tokens,
                          it->second.stream->n_choices());
      live_.erase(it);
      ++ended;
    }
  }
  if (ended > 0) {
    std::lock_guard lock(mutex_);
    in_flight_ -= ended;
    idle_.notify_all();
  }
}

void Engine::publish() {
  const EngineStats s = core_.stats();
  std::lock_guard lock(mutex_);
  stats_ = s;
}

void Engine::run() {
  std::vector<Message> messages;
  for (;;) {
    bool stopping;
    {
      std::unique_lock lock(mutex_);
      const auto ready = [&] { return stop_ || !inbox_.empty() || core_.has_work(); };
      // Leases end on time even when nothing else happens.
      if (const auto expiry = core_.next_lease_expiry())
        wake_.wait_until(lock, *expiry, ready);
      else
        wake_.wait(lock, ready);
      messages.swap(inbox_);
      stopping = stop_;
    }
    try {
      core_.expire_leases(std::chrono::steady_clock::now());
      for (Message& m : messages) handle(m);
      messages.clear();
      if (stopping) {
        auto events = core_.abort_all(FinishReason::Abort);
        deliver(events, "");
        publish();
        return;
      }
      if (!core_.has_work()) {
        publish();
        continue;
      }
      StepResult step = core_.step();
      publish_progress(step);  // before the step's token events
      // The stats first: a client that reads them (/metrics) once its stream has ended must
      // see the step that ended it (its prefix hits, its finish).
      publish();
      deliver(step.events, step.error);
    } catch (const std::exception& e) {
      // Not a failed forward (EngineCore::step handles those) but a broken invariant: end
      // every request with the error rather than serve from inconsistent state.
      {
        std::lock_guard lock(mutex_);
        if (internal_error_.empty()) internal_error_ = e.what();
      }
      admission_.set_draining(true);
      messages.clear();
      try {
        auto events = core_.abort_all(FinishReason::Error);
        deliver(events, e.what());
      } catch (const std::exception&) {
      }
      end_all_live(e.what());  // whatever the abort could not end
      publish();
    }
  }
}

}  // namespace tessera
