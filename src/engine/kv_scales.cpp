#include "engine/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace tessera {

namespace {
// Rows of numbers under `key`; positive: every value finite and > 0 (scales), else finite.
std::vector<std::vector<float>> read_rows(const nlohmann::json& j, const char* key, const std::string& path,
                                          bool positive) {
  TESSERA_CHECK(j.contains(key) && j[key].is_array(), "KV scales ", path, ": no array \"", key, "\"");
  std::vector<std::vector<float>> rows;
  for (const auto& row : j[key]) {
    TESSERA_CHECK(row.is_array() && !row.empty(), "KV scales ", path, ": \"", key, "\" row ", rows.size(),
                  " is not a non-empty array");
    std::vector<float> r;
    for (const auto& v : row) {
      TESSERA_CHECK(v.is_number(), "KV scales ", path, ": \"", key, "\" row ", rows.size(), " holds a non-number");
      const float s = v.get<float>();
      TESSERA_CHECK(std::isfinite(s) && (!positive || s > 0), "KV scales ", path, ": \"", key, "\" row ", rows.size(),
                    positive ? " has scale " : " has value ", s, positive ? " (finite, > 0)" : " (not finite)");
      r.push_back(s);
    }
    TESSERA_CHECK(
        rows.empty() || r.size() == rows.front().size() || (positive && (r.size() == 1 || rows.front().size() == 1)),
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
  s.k = read_rows(j, "k_scales", path, true);
  s.v = read_rows(j, "v_scales", path, true);
  if (j.contains("k_mean")) s.k_mean = read_rows(j, "k_mean", path, false);
  if (j.contains("k_equal")) {
    s.k_equal = read_rows(j, "k_equal", path, true);
    TESSERA_CHECK(!s.k_mean.empty(), "KV scales ", path,
                  ": \"k_equal\" without \"k_mean\" (the equalization "
                  "applies to centered keys)");
    TESSERA_CHECK(s.k_equal.size() == s.k_mean.size(), "KV scales ", path, ": ", s.k_equal.size(),
                  " \"k_equal\" rows and ", s.k_mean.size(), " \"k_mean\" rows (one per layer each)");
    for (size_t l = 0; l < s.k_equal.size(); ++l)
      TESSERA_CHECK(s.k_equal[l].size() == s.k_mean[l].size(), "KV scales ", path, ": \"k_equal\" row ", l, " has ",
                    s.k_equal[l].size(), " values, \"k_mean\" row ", s.k_mean[l].size());
  }
  if (j.contains("k_rope")) {
    const auto& r = j["k_rope"];
    TESSERA_CHECK(r.is_object() && r.contains("rot_dim") && r["rot_dim"].is_number_integer() && r.contains("neox") &&
                      r["neox"].is_boolean(),
                  "KV scales ", path, ": \"k_rope\" is not an object with integer \"rot_dim\" and boolean \"neox\"");
    s.rope_dim = r["rot_dim"].get<int>();
    s.rope_neox = r["neox"].get<bool>();
    TESSERA_CHECK(s.rope_dim > 0 && s.rope_dim % 2 == 0, "KV scales ", path, ": \"k_rope\" rot_dim ", s.rope_dim,
                  " (even, > 0)");
    s.rope_inv_freq = read_rows(r, "inv_freq", path, false);
    s.rope_mean = read_rows(r, "mean", path, false);
    s.rope_equal = read_rows(r, "equal", path, true);
    TESSERA_CHECK(
        s.rope_equal.size() == s.rope_mean.size() && s.rope_equal.front().size() == s.rope_mean.front().size(),
        "KV scales ", path, ": \"k_rope\" \"equal\" rows differ from its \"mean\" rows in shape");
    TESSERA_CHECK(!s.k_mean.empty() && s.rope_mean.size() == s.k_mean.size() &&
                      s.rope_inv_freq.size() == s.k_mean.size() &&
                      s.rope_mean.front().size() == s.k_mean.front().size(),
                  "KV scales ", path,
                  ": \"k_rope\" needs \"k_mean\" beside it and one \"mean\" and \"inv_freq\" row "
                  "per layer of k_mean's length / rot_dim / 2");
    for (const auto& f : s.rope_inv_freq)
      TESSERA_CHECK(f.size() == static_cast<size_t>(s.rope_dim / 2), "KV scales ", path,
                    ": \"k_rope\" inv_freq row of ", f.size(), " values for rot_dim ", s.rope_dim);
  }
  if (j.contains("k_first")) {
    s.k_first = read_rows(j, "k_first", path, false);
    TESSERA_CHECK(
        !s.k_mean.empty() && s.k_first.size() == s.k_mean.size() && s.k_first.front().size() == s.k_mean.front().size(),
        "KV scales ", path, ": \"k_first\" needs \"k_mean\" beside it and rows of its shape (", s.k_first.size(),
        " rows for ", s.k_mean.size(), ")");
  }
  TESSERA_CHECK(s.k.size() == s.v.size(), "KV scales ", path, ": ", s.k.size(), " K rows and ", s.v.size(),
                " V rows (one per layer each)");
  TESSERA_CHECK(!s.k.empty() || !s.k_mean.empty(), "KV scales ", path, ": no scales and no \"k_mean\"");
  if (!s.k.empty() && !s.k_mean.empty())
    TESSERA_CHECK(s.k.size() == s.k_mean.size(), "KV scales ", path, ": ", s.k.size(), " scale rows and ",
                  s.k_mean.size(), " \"k_mean\" rows (one per layer each)");
  if (!s.k_mean.empty() && j.contains("n_kv_heads") && j.contains("head_dim")) {
    TESSERA_CHECK(j["n_kv_heads"].is_number_integer() && j["head_dim"].is_number_integer(), "KV scales ", path,
                  ": \"n_kv_heads\" and \"head_dim\" are not integers");
    const int64_t want = j["n_kv_heads"].get<int64_t>() * j["head_dim"].get<int64_t>();
    TESSERA_CHECK(static_cast<int64_t>(s.k_mean.front().size()) == want, "KV scales ", path, ": \"k_mean\" rows of ",
                  s.k_mean.front().size(), " values, n_kv_heads x head_dim is ", want);
  }
  return s;
}

void write_kv_scales(const std::string& path, const KvScales& scales, const std::string& k_format,
                     const std::string& v_format, int n_kv_heads, int head_dim) {
  nlohmann::json j;
  j["model"] = scales.model;
  j["k_format"] = k_format;
  j["v_format"] = v_format;
  j["n_layers"] = std::max(scales.k.size(), scales.k_mean.size());
  j["n_kv_heads"] = n_kv_heads;
  j["head_dim"] = head_dim;
  j["k_scales"] = scales.k.empty() ? nlohmann::json::array() : nlohmann::json(scales.k);
  j["v_scales"] = scales.v.empty() ? nlohmann::json::array() : nlohmann::json(scales.v);
  if (!scales.k_mean.empty()) j["k_mean"] = scales.k_mean;
  if (!scales.k_equal.empty()) j["k_equal"] = scales.k_equal;
  if (!scales.k_first.empty()) {
    j["version"] = 2;
    j["k_first"] = scales.k_first;
  }
  if (scales.rope_dim > 0) {
    j["version"] = 2;
    j["k_rope"] = {{"rot_dim", scales.rope_dim},
                   {"neox", scales.rope_neox},
                   {"inv_freq", scales.rope_inv_freq},
                   {"mean", scales.rope_mean},
                   {"equal", scales.rope_equal}};
  }
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
