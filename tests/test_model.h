#pragma once
// Where tests find real model files: $TESSERA_CACHE or ~/.cache/tessera/models, fetched by
// `make test` (scripts/fetch-model.sh). A missing model fails the test: CI always has it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

inline std::string test_model_path(const std::string& file) {
  const char* cache = std::getenv("TESSERA_CACHE");
  const char* home = std::getenv("HOME");
  const std::string dir = cache && *cache ? cache : std::string(home ? home : ".") + "/.cache/tessera/models";
  const std::string path = dir + "/" + file;
  if (!std::filesystem::exists(path)) ADD_FAILURE() << "model file missing: " << path << " (run `make model`)";
  return path;
}
