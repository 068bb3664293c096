/// @file test_support.hpp
/// @brief Small helpers shared by the tests: where golden data lives, fresh random inputs.
#pragma once

#include <stdlib.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bf16.hpp"

namespace bielik {

/// Path of a golden case written by `golden/gen_<chapter>.py`, e.g.
/// golden_path("01_embedding", "odd_table.npy"). The directory is baked in by CMake.
inline std::string golden_path(const std::string& chapter, const std::string& file) {
  return std::string(BIELIK_GOLDEN_DIR) + "/" + chapter + "/" + file;
}

/// True when the environment variable `name` is set to anything but "" or "0".
inline bool env_flag(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0' && std::string(value) != "0";
}

/// True when a missing SmolLM2 checkpoint (`make models`) must fail the tests that read
/// it rather than skip them: CI prepares the model and sets BIELIK_REQUIRE_SMOLLM2=1, so
/// that a preparation that silently failed turns those tests red.
inline bool smollm2_required() { return env_flag("BIELIK_REQUIRE_SMOLLM2"); }

/// True when BIELIK_TEST_OWN_KERNELS_ONLY is set: the GPU tests then leave out what runs
/// only through cuBLAS / cuBLASLt (the library baselines, the dispatchers above the
/// GEMV, the cases about the library's own behaviour). scripts/gpu_sanitize.sh sets it
/// under racecheck, where cuBLASLt's closed kernels took most of the time and made every
/// report, while the run is there for this project's shared-memory kernels. `make test`
/// never sets it: there every path runs.
inline bool own_kernels_only() { return env_flag("BIELIK_TEST_OWN_KERNELS_ONLY"); }

/// Whether to leave out `what` (a path through the library): true, with a line saying
/// so, when own_kernels_only(); false otherwise.
inline bool leave_out_library_path(const std::string& what) {
  if (!own_kernels_only()) return false;
  std::printf("BIELIK_TEST_OWN_KERNELS_ONLY: left out %s (runs through cuBLASLt)\n", what.c_str());
  std::fflush(stdout);
  return true;
}

/// True when BIELIK_TEST_SHORT_SWEEPS is set: the tests whose random sweeps run long
/// (chapter 07's decode over up to 3000 keys, its graph replayed token by token) draw
/// shorter ones: the same versions and shapes, on fresh random lengths, fewer keys.
/// scripts/gpu_sanitize.sh sets it under racecheck, which checks every shared-memory
/// access and made those cases run past 300 s; `make test` and memcheck never set it.
inline bool short_sweeps() { return env_flag("BIELIK_TEST_SHORT_SWEEPS"); }

/// `full` normally, `shortened` when short_sweeps(), saying so on stdout with `what`.
inline int sweep_size(int full, int shortened, const std::string& what) {
  if (!short_sweeps()) return full;
  std::printf("BIELIK_TEST_SHORT_SWEEPS: %s %d instead of %d\n", what.c_str(), shortened, full);
  std::fflush(stdout);
  return shortened;
}

/// Under short_sweeps() only: a line with the seconds since the first such line of this
/// process and `what` (the launch about to run), flushed at once. racecheck runs cut at
/// the time limit said only which test case was cut (H100, 2026-12-06: chapter 07's
/// graph replays twice inside v6, its random decode at the first shape), not which launch
/// held them; these lines say where the time went. Silent otherwise.
inline void sweep_progress(const std::string& what) {
  if (!short_sweeps()) return;
  static const auto first = std::chrono::steady_clock::now();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - first).count();
  std::printf("BIELIK_TEST_SHORT_SWEEPS: +%.1f s %s\n", seconds, what.c_str());
  std::fflush(stdout);
}

/// The compute-sanitizer tool the test runs under ("memcheck", "racecheck"), from
/// BIELIK_TEST_SANITIZER, which scripts/gpu_sanitize.sh sets for each run it makes; ""
/// outside it (`make test`, ctest).
inline std::string sanitizer_tool() {
  const char* value = std::getenv("BIELIK_TEST_SANITIZER");
  return value != nullptr ? value : "";
}

/// Whether to leave out `what` because racecheck cannot run it: true under racecheck,
/// with a line naming it and `why` (once per `what`); false otherwise, so `make test`
/// and memcheck always run it. For a launch the tool itself cannot carry through, never
/// for a slow one (those are what SANITIZE_RACECHECK_CASES and short_sweeps() are for).
inline bool leave_out_under_racecheck(const std::string& what, const std::string& why) {
  if (sanitizer_tool() != "racecheck") return false;
  static std::set<std::string> said;
  if (said.insert(what).second) {
    std::printf("BIELIK_TEST_SANITIZER=racecheck: left out %s: %s\n", what.c_str(), why.c_str());
    std::fflush(stdout);
  }
  return true;
}

/// The seed of one test's random inputs: fresh on every run, so each run draws new
/// inputs, or BIELIK_TEST_SEED (a decimal number) to rerun a failure with the inputs it
/// had. Every seed is printed here, as the line to paste, since not every caller INFOs it
/// and a run on the GPU machine is only seen through its log. A value that is not a
/// whole decimal number in range throws, naming the variable, instead of being half read.
inline uint64_t fresh_seed() {
  uint64_t seed = 0;
  const char* text = std::getenv("BIELIK_TEST_SEED");
  if (text != nullptr && *text != '\0') {  // set but empty: unset, as for the other variables
    const std::string value = text;
    errno = 0;
    char* end = nullptr;
    const unsigned long long parsed = std::strtoull(text, &end, 10);
    if (value.find_first_not_of("0123456789") != std::string::npos || errno == ERANGE || *end != '\0') {
      throw std::invalid_argument("BIELIK_TEST_SEED='" + value +
                                  "' is not a seed: give a decimal number in [0, 2^64), as the tests print it");
    }
    seed = parsed;
  } else {
    seed = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  }
  std::printf("seed %llu (BIELIK_TEST_SEED=%llu reruns it)\n", static_cast<unsigned long long>(seed),
              static_cast<unsigned long long>(seed));
  return seed;
}

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

/// A fresh scratch directory under /tmp for one test, removed with everything in it when
/// its owner goes out of scope (move-only: one owner). `label` goes into its name.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& label = "") {
    std::string pattern = "/tmp/bielik_test_" + (label.empty() ? "" : label + "_") + "XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a temporary directory in /tmp");
    path = pattern;
  }
  ~TempDir() { remove(); }
  TempDir(TempDir&& other) noexcept : path(std::move(other.path)) { other.path.clear(); }
  TempDir& operator=(TempDir&& other) noexcept {
    if (this != &other) {
      remove();
      path = std::move(other.path);
      other.path.clear();
    }
    return *this;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// path/name (the file need not exist).
  std::string file(const std::string& name) const { return path + "/" + name; }
  /// Writes `text` to path/name and returns the file's path.
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
    return file(name);
  }

 private:
  void remove() noexcept {
    std::error_code ignored;  // never throws: a leftover folder is harmless
    if (!path.empty()) std::filesystem::remove_all(path, ignored);
  }
};

}  // namespace bielik
