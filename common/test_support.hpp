/// @file test_support.hpp
/// @brief Small helpers shared by the tests: where golden data lives, fresh random inputs.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bf16.hpp"

namespace bielik {

/// Path of a golden case written by golden/gen_<chapter>.py, e.g.
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

}  // namespace bielik
