#include "benchharness/distributions.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace tessera::bench {

namespace {
double number(const nlohmann::json& j, const char* key, const std::string& what) {
  const auto it = j.find(key);
  TESSERA_CHECK(it != j.end(), what, ": missing \"", key, "\"");
  TESSERA_CHECK(it->is_number(), what, ": \"", key, "\" must be a number");
  const double v = it->get<double>();
  TESSERA_CHECK(std::isfinite(v), what, ": \"", key, "\" must be finite");
  return v;
}
}  // namespace

LengthDist LengthDist::fixed(int64_t v) {
  LengthDist d;
  d.kind = Kind::Fixed;
  d.a = static_cast<double>(v);
  return d;
}

int64_t LengthDist::sample(Rng& rng) const {
  double x = 0;
  switch (kind) {
    case Kind::Fixed:
      x = a;
      break;
    case Kind::Uniform:
      return rng.uniform_int(min, max);
    case Kind::Normal:
      x = a + b * rng.normal();
      break;
    case Kind::LogNormal:
      x = std::exp(std::log(a) + b * rng.normal());
      break;
    case Kind::Empirical: {
      double total = 0;
      for (double w : weights) total += w;
      double r = rng.uniform() * total;
      for (size_t i = 0; i < values.size(); ++i) {
        r -= weights[i];
        if (r < 0) return values[i];
      }
      return values.back();
    }
  }
  const double clamped = std::clamp(std::round(x), static_cast<double>(min), static_cast<double>(max));
  return static_cast<int64_t>(clamped);
}

double LengthDist::mean_estimate() const {
  switch (kind) {
    case Kind::Fixed:
      return a;
    case Kind::Uniform:
      return 0.5 * static_cast<double>(min + max);
    case Kind::Normal:
      return a;
    case Kind::LogNormal:
      return a * std::exp(0.5 * b * b);
    case Kind::Empirical: {
      double s = 0, w = 0;
      for (size_t i = 0; i < values.size(); ++i) s += weights[i] * values[i], w += weights[i];
      return s / w;
    }
  }
  return 0;
}

LengthDist LengthDist::from_json(const nlohmann::json& j, const std::string& what) {
  if (j.is_number_integer()) {
    TESSERA_CHECK(j.get<int64_t>() >= 1, what, ": length ", j.get<int64_t>(), " must be at least 1");
    return fixed(j.get<int64_t>());
  }
  TESSERA_CHECK(j.is_object(), what, ": expected a number or an object with \"dist\"");
  TESSERA_CHECK(j.contains("dist") && j["dist"].is_string(), what,
                ": missing \"dist\" (fixed, uniform, normal, "
                "lognormal, empirical)");
  LengthDist d;
  const std::string kind = j["dist"];
  if (j.contains("min")) d.min = static_cast<int64_t>(number(j, "min", what));
  if (j.contains("max")) d.max = static_cast<int64_t>(number(j, "max", what));
  if (kind == "fixed") {
    d.kind = Kind::Fixed;
    d.a = number(j, "value", what);
  } else if (kind == "uniform") {
    d.kind = Kind::Uniform;
    TESSERA_CHECK(j.contains("min") && j.contains("max"), what, ": uniform needs \"min\" and \"max\"");
  } else if (kind == "normal") {
    d.kind = Kind::Normal;
    d.a = number(j, "mean", what);
    d.b = number(j, "std", what);
    TESSERA_CHECK(d.b >= 0, what, ": \"std\" must not be negative");
  } else if (kind == "lognormal") {
    d.kind = Kind::LogNormal;
    d.a = number(j, "median", what);
    d.b = number(j, "sigma", what);
    TESSERA_CHECK(d.a > 0 && d.b >= 0, what, ": lognormal needs median > 0 and sigma >= 0");
  } else if (kind == "empirical") {
    d.kind = Kind::Empirical;
    TESSERA_CHECK(j.contains("values") && j["values"].is_array() && !j["values"].empty(), what,
                  ": empirical needs a non-empty \"values\" array");
    for (const auto& v : j["values"]) {
      TESSERA_CHECK(v.is_number_integer() && v.get<int64_t>() >= 1, what, ": empirical values must be integers >= 1");
      d.values.push_back(v.get<int64_t>());
    }
    if (j.contains("weights")) {
      TESSERA_CHECK(j["weights"].is_array() && j["weights"].size() == d.values.size(), what,
                    ": \"weights\" must be an array as long as \"values\"");
      for (const auto& w : j["weights"]) {
        TESSERA_CHECK(w.is_number() && w.get<double>() >= 0, what, ": weights must be non-negative numbers");
        d.weights.push_back(w.get<double>());
      }
    } else {
      d.weights.assign(d.values.size(), 1.0);
    }
    double total = 0;
    for (double w : d.weights) total += w;
    TESSERA_CHECK(total > 0, what, ": weights sum to zero");
  } else {
    fail(what, ": unknown dist '", kind, "' (fixed, uniform, normal, lognormal, empirical)");
  }
  TESSERA_CHECK(d.min >= 1 && d.min <= d.max, what, ": need 1 <= min <= max, got [", d.min, ", ", d.max, "]");
  return d;
}

LengthDist LengthDist::parse(const std::string& text, const std::string& what) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t colon; (colon = text.find(':', start)) != std::string::npos; start = colon + 1)
    parts.push_back(text.substr(start, colon - start));
  parts.push_back(text.substr(start));
  auto num = [&](size_t i) {
    try {
      size_t used = 0;
      const double v = std::stod(parts.at(i), &used);
      if (used == parts[i].size()) return v;
    } catch (const std::exception&) {
    }
    fail(what, " '", text, "': '", i < parts.size() ? parts[i] : "", "' is not a number");
  };
  nlohmann::json j;
  const std::string& kind = parts[0];
  if (parts.size() == 1) {
    j = {{"dist", "fixed"}, {"value", num(0)}};
  } else if (kind == "uniform" && parts.size() == 3) {
    j = {{"dist", "uniform"}, {"min", num(1)}, {"max", num(2)}};
  } else if ((kind == "normal" || kind == "lognormal") && (parts.size() == 3 || parts.size() == 5)) {
    j = kind == "normal" ? nlohmann::json{{"dist", "normal"}, {"mean", num(1)}, {"std", num(2)}}
                         : nlohmann::json{{"dist", "lognormal"}, {"median", num(1)}, {"sigma", num(2)}};
    if (parts.size() == 5) j["min"] = num(3), j["max"] = num(4);
  } else if (kind == "empirical" && parts.size() == 2) {
    j = {{"dist", "empirical"}, {"values", nlohmann::json::array()}, {"weights", nlohmann::json::array()}};
    std::string item;
    for (size_t pos = 0; pos <= parts[1].size();) {
      const size_t comma = std::min(parts[1].find(',', pos), parts[1].size());
      item = parts[1].substr(pos, comma - pos);
      const size_t eq = item.find('=');
      try {
        j["values"].push_back(std::stoll(item.substr(0, eq)));
        j["weights"].push_back(eq == std::string::npos ? 1.0 : std::stod(item.substr(eq + 1)));
      } catch (const std::exception&) {
        fail(what, " '", text, "': '", item, "' is not value[=weight]");
      }
      pos = comma + 1;
    }
  } else {
    fail(what, " '", text,
         "' is not N, uniform:MIN:MAX, normal:MEAN:STD[:MIN:MAX], lognormal:MEDIAN:SIGMA[:MIN:MAX] "
         "or empirical:V=W,V=W");
  }
  if (j["dist"] == "fixed" || j["dist"] == "uniform") {
    for (const char* k : {"value", "min", "max"})
      if (j.contains(k)) j[k] = static_cast<int64_t>(j[k].get<double>());
  }
  if (j["dist"] == "fixed") return from_json(j["value"], what);
  return from_json(j, what);
}

nlohmann::json LengthDist::to_json() const {
  nlohmann::json j;
  switch (kind) {
    case Kind::Fixed:
      j = {{"dist", "fixed"}, {"value", a}};
      break;
    case Kind::Uniform:
      j = {{"dist", "uniform"}};
      break;
    case Kind::Normal:
      j = {{"dist", "normal"}, {"mean", a}, {"std", b}};
      break;
    case Kind::LogNormal:
      j = {{"dist", "lognormal"}, {"median", a}, {"sigma", b}};
      break;
    case Kind::Empirical:
      j = {{"dist", "empirical"}, {"values", values}, {"weights", weights}};
      break;
  }
  j["min"] = min;
  j["max"] = max;
  return j;
}

std::string LengthDist::describe() const {
  std::ostringstream os;
  switch (kind) {
    case Kind::Fixed:
      os << "fixed(" << a << ")";
      return os.str();
    case Kind::Uniform:
      os << "uniform[" << min << ", " << max << "]";
      return os.str();
    case Kind::Normal:
      os << "normal(mean=" << a << ", std=" << b << ")";
      break;
    case Kind::LogNormal:
      os << "lognormal(median=" << a << ", sigma=" << b << ")";
      break;
    case Kind::Empirical:
      os << "empirical(" << values.size() << " values)";
      break;
  }
  os << " in [" << min << ", " << max << "]";
  return os.str();
}

std::vector<double> ArrivalProcess::times(size_t n, Rng& rng, double max_time) const {
  TESSERA_CHECK(kind != Kind::Trace, "trace arrivals come from the trace file, not a generator");
  TESSERA_CHECK(rate > 0, "request rate ", rate, " must be positive");
  TESSERA_CHECK(burstiness > 0, "burstiness ", burstiness, " must be positive");
  std::vector<double> out;
  out.reserve(std::min<size_t>(n, 1 << 20));
  double t = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isinf(rate)) {
      switch (kind) {
        case Kind::Poisson:
          t += rng.exponential(rate);
          break;
        case Kind::Gamma:
          t += rng.gamma(burstiness, 1.0 / (rate * burstiness));
          break;
        case Kind::Constant:
          t = static_cast<double>(i + 1) / rate;
          break;
        case Kind::Trace:
          break;
      }
    }
    if (max_time > 0 && t > max_time) break;
    out.push_back(t);
  }
  return out;
}

ArrivalProcess::Kind ArrivalProcess::parse_kind(const std::string& name) {
  if (name == "poisson") return Kind::Poisson;
  if (name == "gamma") return Kind::Gamma;
  if (name == "constant") return Kind::Constant;
  if (name == "trace") return Kind::Trace;
  fail("unknown arrival process '", name, "' (poisson, gamma, constant, trace)");
}

std::string ArrivalProcess::name() const {
  switch (kind) {
    case Kind::Poisson:
      return "poisson";
    case Kind::Gamma:
      return "gamma";
    case Kind::Constant:
      return "constant";
    case Kind::Trace:
      return "trace";
  }
  return "?";
}

}  // namespace tessera::bench
