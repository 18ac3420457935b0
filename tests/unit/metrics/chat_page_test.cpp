// The chat page is one self-contained document: no external URLs, every control labelled,
// and the element ids the browser test (tests/e2e/test_web_page.py) drives are present.
// It lives beside the metrics tests because both are what the server exposes besides the API.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>

#include "server/web/chat_page.h"

namespace tessera {
namespace {

std::string page() { return std::string(web::chat_page_html()); }

TEST(ChatPage, IsAFullHtmlDocument) {
  const std::string html = page();
  ASSERT_GT(html.size(), 1000u);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("<html lang=\"en\">"), std::string::npos);
  EXPECT_NE(html.find("<meta charset=\"utf-8\">"), std::string::npos);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  EXPECT_EQ(html.find('\0'), std::string::npos);
}

TEST(ChatPage, LoadsNothingFromElsewhere) {
  const std::string html = page();
  // Absolute URLs would break offline use and leak the visit; everything is inline.
  for (const char* needle : {"http://", "https://", "@import", "<script src", "url("})
    EXPECT_EQ(html.find(needle), std::string::npos) << needle;
  // The only references allowed: in-page anchors and data: URLs (the empty favicon, which
  // spares the browser a request for /favicon.ico).
  const std::regex reference(R"re(\b(src|href)="([^"]*)")re");
  int seen = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), reference); it != std::sregex_iterator(); ++it) {
    const std::string target = (*it)[2];
    EXPECT_TRUE(target.rfind("#", 0) == 0 || target.rfind("data:", 0) == 0) << target;
    ++seen;
  }
  EXPECT_GE(seen, 2);
}

TEST(ChatPage, UsesTheApiItDocuments) {
  const std::string html = page();
  for (const char* needle : {"/v1/chat/completions", "/v1/models", "stream: true", "include_usage", "getReader",
                             "AbortController", "localStorage", "Authorization", "[DONE]", "body.error"})
    EXPECT_NE(html.find(needle), std::string::npos) << needle;
}

TEST(ChatPage, HasTheControlsTheBrowserTestDrives) {
  const std::string html = page();
  for (const char* id :
       {"model", "system", "temperature", "top_p", "max_tokens", "seed", "api_key", "prompt", "send", "stop", "log"})
    EXPECT_NE(html.find(std::string("id=\"") + id + "\""), std::string::npos) << id;
  for (const char* stat : {"ttft", "tps", "tokens"})
    EXPECT_NE(html.find(std::string("\"") + stat + "\", \""), std::string::npos) << stat;
}

TEST(ChatPage, EveryVisibleFormControlHasALabel) {
  const std::string html = page();
  std::set<std::string> labelled;
  const std::regex label_for(R"re(<label for="([^"]+)")re");
  for (auto it = std::sregex_iterator(html.begin(), html.end(), label_for); it != std::sregex_iterator(); ++it)
    labelled.insert((*it)[1]);
  const std::regex control(R"re(<(input|select|textarea)([^>]*)>)re");
  const std::regex id_attr(R"re(\bid="([^"]+)")re");
  int checked = 0;
  for (auto it = std::sregex_iterator(html.begin(), html.end(), control); it != std::sregex_iterator(); ++it) {
    const std::string attrs = (*it)[2];
    if (attrs.find("aria-hidden=\"true\"") != std::string::npos) continue;  // mirrors a labelled input
    std::smatch id;
    ASSERT_TRUE(std::regex_search(attrs, id, id_attr)) << (*it)[0];
    EXPECT_TRUE(labelled.count(id[1])) << "no <label for> for #" << id[1];
    ++checked;
  }
  EXPECT_EQ(checked, 8);  // model, system, temperature, top_p, max_tokens, seed, api_key, prompt
}

}  // namespace
}  // namespace tessera
