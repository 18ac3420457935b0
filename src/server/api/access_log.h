#pragma once
// One access-log line per finished generation request (completions and chat, answered or
// refused), written by the server unless --disable-log-requests:
//   tessera: request id=chatcmpl-... tenant=key-1a2b3c4d5e6f status=200 finish=stop
//     prompt_tokens=12 output_tokens=30 cached_tokens=0 ttft_ms=41.2 e2e_ms=388.0
// (one line). The tenant is the short hash of the API key ("-" without keys): never the key.
#include <cstdint>
#include <optional>
#include <string>

namespace tessera::api {

struct AccessRecord {
  std::string request_id;     // "cmpl-..." / "chatcmpl-..."; "" (written "-") if refused before one
  std::string tenant;         // Tenant::name ("key-" + 12 hex digits of SHA-256), "" anonymous
  int status = 200;           // HTTP status of the answer; 499: the client went away first
  std::string finish_reason;  // of the highest-indexed finished choice ("stop", ...); "" if none
  int64_t prompt_tokens = 0;
  int64_t output_tokens = 0;
  int64_t cached_tokens = 0;     // prompt tokens served from the prefix cache
  std::optional<double> ttft_s;  // arrival -> first token; none without a token
  double e2e_s = 0;              // arrival -> answer complete
};

std::string format_access_log(const AccessRecord& record);

}  // namespace tessera::api
