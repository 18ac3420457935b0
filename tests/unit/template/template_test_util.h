#pragma once
// Fixture loading for the template tests: fixtures are ordered_json so object keys keep the
// order Python gave them (tojson prints them in that order).
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace tessera::test {

inline std::string read_template_fixture(const std::string& name) {
  const std::string path = std::string(TESSERA_FIXTURES_DIR) + "/templates/" + name;
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::ordered_json load_template_fixture(const std::string& name) {
  return nlohmann::ordered_json::parse(read_template_fixture(name));
}

// The generator pins strftime_now to 2026-11-29 13:45:07 (a Sunday).
inline std::tm fixture_now() {
  std::tm t{};
  t.tm_year = 2026 - 1900;
  t.tm_mon = 10;
  t.tm_mday = 29;
  t.tm_hour = 13;
  t.tm_min = 45;
  t.tm_sec = 7;
  t.tm_wday = 0;
  t.tm_yday = 332;
  return t;
}

}  // namespace tessera::test
