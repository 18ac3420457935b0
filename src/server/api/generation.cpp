#include "server/api/generation.h"

#include <algorithm>

#include "server/api/api_error.h"
#include "server/api/kv_transfer_params.h"
#include "tokenizer/tokenizer.h"

namespace tessera::api {

namespace {
double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }
}  // namespace

Generation::Generation(std::shared_ptr<http::Exchange> exchange, Engine& engine, const ServedModel& model,
                       const ApiHooks& hooks, GenerationPlan plan)
    : exchange_(std::move(exchange)), engine_(engine), model_(model), hooks_(hooks), plan_(std::move(plan)) {
  hooks_.live->fetch_add(1);
  const GenerationOptions& o = plan_.options;
  for (size_t p = 0; p < plan_.prompts.size(); ++p)
    for (int c = 0; c < o.n; ++c) {
      Choice ch(ChoiceOutput(*model_.tokenizer, o.stop, o.include_stop_str_in_output, o.skip_special_tokens), p);
      if (plan_.endpoint == Endpoint::Completions && o.logprobs)
        ch.completion_logprobs.emplace(*model_.tokenizer, o.skip_special_tokens);
      if (plan_.tool_format && o.stream) ch.tools.emplace(*plan_.tool_format);
      choices_.push_back(std::move(ch));
    }
}

Generation::~Generation() { hooks_.live->fetch_sub(1); }

void Generation::start(std::shared_ptr<http::Exchange> exchange, Engine& engine, const ServedModel& model,
                       const ApiHooks& hooks, GenerationPlan plan) {
  auto gen = std::make_shared<Generation>(exchange, engine, model, hooks, std::move(plan));
  gen->self_ = gen;
  const GenerationOptions& o = gen->plan_.options;
  const std::weak_ptr<Generation> weak = gen;

  for (size_t p = 0; p < gen->plan_.prompts.size(); ++p) {
    Request r;
    r.prompt = gen->plan_.prompts[p].tokens;
    r.sampling = gen->plan_.sampling[p];
    r.n = o.n;
    r.priority = o.priority;
    r.tenant = gen->plan_.tenant;
    r.tenant_salt = gen->plan_.tenant_salt;
    r.logprobs = o.logprobs;
    r.prompt_logprobs = gen->plan_.echo && o.logprobs ? o.top_logprobs : -1;
    r.speculative = o.speculative;
    KvPlan& kv = gen->plan_.kv;
    if (p == 0) r.kv_lease_seconds = kv.lease_seconds;
    if (p == 0 && kv.pulled) r.kv_import = kv.pulled->import();
    const auto on_event = [weak] {
      if (auto g = weak.lock()) g->schedule_drain();
    };
    SubmitResult s = engine.submit(r, on_event);
    if (!s.ok() && r.kv_import) {
      // The engine refused the import (another tenant's KV, other tokens, no prompt logprobs
      // from imported KV...): give the blocks back (an engine call: not on this executor)
      // and prefill here.
      std::shared_ptr<PulledKv> refused = std::move(kv.pulled);
      if (kv.off_io)
        kv.off_io([refused] { refused->give_back(); });
      else
        refused->give_back();
      note_fallback(kv.counters, kv.log, kv.pull ? kv.pull->address() : "?",
                    "the engine refused the import: " + s.rejection->message);
      r.kv_import.reset();
      s = engine.submit(std::move(r), on_event);
    } else if (s.ok() && r.kv_import) {
      kv.pulled->handed_over();
    }
    if (!s.ok()) {
      // Admission is all or nothing, decided before any header: withdraw what was accepted.
      for (const Part& part : gen->parts_) engine.abort(part.id);
      for (Part& part : gen->parts_) part.recorded = true;
      gen->responded_ = gen->abandoned_ = true;
      for (Choice& ch : gen->choices_) ch.done = true;
      const ApiError error = from_rejection(*s.rejection);
      if (hooks.record_rejection) hooks.record_rejection(error.status, reject_reason_name(s.rejection->reason));
      gen->log_access(error.status);
      exchange->respond(error_response(error));
      gen->self_.reset();
      return;
    }
    Part part;
    part.id = s.id;
    part.stream = std::move(s.stream);
    gen->parts_.push_back(std::move(part));
  }

  if (o.stream) {
    exchange->start_stream();
    if (gen->plan_.endpoint == Endpoint::Chat)
      for (size_t i = 0; i < gen->choices_.size(); ++i) {
        exchange->write(sse_event(chat_chunk(gen->plan_.id, gen->plan_.created, model.name, static_cast<int>(i),
                                             ojson{{"role", "assistant"}, {"content", ""}}, nullptr, std::nullopt)));
        gen->choices_[i].started = true;
      }
  }
  exchange->on_abandon([weak] {
    if (auto g = weak.lock()) g->on_abandon();
  });
  gen->schedule_drain();
}

void Generation::schedule_drain() {
  // One drain in flight at a time: it clears the flag before reading, so an event pushed after
  // that point posts another drain.
  if (!drain_posted_.exchange(true)) exchange_->post([self = shared_from_this()] { self->drain(); });
}

void Generation::drain() {
  drain_posted_.store(false);
  const Clock::time_point now = Clock::now();
  for (size_t p = 0; p < parts_.size(); ++p) {
    Part& part = parts_[p];
    if (part.engine_closed) continue;
    while (auto e = part.stream->try_next()) handle(p, *e, now);
    if (part.stream->closed()) {
      // closed() is set with the last push: whatever is left now is all there is.
      while (auto e = part.stream->try_next()) handle(p, *e, now);
      part.engine_closed = true;
    }
  }
  after_change();
}

void Generation::handle(size_t part_index, const StreamEvent& e, Clock::time_point now) {
  Part& part = parts_[part_index];
  if (!part.progress_read) {  // published before the first event
    part.progress = part.stream->progress();
    part.progress_read = true;
  }
  if (e.choice < 0 || e.choice >= n_per_prompt()) return;
  const int index = static_cast<int>(part_index) * n_per_prompt() + e.choice;
  Choice& ch = choices_[index];
  if (ch.done) return;  // stopped on a stop string (or abandoned): later tokens are dropped
  if (!ch.started) begin_choice(ch, index);

  std::string text;
  if (e.token >= 0) {
    if (ch.last_token)
      ch.gaps.push_back(seconds(now - *ch.last_token));
    else
      ch.first_token = now;
    ch.last_token = now;
    text = ch.output.add_token(e.token);
    if (plan_.options.logprobs && e.logprobs) {
      if (ch.completion_logprobs)
        ch.completion_logprobs->add(e.token, &*e.logprobs);
      else
        ch.chat_logprobs.push_back(*e.logprobs);
    }
    if (ch.output.stopped()) {
      // The engine would go on generating this choice: end it there too, freeing its KV
      // (its siblings carry on).
      if (e.finish == FinishReason::None) engine_.finish_sequence(part.id, e.choice, FinishReason::Stop);
      ch.stop_reason = ch.output.matched_stop();
      close_choice(ch, index, FinishReason::Stop, std::move(text));
      return;
    }
  }
  if (e.finish != FinishReason::None) {
    if (e.finish == FinishReason::Error && !error_) error_ = e.error.empty() ? "the engine failed" : e.error;
    text += ch.output.finish();
    if (ch.output.stopped()) {
      ch.stop_reason = ch.output.matched_stop();
    } else if (e.finish == FinishReason::Stop && e.token >= 0) {
      // vLLM reports a stop_token_ids hit by its id; EOS (checked first, as the scheduler
      // does) leaves it null.
      const SamplingParams& sp = plan_.sampling[part_index];
      const bool eos = !sp.ignore_eos && model_.tokenizer->is_eog(e.token);
      if (!eos && std::find(sp.stop_token_ids.begin(), sp.stop_token_ids.end(), e.token) != sp.stop_token_ids.end())
        ch.stop_reason = e.token;
    }
    // The held-back tail can still complete a stop string.
    close_choice(ch, index, ch.output.stopped() ? FinishReason::Stop : e.finish, std::move(text));
    return;
  }
  release(ch, index, std::move(text), std::nullopt);
}

void Generation::begin_choice(Choice& ch, int index) {
  ch.started = true;
  if (!plan_.echo) return;
  const Part& part = parts_[ch.part];
  const PromptInput& prompt = plan_.prompts[ch.part];
  if (ch.completion_logprobs) {
    // Entries for positions 1..n-1 (position 0 has none), when the engine computed them.
    const auto& lps = part.progress->prompt_logprobs;
    const bool have = lps && lps->size() + 1 == prompt.tokens.size();
    for (size_t i = 0; i < prompt.tokens.size(); ++i)
      ch.completion_logprobs->add(prompt.tokens[i], have && i > 0 ? &(*lps)[i - 1] : nullptr);
  }
  release(ch, index, prompt.text, std::nullopt);
}

void Generation::release(Choice& ch, int index, std::string text, std::optional<FinishReason> finish) {
  if (abandoned_) return;
  if (!plan_.options.stream) {
    ch.text += text;
    return;
  }
  if (ch.tools) return release_tool_text(ch, index, text, finish);
  if (text.empty() && !finish) return;  // logprobs wait for the text they belong to
  ojson logprobs = take_logprobs(ch);
  if (plan_.endpoint == Endpoint::Chat) {
    ojson delta = ojson::object();
    if (!text.empty()) delta["content"] = text;
    exchange_->write(sse_event(chat_chunk(plan_.id, plan_.created, model_.name, index, std::move(delta),
                                          std::move(logprobs), finish, ch.stop_reason)));
  } else {
    exchange_->write(sse_event(completion_chunk(plan_.id, plan_.created, model_.name, index, text, std::move(logprobs),
                                                finish, ch.stop_reason)));
  }
}

ojson Generation::take_logprobs(Choice& ch) {
  if (!plan_.options.logprobs) return nullptr;
  if (ch.completion_logprobs) {
    ojson j = ch.completion_logprobs->json();
    ch.completion_logprobs->clear_entries();
    return j;
  }
  ojson j = chat_logprobs_json(*model_.tokenizer, ch.chat_logprobs, plan_.options.skip_special_tokens);
  ch.chat_logprobs.clear();
  return j;
}

void Generation::close_choice(Choice& ch, int index, FinishReason finish, std::string text) {
  ch.done = true;
  ch.finish = finish;
  release(ch, index, std::move(text), finish);
  // Every choice of this prompt is over: the engine request ends with its last choice (a
  // choice stopped on a stop string was finished in the engine by handle()).
  const size_t p = ch.part;
  const int n = n_per_prompt();
  for (int c = 0; c < n; ++c)
    if (!choices_[p * n + c].done) return;
  record_part(p);
}

void Generation::on_abandon() {
  if (responded_) return;  // the answer is complete (or was refused): nothing to cancel
  abandoned_ = true;
  for (Part& part : parts_)
    if (!part.engine_closed && !part.abort_sent) {
      engine_.abort(part.id);  // freed within one engine step
      part.abort_sent = true;
    }
  for (Choice& ch : choices_)
    if (!ch.done) {
      ch.done = true;
      ch.finish = FinishReason::Abort;
    }
  for (size_t p = 0; p < parts_.size(); ++p) record_part(p);
  responded_ = true;
  log_access(499);  // nginx's "client closed request"
  after_change();
}

void Generation::after_change() {
  if (!responded_ && std::all_of(choices_.begin(), choices_.end(), [](const Choice& c) { return c.done; }))
    finish_response();
  if (responded_ && std::all_of(parts_.begin(), parts_.end(), [](const Part& p) { return p.engine_closed; }))
    self_.reset();  // the posted drain running this still holds a reference
}

void Generation::record_part(size_t p) {
  Part& part = parts_[p];
  if (part.recorded) return;
  part.recorded = true;
  if (!hooks_.record) return;
  const Clock::time_point arrival = exchange_->request().received_at;
  RequestRecord r;
  r.prompt_tokens = static_cast<int64_t>(plan_.prompts[p].tokens.size());
  r.max_tokens_param = plan_.options.max_tokens.value_or(0);  // vLLM records only what the client set
  r.n_param = n_per_prompt();
  std::optional<Clock::time_point> first, last;
  const int n = n_per_prompt();
  for (int c = 0; c < n; ++c) {
    const Choice& ch = choices_[p * n + c];
    r.generation_tokens += ch.output.n_tokens();
    r.inter_token_s.insert(r.inter_token_s.end(), ch.gaps.begin(), ch.gaps.end());
    if (ch.first_token && (!first || *ch.first_token < *first)) first = ch.first_token;
    if (ch.last_token && (!last || *ch.last_token >= *last)) {
      last = ch.last_token;
      r.finish = ch.finish;
    }
  }
  if (!last) r.finish = choices_[p * n + n - 1].finish;  // no token at all
  const Clock::time_point end = last.value_or(Clock::now());
  r.e2e_s = seconds(end - arrival);
  if (part.progress->scheduled_at) {
    r.queue_s = seconds(*part.progress->scheduled_at - arrival);
    if (first) r.prefill_s = seconds(*first - *part.progress->scheduled_at);
  }
  if (first) {
    r.ttft_s = seconds(*first - arrival);
    r.decode_s = seconds(end - *first);
  }
  hooks_.record(r);
}

Usage Generation::usage() const {
  Usage u;
  for (const PromptInput& p : plan_.prompts) u.prompt_tokens += static_cast<int64_t>(p.tokens.size());
  for (const Choice& ch : choices_) u.completion_tokens += ch.output.n_tokens();
  for (const Part& part : parts_) u.cached_tokens += part.progress->cached_prompt_tokens;
  return u;
}

void Generation::finish_response() {
  responded_ = true;
  if (abandoned_) return;
  const Usage u = usage();
  const bool chat = plan_.endpoint == Endpoint::Chat;
  const std::optional<ApiError> error =
      error_ ? std::optional<ApiError>(ApiError(500, *error_, "server_error", std::nullopt, "engine_error"))
             : std::nullopt;
  log_access(error ? error->status : 200);
  if (plan_.options.stream) {
    if (error) exchange_->write(error_event(*error));
    if (plan_.options.include_usage)
      exchange_->write(sse_event(
          usage_chunk(chat ? "chat.completion.chunk" : "text_completion", plan_.id, plan_.created, model_.name, u)));
    exchange_->write(std::string(kSseDone));
    exchange_->end_stream();
    return;
  }
  if (error) {
    exchange_->respond(error_response(*error));
    return;
  }
  ojson choices = ojson::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    Choice& ch = choices_[i];
    const int index = static_cast<int>(i);
    ojson lp = take_logprobs(ch);
    if (chat && plan_.tool_format)
      choices.push_back(tool_choice_json(ch, index, std::move(lp)));
    else
      choices.push_back(chat ? chat_choice(index, ch.text, std::move(lp), ch.finish, ch.stop_reason)
                             : completion_choice(index, ch.text, std::move(lp), ch.finish, ch.stop_reason));
  }
  ojson body = chat ? chat_response(plan_.id, plan_.created, model_.name, std::move(choices), u)
                    : completion_response(plan_.id, plan_.created, model_.name, std::move(choices), u);
  if (plan_.kv.lease_seconds > 0) body["kv_transfer_params"] = lease_params();
  http::Response response;
  response.body = dump_json(body);
  exchange_->respond(std::move(response));
}

}  // namespace tessera::api

namespace tessera::api {

ojson Generation::lease_params() {
  // The lease is published before the request's last event: it is in the progress by now.
  const std::shared_ptr<const RequestProgress> progress = parts_.at(0).stream->progress();
  std::optional<disagg::KvHandle> handle;
  if (progress->kv_lease && progress->kv_lease->n_blocks > 0) {
    handle.emplace();
    handle->host = plan_.kv.server_host;
    handle->port = plan_.kv.server_port;
    handle->lease = progress->kv_lease->id;
    handle->n_blocks = progress->kv_lease->n_blocks;
  } else if (progress->kv_lease) {
    engine_.release_kv_lease(progress->kv_lease->id);  // no full block: nothing to pull
  }
  return kv_transfer_params_json(handle);
}

void Generation::log_access(int status) {
  if (logged_ || !hooks_.access_log) return;
  logged_ = true;
  const Clock::time_point now = Clock::now();
  AccessRecord r;
  r.request_id = plan_.id;
  r.tenant = plan_.tenant;
  r.status = status;
  const Usage u = usage();
  r.prompt_tokens = u.prompt_tokens;
  r.output_tokens = u.completion_tokens;
  r.cached_tokens = u.cached_tokens;
  const Clock::time_point arrival = exchange_->request().received_at;
  std::optional<Clock::time_point> first;
  for (const Choice& ch : choices_)
    if (ch.first_token && (!first || *ch.first_token < *first)) first = ch.first_token;
  if (first) r.ttft_s = seconds(*first - arrival);
  r.e2e_s = seconds(now - arrival);
  // One reason for the whole request: the highest-indexed choice that has one.
  for (const Choice& ch : choices_)
    if (ch.finish != FinishReason::None) r.finish_reason = finish_reason_string(ch.finish);
  hooks_.access_log(r);
}

void Generation::release_tool_text(Choice& ch, int index, const std::string& text, std::optional<FinishReason> finish) {
  ToolParserOutput out = ch.tools->push(text);
  if (finish) {
    ToolParserOutput rest = ch.tools->finish();
    out.content += rest.content;
    for (ToolCallDelta& d : rest.calls) out.calls.push_back(std::move(d));
  }
  auto write = [&](ojson delta, std::optional<FinishReason> fin) {
    ojson chunk = chat_chunk(plan_.id, plan_.created, model_.name, index, std::move(delta), take_logprobs(ch), fin,
                             fin ? ch.stop_reason : ojson(nullptr));
    // A choice that made calls and then stopped (EOS, a stop string) ends in "tool_calls".
    if (fin == FinishReason::Stop && !ch.tools->calls().empty() && !ch.tools->broken())
      chunk["choices"][0]["finish_reason"] = std::string(kToolCallsFinish);
    exchange_->write(sse_event(chunk));
  };
  // Content first, then each call delta in order, as OpenAI streams them; logprobs ride on the
  // first chunk written (or wait for the next).
  if (!out.content.empty()) write(ojson{{"content", out.content}}, std::nullopt);
  for (const ToolCallDelta& d : out.calls)
    write(ojson{{"tool_calls", ojson::array({tool_call_delta_json(d)})}}, std::nullopt);
  if (finish) write(ojson::object(), finish);
}

ojson Generation::tool_choice_json(Choice& ch, int index, ojson logprobs) const {
  const ParsedToolOutput parsed = parse_tool_output(*plan_.tool_format, ch.text);
  ojson message{{"role", "assistant"}};
  if (parsed.calls.empty()) {
    message["content"] = parsed.content;
    return chat_message_choice(index, std::move(message), std::move(logprobs), finish_reason_string(ch.finish),
                               ch.stop_reason);
  }
  message["content"] = parsed.content.empty() ? ojson(nullptr) : ojson(parsed.content);
  ojson calls = ojson::array();
  for (const ToolCall& call : parsed.calls) calls.push_back(tool_call_json(call));
  message["tool_calls"] = std::move(calls);
  const std::string finish =
      ch.finish == FinishReason::Stop ? std::string(kToolCallsFinish) : finish_reason_string(ch.finish);
  return chat_message_choice(index, std::move(message), std::move(logprobs), finish, ch.stop_reason);
}

}  // namespace tessera::api
