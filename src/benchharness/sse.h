#pragma once
// Incremental server-sent-events parser (the WHATWG event-stream format as OpenAI-compatible
// servers use it): bytes arrive in arbitrary pieces; every complete event's data is handed
// out. Lines end in \n, \r\n or \r; "data:" lines of one event are joined with \n; comments
// (":...") and other fields are ignored; an empty line ends the event.
#include <functional>
#include <string>
#include <string_view>

namespace tessera::bench {

class SseParser {
 public:
  // on_event receives the data of each event that had at least one data line.
  explicit SseParser(std::function<void(std::string_view data)> on_event) : on_event_(std::move(on_event)) {}
  void feed(std::string_view bytes);
  // Bytes held for an incomplete line or event (a stream that ends here was cut short).
  bool has_partial() const { return !line_.empty() || has_data_; }

 private:
  void line(std::string_view l);
  std::function<void(std::string_view)> on_event_;
  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;
};

// What one OpenAI streaming chunk (chat.completion.chunk or text_completion) carries.
struct ChunkInfo {
  bool done = false;  // the "[DONE]" sentinel
  bool is_json = false;
  std::string text;        // choices[0].delta.content or choices[0].text (may be empty)
  bool has_usage = false;  // a non-null "usage" object
  int64_t prompt_tokens = -1, completion_tokens = -1;
  double queue_ms = -1;  // timings.queue_ms when the server reports it, else -1
  std::string finish_reason;
  std::string error;  // an in-stream {"error": ...}: its message
};
// Never throws: data that is not JSON gives is_json = false.
ChunkInfo parse_openai_chunk(std::string_view data);

}  // namespace tessera::bench
