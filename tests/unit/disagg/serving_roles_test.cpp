// The serving surface of disaggregation: kv_transfer_params as the workers read and write it
// (a bad handle is a 400 naming the field), and the router's worker URLs.
#include <gtest/gtest.h>

#include <string>

#include "server/api/api_error.h"
#include "server/api/json_fields.h"
#include "server/api/kv_transfer_params.h"
#include "server/router/upstream.h"

using namespace tessera;
using namespace tessera::api;

namespace {

ApiError parse_error(const std::string& body) {
  try {
    parse_kv_transfer_params(parse_json_body(body));
  } catch (const ApiError& e) {
    return e;
  }
  ADD_FAILURE() << "no ApiError for " << body;
  return ApiError(0, "", "", std::nullopt, std::nullopt);
}

}  // namespace

TEST(KvTransferParams, AbsentOrNullIsNone) {
  EXPECT_FALSE(parse_kv_transfer_params(parse_json_body(R"({"prompt": "hi"})")).has_value());
  EXPECT_FALSE(parse_kv_transfer_params(parse_json_body(R"({"kv_transfer_params": null})")).has_value());
}

TEST(KvTransferParams, PrefillRequestHasNoHandle) {
  const auto p = parse_kv_transfer_params(parse_json_body(
      R"({"kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false,
          "remote_handle": null, "remote_block_count": null}})"));
  ASSERT_TRUE(p.has_value());
  EXPECT_TRUE(p->do_remote_decode);
  EXPECT_FALSE(p->do_remote_prefill);
  EXPECT_FALSE(p->handle.has_value());
}

TEST(KvTransferParams, TheAnswerReadsBackAsTheSameHandle) {
  disagg::KvHandle h;
  h.host = "10.0.0.5";
  h.port = 7100;
  h.lease = 42;
  h.n_blocks = 6;
  const ojson answer = kv_transfer_params_json(h);
  EXPECT_EQ(answer["remote_handle"], "10.0.0.5:7100/42");
  EXPECT_EQ(answer["remote_block_count"], 6);
  EXPECT_EQ(answer["do_remote_prefill"], true);
  const auto p = parse_kv_transfer_params(json{{"kv_transfer_params", json::parse(answer.dump())}});
  ASSERT_TRUE(p && p->handle);
  EXPECT_TRUE(p->do_remote_prefill);
  EXPECT_EQ(p->handle->host, "10.0.0.5");
  EXPECT_EQ(p->handle->port, 7100);
  EXPECT_EQ(p->handle->lease, 42u);
  EXPECT_EQ(p->handle->n_blocks, 6);
  // No full block to lease: a null handle, which a decode worker reads as "prefill here".
  const ojson none = kv_transfer_params_json(std::nullopt);
  EXPECT_TRUE(none["remote_handle"].is_null());
  const auto q = parse_kv_transfer_params(json{{"kv_transfer_params", json::parse(none.dump())}});
  ASSERT_TRUE(q.has_value());
  EXPECT_FALSE(q->handle.has_value());
}

TEST(KvTransferParams, BadHandlesAre400sNamingTheField) {
  struct Case {
    const char* body;
    const char* param;
    const char* message_part;
  };
  const Case cases[] = {
      {R"({"kv_transfer_params": "127.0.0.1:7100/3"})", "kv_transfer_params", "must be an object, not string"},
      {R"({"kv_transfer_params": {"do_remote_prefill": true, "remote_handle": "127.0.0.1/3", "remote_block_count": 2}})",
       "kv_transfer_params.remote_handle", "is not host:port/id"},
      {R"({"kv_transfer_params": {"do_remote_prefill": true, "remote_handle": "h:99999/3", "remote_block_count": 2}})",
       "kv_transfer_params.remote_handle", "port 1..65535"},
      {R"({"kv_transfer_params": {"do_remote_prefill": true, "remote_handle": "h:7100/x", "remote_block_count": 2}})",
       "kv_transfer_params.remote_handle", "id a number"},
      {R"({"kv_transfer_params": {"do_remote_prefill": true, "remote_handle": 7, "remote_block_count": 2}})",
       "kv_transfer_params.remote_handle", "string"},
      {R"({"kv_transfer_params": {"do_remote_prefill": true, "remote_handle": "h:7100/3"}})",
       "kv_transfer_params.remote_block_count", "needs remote_block_count"},
      {R"({"kv_transfer_params": {"do_remote_prefill": true, "remote_handle": "h:7100/3", "remote_block_count": -1}})",
       "kv_transfer_params.remote_block_count", ""},
      {R"({"kv_transfer_params": {"remote_handle": "h:7100/3", "remote_block_count": 2}})",
       "kv_transfer_params.do_remote_prefill", "needs do_remote_prefill = true"},
      {R"({"kv_transfer_params": {"do_remote_prefill": "yes"}})", "kv_transfer_params.do_remote_prefill", ""},
      {R"({"kv_transfer_params": {"do_remote_prefill": true, "remote_block_count": 4}})",
       "kv_transfer_params.remote_handle", "remote_handle is missing"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body);
    const ApiError e = parse_error(c.body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param.value_or("<null>"), c.param) << e.what();
    EXPECT_NE(std::string(e.what()).find(c.message_part), std::string::npos) << e.what();
  }
}

TEST(RouterUrls, ParseHostPortAndPrefix) {
  using tessera::router::UpstreamUrl;
  const UpstreamUrl a = UpstreamUrl::parse("http://127.0.0.1:8100");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, "8100");
  EXPECT_EQ(a.prefix, "");
  EXPECT_EQ(a.text, "http://127.0.0.1:8100");
  const UpstreamUrl b = UpstreamUrl::parse("http://worker-3/v1/");  // the /v1 of a base URL is dropped
  EXPECT_EQ(b.host, "worker-3");
  EXPECT_EQ(b.port, "80");
  EXPECT_EQ(b.prefix, "");
  const UpstreamUrl c = UpstreamUrl::parse("http://[::1]:9000/proxy");
  EXPECT_EQ(c.host, "::1");
  EXPECT_EQ(c.port, "9000");
  EXPECT_EQ(c.prefix, "/proxy");
  EXPECT_EQ(c.text, "http://[::1]:9000/proxy");
  for (const char* bad :
       {"https://h:1", "127.0.0.1:8000", "http://:8000", "http://h:0", "http://h:123456", "http://h:8o"}) {
    SCOPED_TRACE(bad);
    try {
      UpstreamUrl::parse(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
    }
  }
}
