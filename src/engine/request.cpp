#include "engine/request.h"

namespace tessera {

bool RequestStream::next(StreamEvent& event) {
  std::unique_lock lock(mutex_);
  ready_.wait(lock, [&] { return !events_.empty() || closed_; });
  if (events_.empty()) return false;
  event = std::move(events_.front());
  events_.pop_front();
  return true;
}

std::optional<StreamEvent> RequestStream::try_next() {
  std::lock_guard lock(mutex_);
  if (events_.empty()) return std::nullopt;
  StreamEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

RequestOutput RequestStream::collect() {
  RequestOutput out;
  out.tokens.resize(n_choices_);
  out.finish.assign(n_choices_, FinishReason::None);
  StreamEvent e;
  while (next(e)) {
    if (e.choice < 0 || e.choice >= n_choices_) continue;
    if (e.token >= 0) out.tokens[e.choice].push_back(e.token);
    if (e.finish != FinishReason::None) out.finish[e.choice] = e.finish;
    if (!e.error.empty()) out.error = e.error;
  }
  return out;
}

bool RequestStream::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

void RequestStream::push(StreamEvent event, bool close) {
  {
    std::lock_guard lock(mutex_);
    events_.push_back(std::move(event));
    closed_ = closed_ || close;
  }
  ready_.notify_all();
  if (on_event_) on_event_();
}

std::shared_ptr<const RequestProgress> RequestStream::progress() const {
  std::lock_guard lock(mutex_);
  return progress_;
}

void RequestStream::update_progress(const std::function<void(RequestProgress&)>& edit) {
  std::lock_guard lock(mutex_);
  auto next = std::make_shared<RequestProgress>(*progress_);
  edit(*next);
  progress_ = std::move(next);
}

}  // namespace tessera
