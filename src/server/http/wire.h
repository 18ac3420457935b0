#pragma once
// HTTP/1.1 response framing: status lines, header blocks, chunks. Pure functions over
// strings, so the connection code only decides *what* to send.
#include <cstddef>
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include "server/http/exchange.h"

namespace tessera::http::wire {

// "Not Found" for 404; "Unknown" for codes without a registered phrase.
std::string_view reason_phrase(int status);

// RFC 7231 IMF-fixdate, e.g. "Sun, 29 Nov 2026 13:19:12 GMT".
std::string http_date(std::time_t t);

// A header a handler may set: a token name and a value without CR, LF or NUL, and not one
// of the framing headers the transport owns (Content-Length, Transfer-Encoding,
// Connection, Content-Type: that one comes from Response::content_type).
bool handler_header_allowed(std::string_view name, std::string_view value);

enum class Persistence { KeepAlive, Close, Default };  // Default: no Connection header

struct Head {
  int status = 200;
  std::string_view content_type;         // omitted when empty
  std::optional<size_t> content_length;  // omitted when absent
  bool chunked = false;                  // Transfer-Encoding: chunked
  Persistence persistence = Persistence::Default;
  const Headers* extra = nullptr;  // filtered through handler_header_allowed
  std::string_view cache_control;  // omitted when empty
};

// The status line and header block, ending with the empty line.
std::string format_head(const Head& head);

// One chunk of a chunked body: "<hex size>\r\n<data>\r\n". data must not be empty (an
// empty chunk ends the body).
std::string chunk(std::string_view data);
inline constexpr std::string_view kLastChunk = "0\r\n\r\n";

// Statuses that never carry a body (1xx, 204, 304).
bool status_has_no_body(int status);

}  // namespace tessera::http::wire
