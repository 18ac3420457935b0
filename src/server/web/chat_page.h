#pragma once
// The chat page served at GET /: one self-contained HTML document (inline CSS and JS, no
// external URLs) that talks to the OpenAI-compatible endpoints of the same origin.
// Contract: docs/design/web-ui.md.
#include <string_view>

namespace tessera::web {

// The page, UTF-8, to be served as "text/html; charset=utf-8". Static storage: valid for the
// life of the program.
std::string_view chat_page_html();

}  // namespace tessera::web
