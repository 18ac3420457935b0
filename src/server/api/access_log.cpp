#include "server/api/access_log.h"

#include <cstdio>

namespace tessera::api {

std::string format_access_log(const AccessRecord& r) {
  char times[96];
  if (r.ttft_s)
    std::snprintf(times, sizeof times, "ttft_ms=%.1f e2e_ms=%.1f", *r.ttft_s * 1e3, r.e2e_s * 1e3);
  else
    std::snprintf(times, sizeof times, "ttft_ms=- e2e_ms=%.1f", r.e2e_s * 1e3);
  std::string line = "tessera: request id=" + (r.request_id.empty() ? std::string("-") : r.request_id);
  line += " tenant=" + (r.tenant.empty() ? std::string("-") : r.tenant);
  line += " status=" + std::to_string(r.status);
  line += " finish=" + (r.finish_reason.empty() ? std::string("-") : r.finish_reason);
  line += " prompt_tokens=" + std::to_string(r.prompt_tokens);
  line += " output_tokens=" + std::to_string(r.output_tokens);
  line += " cached_tokens=" + std::to_string(r.cached_tokens);
  line += " ";
  line += times;
  return line;
}

}  // namespace tessera::api
