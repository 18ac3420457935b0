#pragma once
// `tessera bench offline` rows in the serve report's schema ("tessera.bench.serve/1"), so
// `tessera bench compare` reads both: one run per (concurrency, prefix cache) row, with the
// summary fields the offline bench measures (requests/s, tokens/s, TTFT, ITL, TPOT and
// end-to-end latency, all from t = 0 when every request arrives).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine_offline.h"

namespace tessera::bench {

// `config` is copied into the report's "config" (model, prompt/generation lengths, ...).
nlohmann::json offline_report_json(const std::vector<OfflineBenchRow>& rows, nlohmann::json config);

// The markdown table `bench offline` prints: one line per row, the latency columns from the
// same summaries (numpy's percentiles) as the JSON report.
std::string format_offline_table(const std::vector<OfflineBenchRow>& rows);

}  // namespace tessera::bench
