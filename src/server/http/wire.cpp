#include "server/http/wire.h"

#include <boost/beast/http/status.hpp>
#include <cstdio>

namespace tessera::http::wire {

namespace bhttp = boost::beast::http;

std::string_view reason_phrase(int status) {
  if (status < 100 || status > 999) return "Unknown";
  const auto known = bhttp::int_to_status(static_cast<unsigned>(status));
  if (known == bhttp::status::unknown) return "Unknown";
  const auto phrase = bhttp::obsolete_reason(known);
  return std::string_view(phrase.data(), phrase.size());
}

std::string http_date(std::time_t t) {
  // Spelled out rather than strftime, which follows the process locale.
  static constexpr const char* kDays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
  static constexpr const char* kMonths[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                            "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%s, %02d %s %04d %02d:%02d:%02d GMT", kDays[tm.tm_wday % 7], tm.tm_mday,
                kMonths[tm.tm_mon % 12], tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
  return buf;
}

namespace {

bool is_token_char(char c) {
  if (c >= 'a' && c <= 'z') return true;
  if (c >= 'A' && c <= 'Z') return true;
  if (c >= '0' && c <= '9') return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

}  // namespace

bool handler_header_allowed(std::string_view name, std::string_view value) {
  if (name.empty()) return false;
  for (char c : name)
    if (!is_token_char(c)) return false;
  for (char c : value)
    if (c == '\r' || c == '\n' || c == '\0') return false;  // no response splitting
  for (std::string_view owned : {"content-length", "transfer-encoding", "connection", "content-type"})
    if (iequals(name, owned)) return false;
  return true;
}

bool status_has_no_body(int status) { return (status >= 100 && status < 200) || status == 204 || status == 304; }

std::string format_head(const Head& head) {
  std::string out;
  out.reserve(256);
  out += "HTTP/1.1 ";
  out += std::to_string(head.status);
  out += ' ';
  out += reason_phrase(head.status);
  out += "\r\nServer: tessera\r\nDate: ";
  out += http_date(std::time(nullptr));
  out += "\r\n";
  if (!head.content_type.empty()) {
    out += "Content-Type: ";
    out += head.content_type;
    out += "\r\n";
  }
  if (!head.cache_control.empty()) {
    out += "Cache-Control: ";
    out += head.cache_control;
    out += "\r\n";
  }
  if (head.content_length) {
    out += "Content-Length: ";
    out += std::to_string(*head.content_length);
    out += "\r\n";
  }
  if (head.chunked) out += "Transfer-Encoding: chunked\r\n";
  if (head.persistence == Persistence::KeepAlive) out += "Connection: keep-alive\r\n";
  if (head.persistence == Persistence::Close) out += "Connection: close\r\n";
  if (head.extra) {
    for (const auto& [name, value] : *head.extra) {
      if (!handler_header_allowed(name, value)) continue;
      out += name;
      out += ": ";
      out += value;
      out += "\r\n";
    }
  }
  out += "\r\n";
  return out;
}

std::string chunk(std::string_view data) {
  char size[24];
  const int n = std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  std::string out;
  out.reserve(static_cast<size_t>(n) + data.size() + 2);
  out.append(size, static_cast<size_t>(n));
  out.append(data);
  out += "\r\n";
  return out;
}

}  // namespace tessera::http::wire
