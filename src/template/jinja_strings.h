#pragma once
// Python str semantics over UTF-8: whitespace per str.isspace, code-point based stripping and
// splitting. Case mapping (upper/lower/title/capitalize) covers ASCII letters only.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::jinja::pystr {

bool is_space(std::string_view ch);  // one UTF-8 character
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
// str.split(sep, maxsplit) / str.rsplit: sep empty optional means runs of whitespace.
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right);
std::vector<std::string> splitlines(std::string_view s, bool keepends);
std::string replace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
std::string upper(std::string_view s);
std::string lower(std::string_view s);
std::string capitalize(std::string_view s);
std::string title(std::string_view s);  // str.title()

}  // namespace tessera::jinja::pystr
