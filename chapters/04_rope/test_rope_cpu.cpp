// Chapter 04, CPU: the reference against the float64 golden files, its error paths, and
// the GPU launchers' refusals of bad sizes (checked before any CUDA call).
#include <climits>
#include <stdexcept>
#include <string>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "npy.hpp"
#include "rope.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {
NpyArray load(const std::string& name, const std::string& tensor) {
  return load_npy(golden_path("04_rope", name + "_" + tensor + ".npy"));
}
}  // namespace

TEST_CASE("rope_cpu matches the float64 golden rotation", "[ch04][cpu]") {
  for (const char* name : {"odd64", "odd128", "smollm2", "bielik", "decode", "d40"}) {
    NpyArray q = load(name, "q"), k = load(name, "k");
    int T = int(q.shape[0]), H = int(q.shape[1]), D = int(q.shape[2]), Hkv = int(k.shape[1]);
    float theta = load(name, "theta").to_float()[0];
    std::vector<int32_t> positions = load(name, "positions").to_int32();
    std::vector<float> q_values = q.to_float(), k_values = k.to_float();
    rope_cpu(q_values.data(), k_values.data(), positions.data(), T, H, Hkv, D, theta);
    // fp32 rotation of exact angles: only fp32 rounding separates us from float64.
    CompareResult q_result = compare(std::string(name) + " q", q_values, load(name, "q_expected").to_double(),
                                     tolerance::kFp32);
    CompareResult k_result = compare(std::string(name) + " k", k_values, load(name, "k_expected").to_double(),
                                     tolerance::kFp32);
    INFO(q_result.report << "\n" << k_result.report);
    REQUIRE(q_result.passed);
    REQUIRE(k_result.passed);
  }
}

TEST_CASE("rope_cpu rotates pair (i, i + D/2), not (2i, 2i+1)", "[ch04][cpu]") {
  // One head, D = 4, theta = 100: the two pairs turn at inv_freq = {1, 0.1}. At
  // pos = 1, q = e_0 must become (cos 1, 0, sin 1, 0) because x[0] pairs with x[2];
  // the interleaved layout would have moved it into x[1] instead.
  std::vector<float> q = {1, 0, 0, 0}, k = {0, 1, 0, 0};
  int32_t pos = 1;
  rope_cpu(q.data(), k.data(), &pos, 1, 1, 1, 4, 100.0f);
  REQUIRE(q[0] == Approx(std::cos(1.0)).margin(1e-6));
  REQUIRE(q[1] == Approx(0.0).margin(1e-6));
  REQUIRE(q[2] == Approx(std::sin(1.0)).margin(1e-6));
  REQUIRE(q[3] == Approx(0.0).margin(1e-6));
  REQUIRE(k[1] == Approx(std::cos(0.1)).margin(1e-6));  // pair 1 turns by pos * 100^(-2/4) = 0.1
  REQUIRE(k[3] == Approx(std::sin(0.1)).margin(1e-6));
}

TEST_CASE("rope_cpu rejects odd D and negative positions", "[ch04][cpu]") {
  std::vector<float> q(6, 1.0f), k(6, 1.0f);
  int32_t pos = 3;
  REQUIRE_THROWS_AS(rope_cpu(q.data(), k.data(), &pos, 1, 1, 1, 3, 1e4f), std::invalid_argument);
  pos = -1;
  REQUIRE_THROWS_AS(rope_cpu(q.data(), k.data(), &pos, 1, 1, 1, 6, 1e4f), std::invalid_argument);
}

TEST_CASE("the GPU launchers refuse negative sizes and overflowing positions before any CUDA call", "[ch04][cpu]") {
  // A negative T used to wrap around in v1's and v2's element count (a huge grid writing
  // far past q); a negative start or one whose last position overflows int32 used to be
  // written as given. The table is left unbuilt and the pointers null: a launcher that
  // got past its size check would fail with another message.
  RopeTable table;
  for (const RopeVersion& version : kRopeVersions) {
    const int bad_sizes[][3] = {{-1, 3, 1}, {2, -3, 1}, {2, 3, -1}};  // T, H, Hkv
    for (const auto& size : bad_sizes) {
      INFO(version.name << " T=" << size[0] << " H=" << size[1] << " Hkv=" << size[2]);
      std::string error = error_of<std::invalid_argument>(
          [&] { version.launch(nullptr, nullptr, nullptr, size[0], size[1], size[2], table, 0); });
      REQUIRE(contains(error, version.name));
      REQUIRE(contains(error, "T, H and Hkv >= 0"));
    }
    INFO(version.name << " with a table that was never built");
    REQUIRE(contains(error_of<std::invalid_argument>([&] { version.launch(nullptr, nullptr, nullptr, 1, 1, 1, table, 0); }),
                     "table not built"));
  }
  const int bad_offsets[][2] = {{-1, 0}, {4, -1}, {4, INT_MAX - 2}};  // T, start
  for (const auto& offset : bad_offsets) {
    INFO("T=" << offset[0] << " start=" << offset[1]);
    REQUIRE(contains(error_of<std::invalid_argument>([&] { rope_positions_from_offset(nullptr, offset[0], offset[1]); }),
                     "rope_positions_from_offset"));
  }
  // T = 0 asks for no position: accepted whatever the start, and nothing is launched.
  REQUIRE(error_of<std::invalid_argument>([] { rope_positions_from_offset(nullptr, 0, INT_MAX); }).empty());
}
