#include "benchharness/sse.h"

#include <nlohmann/json.hpp>

namespace tessera::bench {

void SseParser::feed(std::string_view bytes) {
  for (char c : bytes) {
    if (c == '\n' && last_was_cr_) {  // the \n of a \r\n pair: the line already ended at \r
      last_was_cr_ = false;
      continue;
    }
    last_was_cr_ = (c == '\r');
    if (c == '\n' || c == '\r') {
      line(line_);
      line_.clear();
    } else {
      line_.push_back(c);
    }
  }
}

void SseParser::line(std::string_view l) {
  if (l.empty()) {
    if (has_data_) on_event_(data_);
    data_.clear();
    has_data_ = false;
    return;
  }
  if (l.front() == ':') return;  // comment (keep-alive)
  const size_t colon = l.find(':');
  const std::string_view field = l.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view{} : l.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field != "data") return;
  if (has_data_) data_.push_back('\n');
  data_.append(value);
  has_data_ = true;
}

ChunkInfo parse_openai_chunk(std::string_view data) {
  ChunkInfo c;
  if (data == "[DONE]") {
    c.done = true;
    return c;
  }
  const auto j = nlohmann::json::parse(data, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return c;
  c.is_json = true;
  if (const auto e = j.find("error"); e != j.end()) {
    if (e->is_object() && e->contains("message") && (*e)["message"].is_string())
      c.error = (*e)["message"];
    else
      c.error = e->dump();
  }
  if (const auto ch = j.find("choices"); ch != j.end() && ch->is_array() && !ch->empty()) {
    const auto& c0 = (*ch)[0];
    if (c0.is_object()) {
      if (const auto d = c0.find("delta"); d != c0.end() && d->is_object()) {
        if (const auto ct = d->find("content"); ct != d->end() && ct->is_string()) c.text = ct->get<std::string>();
      } else if (const auto t = c0.find("text"); t != c0.end() && t->is_string()) {
        c.text = t->get<std::string>();
      }
      if (const auto f = c0.find("finish_reason"); f != c0.end() && f->is_string()) c.finish_reason = *f;
    }
  }
  if (const auto u = j.find("usage"); u != j.end() && u->is_object()) {
    c.has_usage = true;
    if (u->contains("prompt_tokens") && (*u)["prompt_tokens"].is_number_integer())
      c.prompt_tokens = (*u)["prompt_tokens"];
    if (u->contains("completion_tokens") && (*u)["completion_tokens"].is_number_integer())
      c.completion_tokens = (*u)["completion_tokens"];
  }
  if (const auto t = j.find("timings"); t != j.end() && t->is_object()) {
    if (t->contains("queue_ms") && (*t)["queue_ms"].is_number()) c.queue_ms = (*t)["queue_ms"];
  }
  return c;
}

}  // namespace tessera::bench
