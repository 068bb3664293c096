/// @file test_support.hpp
/// @brief Small helpers shared by the tests: where golden data lives, fresh random inputs.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bf16.hpp"

namespace bielik {

/// Path of a golden case written by `golden/gen_<chapter>.py`, e.g.
/// golden_path("01_embedding", "odd_table.npy"). The directory is baked in by CMake.
inline std::string golden_path(const std::string& chapter, const std::string& file) {
  return std::string(BIELIK_GOLDEN_DIR) + "/" + chapter + "/" + file;
}

/// A random generator seeded freshly on every run, so each run of a test draws new
/// inputs (the seed is printed by the caller via INFO on failure to reproduce it).
inline uint64_t fresh_seed() { return std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}(); }

/// Normal(0, scale) values already rounded to bf16, returned as bits.
inline std::vector<uint16_t> random_bf16(size_t count, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<uint16_t> bits(count);
  for (auto& b : bits) b = float_to_bf16_bits(normal(engine));
  return bits;
}

/// Uniform integers in [low, high].
inline std::vector<int32_t> random_ints(size_t count, uint64_t seed, int32_t low, int32_t high) {
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<int32_t> uniform(low, high);
  std::vector<int32_t> values(count);
  for (auto& v : values) v = uniform(engine);
  return values;
}

/// The message of the exception of type E that `call` throws, or "" when it throws none,
/// so `REQUIRE(contains(error_of(...), "file.json"))` fails when nothing is thrown.
template <typename E = std::exception, typename F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const E& error) {
    return error.what();
  }
  return "";
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

/// A fresh scratch directory under /tmp for one test, removed with everything in it.
struct TempDir {
  std::string path;
  TempDir() {
    char pattern[] = "/tmp/bielik_test_XXXXXX";
    if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("cannot create a temporary directory in /tmp");
    path = pattern;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// path/name (the file need not exist).
  std::string file(const std::string& name) const { return path + "/" + name; }
  /// Writes `text` to path/name and returns the file's path.
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
    return file(name);
  }
};

}  // namespace bielik
