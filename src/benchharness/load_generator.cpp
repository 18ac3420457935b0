#include "benchharness/load_generator.h"

#include <algorithm>
#include <boost/asio/steady_timer.hpp>
#include <deque>
#include <map>
#include <memory>

#include "core/error.h"

namespace tessera::bench {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

std::vector<double> RequestRecord::itl_s() const {
  std::vector<double> out;
  for (size_t i = 1; i < token_s.size(); ++i) out.push_back(token_s[i] - token_s[i - 1]);
  return out;
}

double RequestRecord::tpot_s() const {
  if (!ok || output_tokens < 2 || ttft_s < 0) return -1;
  return (e2e_s - ttft_s) / static_cast<double>(output_tokens - 1);
}

nlohmann::json RequestRecord::to_json() const {
  return {{"id", id},
          {"conversation", conversation},
          {"turn", turn},
          {"prefix_group", prefix_group},
          {"input_tokens", input_tokens},
          {"max_tokens", max_tokens},
          {"prompt_tokens", prompt_tokens},
          {"output_tokens", output_tokens},
          {"output_from_usage", output_from_usage},
          {"scheduled_s", scheduled_s},
          {"send_s", send_s},
          {"first_byte_s", first_byte_s},
          {"ttft_s", ttft_s},
          {"e2e_s", e2e_s},
          {"queue_s", queue_s},
          {"token_s", token_s},
          {"http_status", http_status},
          {"ok", ok},
          {"error", error}};
}

RequestRecord RequestRecord::from_json(const nlohmann::json& j) {
  RequestRecord r;
  r.id = j.at("id");
  r.conversation = j.value("conversation", int64_t{0});
  r.turn = j.value("turn", 0);
  r.prefix_group = j.value("prefix_group", -1);
  r.input_tokens = j.at("input_tokens");
  r.max_tokens = j.value("max_tokens", int64_t{0});
  r.prompt_tokens = j.value("prompt_tokens", int64_t{-1});
  r.output_tokens = j.at("output_tokens");
  r.output_from_usage = j.value("output_from_usage", false);
  r.scheduled_s = j.value("scheduled_s", 0.0);
  r.send_s = j.value("send_s", 0.0);
  r.first_byte_s = j.value("first_byte_s", -1.0);
  r.ttft_s = j.at("ttft_s");
  r.e2e_s = j.at("e2e_s");
  r.queue_s = j.value("queue_s", -1.0);
  r.token_s = j.value("token_s", std::vector<double>{});
  r.http_status = j.value("http_status", 0);
  r.ok = j.at("ok");
  r.error = j.value("error", std::string());
  return r;
}

nlohmann::json make_request_body(const LoadOptions& o, const PlannedConversation& c, int turn,
                                 const std::vector<std::string>& replies) {
  nlohmann::json body = {{"model", o.model},
                         {"max_tokens", c.turns[turn].output_tokens},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}},
                         {"temperature", o.temperature}};
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (o.api == "chat") {
    nlohmann::json messages = nlohmann::json::array();
    if (!c.system_text.empty()) messages.push_back({{"role", "system"}, {"content", c.system_text}});
    for (int t = 0; t < turn; ++t) {
      messages.push_back({{"role", "user"}, {"content", c.turns[t].user_text}});
      messages.push_back({{"role", "assistant"}, {"content", replies[t]}});
    }
    messages.push_back({{"role", "user"}, {"content", c.turns[turn].user_text}});
    body["messages"] = std::move(messages);
  } else {
    // A plain-text rendering of the same history for the completions endpoint.
    std::string prompt = c.system_text.empty() ? "" : c.system_text + "\n\n";
    for (int t = 0; t < turn; ++t) prompt += c.turns[t].user_text + "\n\n" + replies[t] + "\n\n";
    prompt += c.turns[turn].user_text;
    body["prompt"] = std::move(prompt);
  }
  for (const auto& [key, value] : o.extra_body.items()) body[key] = value;
  return body;
}

namespace {

class LoadRun {
 public:
  LoadRun(const WorkloadPlan& plan, const LoadOptions& o)
      : plan_(plan), o_(o), arrival_timer_(io_), progress_timer_(io_) {
    TESSERA_CHECK(o.api == "chat" || o.api == "completions", "--endpoint '", o.api, "' is not chat or completions");
    tcp::resolver resolver(io_);
    boost::system::error_code ec;
    resolved_ = resolver.resolve(o.endpoint.host, o.endpoint.port, ec);
    if (ec) fail("cannot resolve ", o.endpoint.host, ":", o.endpoint.port, ": ", ec.message());
    replies_.resize(plan.conversations.size());
    for (const auto& c : plan.conversations) progress_.planned += static_cast<int64_t>(c.turns.size());
  }

  LoadResult run() {
    start_ = Clock::now();
    schedule_arrivals();
    if (o_.on_progress) tick_progress();
    io_.run();
    LoadResult r;
    r.records = std::move(records_);
    std::sort(r.records.begin(), r.records.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    double first = 1e300, last = 0;
    for (const auto& rec : r.records) {
      first = std::min(first, rec.send_s);
      last = std::max(last, rec.send_s + rec.e2e_s);
    }
    r.duration_s = r.records.empty() ? 0 : last - first;
    if (o_.on_progress) {
      // The last line: rates over the whole run.
      Progress p = snapshot();
      if (r.duration_s > 0) {
        p.recent_requests_per_s = static_cast<double>(p.done) / r.duration_s;
        p.recent_tokens_per_s = static_cast<double>(total_tokens_) / r.duration_s;
      }
      o_.on_progress(p);
    }
    return r;
  }

 private:
  struct Pending {
    size_t conversation;
    int turn;
    double scheduled_s;
  };

  double since_start(Clock::time_point t) const { return std::chrono::duration<double>(t - start_).count(); }
  Clock::time_point at(double s) const {
    return start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  // Releases every conversation whose arrival time has come, then re-arms for the next one.
  void schedule_arrivals() {
    const auto now = Clock::now();
    while (next_arrival_ < plan_.conversations.size() && at(plan_.conversations[next_arrival_].arrival_s) <= now) {
      ready_.push_back({next_arrival_, 0, plan_.conversations[next_arrival_].arrival_s});
      ++next_arrival_;
    }
    dispatch();
    if (next_arrival_ < plan_.conversations.size()) {
      arrival_timer_.expires_at(at(plan_.conversations[next_arrival_].arrival_s));
      arrival_timer_.async_wait([this](boost::system::error_code ec) {
        if (!ec) schedule_arrivals();
      });
    }
    maybe_finish();
  }

  void dispatch() {
    while (!ready_.empty() && (o_.max_concurrency <= 0 || in_flight_ < o_.max_concurrency)) {
      const Pending p = ready_.front();
      ready_.pop_front();
      send(p);
    }
  }

  void send(const Pending& p) {
    const PlannedConversation& c = plan_.conversations[p.conversation];
    auto rec = std::make_shared<RequestRecord>();
    rec->id = next_id_++;
    rec->conversation = c.id;
    rec->turn = p.turn;
    rec->prefix_group = c.prefix_group;
    rec->input_tokens = c.system_tokens + c.turns[p.turn].user_tokens;
    for (int t = 0; t < p.turn; ++t) rec->input_tokens += c.turns[t].user_tokens + turn_output_[{p.conversation, t}];
    rec->max_tokens = c.turns[p.turn].output_tokens;
    rec->scheduled_s = p.scheduled_s;
    StreamRequest req;
    req.path = o_.api == "chat" ? "/v1/chat/completions" : "/v1/completions";
    req.body = make_request_body(o_, c, p.turn, replies_[p.conversation]).dump();
    req.api_key = o_.api_key;
    req.timeout_s = o_.timeout_s;
    req.on_token = [this] { ++recent_tokens_, ++total_tokens_; };
    ++in_flight_;
    ++progress_.sent;
    start_streaming_post(io_, o_.endpoint, resolved_, std::move(req),
                         [this, rec, p](StreamResult r) { on_done(*rec, p, std::move(r)); });
  }

  void on_done(RequestRecord& rec, const Pending& p, StreamResult r) {
    --in_flight_;
    auto rel = [&](Clock::time_point t) { return std::chrono::duration<double>(t - r.start).count(); };
    rec.send_s = since_start(r.start);
    rec.http_status = r.http_status;
    rec.error = r.error;
    rec.ok = r.error.empty();
    rec.first_byte_s = r.http_status != 0 ? rel(r.first_byte) : -1;
    rec.e2e_s = rel(r.end);
    for (auto t : r.token_times) rec.token_s.push_back(rel(t));
    rec.ttft_s = rec.token_s.empty() ? -1 : rec.token_s.front();
    rec.prompt_tokens = r.prompt_tokens;
    rec.output_from_usage = r.completion_tokens >= 0;
    rec.output_tokens = rec.output_from_usage ? r.completion_tokens : static_cast<int64_t>(r.token_times.size());
    rec.queue_s = r.queue_ms >= 0 ? r.queue_ms / 1000.0 : -1;
    if (rec.ok && rec.token_s.empty()) {
      rec.ok = false;
      rec.error = "no generated text in the stream";
    }
    ++recent_done_;
    ++progress_.done;
    if (!rec.ok) ++progress_.failed;
    const PlannedConversation& c = plan_.conversations[p.conversation];
    turn_output_[{p.conversation, p.turn}] = rec.output_tokens;
    if (rec.ok && p.turn + 1 < static_cast<int>(c.turns.size())) {
      // The next turn carries this reply; it is released think_time after the reply ended.
      replies_[p.conversation].push_back(std::move(r.text));
      auto timer = std::make_shared<asio::steady_timer>(io_);
      const double when = since_start(r.end) + think_time_of(c);
      timer->expires_at(at(when));
      ++waiting_turns_;
      timer->async_wait([this, timer, p, when](boost::system::error_code) {
        --waiting_turns_;
        ready_.push_back({p.conversation, p.turn + 1, when});
        dispatch();
      });
    } else if (!rec.ok) {
      progress_.planned -= static_cast<int64_t>(c.turns.size()) - p.turn - 1;  // the rest is not sent
    }
    records_.push_back(std::move(rec));
    dispatch();
    maybe_finish();
  }

  double think_time_of(const PlannedConversation&) const { return plan_.think_time_s; }

  void maybe_finish() {
    if (next_arrival_ == plan_.conversations.size() && ready_.empty() && in_flight_ == 0 && waiting_turns_ == 0) {
      finished_ = true;
      progress_timer_.cancel();
    }
  }

  Progress snapshot() const {
    Progress p = progress_;
    p.elapsed_s = since_start(Clock::now());
    p.in_flight = in_flight_;
    p.waiting = static_cast<int64_t>(ready_.size());
    return p;
  }

  void tick_progress() {
    if (finished_) return;
    progress_timer_.expires_after(
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o_.progress_interval_s)));
    progress_timer_.async_wait([this](boost::system::error_code ec) {
      if (ec || finished_) return;
      Progress p = snapshot();
      p.recent_requests_per_s = recent_done_ / o_.progress_interval_s;
      p.recent_tokens_per_s = recent_tokens_ / o_.progress_interval_s;
      recent_done_ = 0;
      recent_tokens_ = 0;
      o_.on_progress(p);
      tick_progress();
    });
  }

  const WorkloadPlan& plan_;
  const LoadOptions& o_;
  asio::io_context io_;
  tcp::resolver::results_type resolved_;
  asio::steady_timer arrival_timer_, progress_timer_;
  Clock::time_point start_;
  size_t next_arrival_ = 0;
  std::deque<Pending> ready_;
  int in_flight_ = 0;
  int waiting_turns_ = 0;
  int64_t next_id_ = 0;
  bool finished_ = false;
  std::vector<std::vector<std::string>> replies_;
  std::map<std::pair<size_t, int>, int64_t> turn_output_;
  std::vector<RequestRecord> records_;
  Progress progress_;
  int64_t recent_done_ = 0, recent_tokens_ = 0, total_tokens_ = 0;
};

}  // namespace

LoadResult run_load(const WorkloadPlan& plan, const LoadOptions& options) {
  LoadRun run(plan, options);
  return run.run();
}

}  // namespace tessera::bench
