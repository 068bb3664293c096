// Tests of common/: the .npy reader (including its errors), bf16 rounding, the
// benchmark tables' CSV and the comparison helper that every other test relies on. If these are wrong, every
// "PASS" in the book is suspect, so they come first (label ch00).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <limits>
#include <string>

#include "bench.cuh"
#include "bf16.hpp"
#include "catch_compat.hpp"
#include "compare.hpp"
#include "npy.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {
// Every scratch file of this program lives in one folder, removed at exit.
std::string temp_path(const std::string& name) {
  static const TempDir scratch;
  return scratch.file(name);
}

}  // namespace

TEST_CASE("npy: save then load round-trips float32 and bf16 bits", "[npy]") {
  std::vector<float> values = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, 7.0f};
  save_npy(temp_path("f4.npy"), "<f4", {2, 3}, values.data(), values.size() * sizeof(float));
  NpyArray loaded = load_npy(temp_path("f4.npy"));
  REQUIRE(loaded.shape == std::vector<size_t>{2, 3});
  REQUIRE(loaded.to_float() == values);

  std::vector<uint16_t> bits = float_to_bf16(values);
  save_npy(temp_path("u2.npy"), "<u2", {6}, bits.data(), bits.size() * 2);
  REQUIRE(load_npy(temp_path("u2.npy")).bf16_bits() == bits);
}

TEST_CASE("npy: errors name the file and the problem", "[npy]") {
  REQUIRE(contains(error_of([] { load_npy("/nonexistent/case.npy"); }), "run `make golden`"));
  REQUIRE(contains(error_of([] { load_npy("/nonexistent/case.npy"); }), "/nonexistent/case.npy"));

  std::vector<float> values(100, 1.0f);
  save_npy(temp_path("full.npy"), "<f4", {100}, values.data(), values.size() * sizeof(float));
  {  // cut the file short: the data section is truncated
    std::ifstream in(temp_path("full.npy"), std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream out(temp_path("truncated.npy"), std::ios::binary);
    out.write(content.data(), static_cast<std::streamsize>(content.size() - 10));
  }
  REQUIRE(contains(error_of([] { load_npy(temp_path("truncated.npy")); }), "truncated data"));

  {
    std::ofstream out(temp_path("garbage.npy"), std::ios::binary);
    out << "this is not numpy";
  }
  REQUIRE(contains(error_of([] { load_npy(temp_path("garbage.npy")); }), "bad magic"));

  NpyArray loaded = load_npy(temp_path("full.npy"));
  REQUIRE(contains(error_of([&] { loaded.require_shape({10, 10}); }), "expected shape (10, 10)"));
  REQUIRE(contains(error_of([&] { loaded.bf16_bits(); }), "expected bf16 bits"));
}

TEST_CASE("bf16: round to nearest even, exact widening", "[bf16]") {
  REQUIRE(bf16_bits_to_float(float_to_bf16_bits(1.0f)) == 1.0f);
  REQUIRE(float_to_bf16_bits(1.0f) == 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 neighbours 1.0 and 1 + 2^-7: ties to even -> 1.0
  REQUIRE(round_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 1.0f);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even -> 1 + 2^-6
  REQUIRE(round_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 1.0f + std::ldexp(1.0f, -6));
  REQUIRE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN()))));
  // bf16 keeps fp32's range: 1e38 does not overflow as it would in fp16.
  REQUIRE(std::isfinite(round_to_bf16(1e38f)));
}

TEST_CASE("compare: relative norm error, NaN always fails", "[compare]") {
  std::vector<double> expected = {1.0, 2.0, 3.0, 4.0};
  std::vector<float> close = {1.0f, 2.0f, 3.0f, 4.0001f};
  CompareResult good = compare("close", close, expected, 1e-4);
  REQUIRE(good.passed);
  REQUIRE(good.worst_index == 3);
  REQUIRE(good.rel_norm_error == Approx(0.0001 / std::sqrt(30.0)).epsilon(1e-2));

  std::vector<float> far = {1.0f, 2.0f, 3.5f, 4.0f};
  CompareResult bad = compare("far", far, expected, 1e-2);
  REQUIRE_FALSE(bad.passed);
  REQUIRE(bad.report.find("[2]") != std::string::npos);

  std::vector<float> with_nan = {1.0f, std::nanf(""), 3.0f, 4.0f};
  CompareResult nan_result = compare("nan", with_nan, expected, 1.0);
  REQUIRE_FALSE(nan_result.passed);
  REQUIRE(nan_result.nonfinite_count == 1);

  REQUIRE_FALSE(compare("empty", std::vector<float>{}, std::vector<double>{}, 1.0).passed);
}

TEST_CASE("BenchTable: the CSV quotes fields that hold commas or quotes", "[bench]") {
  const TempDir scratch;
  const std::filesystem::path directory = scratch.path;
  REQUIRE(setenv("BIELIK_BENCH_DIR", directory.c_str(), 1) == 0);
  BenchTable table("csv quoting", {"path, variant", "us"});
  table.add_row({"graph + PDL, queued", "1.5"});
  table.add_row({"say \"hi\"", "2"});
  table.print();
  unsetenv("BIELIK_BENCH_DIR");
  std::ifstream file(directory / "csv_quoting.csv");
  REQUIRE(file.good());
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  CHECK(text == "\"path, variant\",us\n\"graph + PDL, queued\",1.5\n\"say \"\"hi\"\"\",2\n");
  std::filesystem::remove_all(directory);
}
