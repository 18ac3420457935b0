#include "engine/kv_scales.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessera {

namespace {
std::vector<std::vector<float>> read_rows(const nlohmann::json& j, const char* key, const std::string& path) {
  TESSERA_CHECK(j.contains(key) && j[key].is_array(), "KV scales ", path, ": no array \"", key, "\"");
  std::vector<std::vector<float>> rows;
  for (const auto& row : j[key]) {
    TESSERA_CHECK(row.is_array() && !row.empty(), "KV scales ", path, ": \"", key, "\" row ", rows.size(),
                  " is not a non-empty array");
    std::vector<float> r;
    for (const auto& v : row) {
      TESSERA_CHECK(v.is_number(), "KV scales ", path, ": \"", key, "\" row ", rows.size(), " holds a non-number");
      const float s = v.get<float>();
      TESSERA_CHECK(std::isfinite(s) && s > 0, "KV scales ", path, ": \"", key, "\" row ", rows.size(), " has scale ",
                    s, " (finite, > 0)");
      r.push_back(s);
    }
    TESSERA_CHECK(rows.empty() || r.size() == rows.front().size() || r.size() == 1 || rows.front().size() == 1,
                  "KV scales ", path, ": \"", key, "\" rows of different lengths");
    rows.push_back(std::move(r));
  }
  return rows;
}
}  // namespace

KvScales read_kv_scales(const std::string& path) {
  std::ifstream in(path);
  TESSERA_CHECK(in.good(), "KV scales: cannot open ", path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail("KV scales ", path, ": not JSON (", e.what(), ")");
  }
  TESSERA_CHECK(j.is_object(), "KV scales ", path, ": not a JSON object");
  KvScales s;
  if (j.contains("model") && j["model"].is_string()) s.model = j["model"].get<std::string>();
  s.k = read_rows(j, "k_scales", path);
  s.v = read_rows(j, "v_scales", path);
  TESSERA_CHECK(s.k.size() == s.v.size() && !s.k.empty(), "KV scales ", path, ": ", s.k.size(), " K rows and ",
                s.v.size(), " V rows (one per layer each)");
  return s;
}

void write_kv_scales(const std::string& path, const KvScales& scales, const std::string& k_format,
                     const std::string& v_format, int n_kv_heads) {
  nlohmann::json j;
  j["model"] = scales.model;
  j["k_format"] = k_format;
  j["v_format"] = v_format;
  j["n_layers"] = scales.k.size();
  j["n_kv_heads"] = n_kv_heads;
  j["k_scales"] = scales.k;
  j["v_scales"] = scales.v;
  std::ofstream out(path);
  TESSERA_CHECK(out.good(), "KV scales: cannot write ", path);
  out << j.dump(1) << '\n';
  TESSERA_CHECK(out.good(), "KV scales: writing ", path, " failed");
}

void apply_checkpoint_kv_scales(const ModelWeights& weights, KvCacheSpec& spec) {
  const auto apply = [&](const KvFormat& f, const std::vector<float>& from, std::vector<std::vector<float>>& to) {
    if (!f.is_fp8() || f.scale != KvScale::Tensor || !to.empty() || from.empty()) return;
    for (float s : from) to.push_back({s});
  };
  apply(spec.k_format, weights.k_scale, spec.k_scales);
  apply(spec.v_format, weights.v_scale, spec.v_scales);
}

}  // namespace tessera
