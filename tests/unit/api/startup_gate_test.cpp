// The listener before the model: while loading, /health is 200 (alive), /version answers,
// and every other request (including /ready and generations, refused from the headers alone)
// is 503 model_loading with Retry-After.
#include "server/api/startup_gate.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "fake_exchange.h"

using namespace tessera;
using nlohmann::json;

namespace {

http::Request request(const std::string& method, const std::string& path) {
  http::Request r;
  r.method = method;
  r.path = r.target = path;
  return r;
}

TEST(StartupGate, WhileLoadingHealthIsAliveAndReadyIsModelLoading) {
  api::StartupGate gate;
  EXPECT_FALSE(gate.is_open());
  api_test::FakeExecutor executor;
  auto answer = [&](const std::string& method, const std::string& path) {
    auto ex = std::make_shared<api_test::FakeExchange>(executor, request(method, path));
    gate.handle(ex);
    EXPECT_TRUE(ex->wait_done());
    return ex->response();
  };
  EXPECT_EQ(answer("GET", "/health").status, 200);
  EXPECT_EQ(answer("HEAD", "/health").status, 200);
  const http::Response version = answer("GET", "/version");
  EXPECT_EQ(version.status, 200);
  EXPECT_TRUE(json::parse(version.body)["version"].is_string());

  for (const auto& [method, path] : {std::pair<std::string, std::string>{"GET", "/ready"},
                                     {"HEAD", "/ready"},
                                     {"POST", "/v1/chat/completions"},
                                     {"GET", "/v1/models"}}) {
    const http::Response r = answer(method, path);
    EXPECT_EQ(r.status, 503) << method << " " << path;
    EXPECT_EQ(json::parse(r.body)["error"]["code"], "model_loading") << path;
    ASSERT_FALSE(r.headers.empty());
    EXPECT_EQ(r.headers[0].first, "Retry-After");
  }
}

TEST(StartupGate, HeaderFilterRefusesBodiesWhileLoading) {
  api::StartupGate gate;
  const auto refused = gate.filter_headers(request("POST", "/v1/completions"));
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 503);
  EXPECT_FALSE(gate.filter_headers(request("GET", "/health")));
}

}  // namespace
