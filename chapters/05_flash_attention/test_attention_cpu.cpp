// Chapter 05, CPU: the reference against the float64 golden outputs, a case small enough
// to check by hand, and the shape errors.
#include <stdexcept>
#include <string>

#include "attention.cuh"
#include "catch_compat.hpp"
#include "compare.hpp"
#include "npy.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {
const char* const kCases[] = {"t1",           "t7",       "t100",          "t513",    "t2048",   "smollm2_t37",
                              "smollm2_t301", "q5_kv37",  "q1_kv300",      "q70_kv333_d64", "mqa_t65", "mha_t33",
                              "sharp_t129"};
NpyArray load(const std::string& name, const std::string& tensor) {
  return load_npy(golden_path("05_flash_attention", name + "_" + tensor + ".npy"));
}
}  // namespace

TEST_CASE("attention_cpu matches the float64 golden outputs", "[ch05][cpu]") {
  for (const char* name : kCases) {
    NpyArray q = load(name, "q"), k = load(name, "k"), v = load(name, "v"), expected = load(name, "expected");
    int Tq = int(q.shape[0]), H = int(q.shape[1]), D = int(q.shape[2]);
    int Tkv = int(k.shape[0]), Hkv = int(k.shape[1]);
    expected.require_shape({size_t(Tq), size_t(H), size_t(D)});
    std::vector<float> out(expected.numel(), -12345.0f);
    attention_cpu(out.data(), q.to_float().data(), k.to_float().data(), v.to_float().data(), Tq, Tkv, H, Hkv, D);
    CompareResult result = compare(name, out, expected.to_double(), tolerance::kFp32);
    INFO(result.report);
    REQUIRE(result.passed);
  }
}

TEST_CASE("attention_cpu: a case checked by hand (causality, offset, grouping)", "[ch05][cpu]") {
  // Tkv = 3 keys, Tq = 2 queries (positions 1 and 2), H = 2 query heads sharing Hkv = 1,
  // D = 2. All scores equal (q = 0), so each query averages the values it can see.
  std::vector<float> q(2 * 2 * 2, 0.0f), k = {1, 2, 3, 4, 5, 6}, v = {1, 10, 2, 20, 6, 60};
  std::vector<float> out(2 * 2 * 2, -1.0f);
  attention_cpu(out.data(), q.data(), k.data(), v.data(), 2, 3, 2, 1, 2);
  for (int h = 0; h < 2; ++h) {
    REQUIRE(out[(0 * 2 + h) * 2 + 0] == Approx(1.5));  // query 0 sees keys 0, 1
    REQUIRE(out[(0 * 2 + h) * 2 + 1] == Approx(15.0));
    REQUIRE(out[(1 * 2 + h) * 2 + 0] == Approx(3.0));  // query 1 sees keys 0, 1, 2
    REQUIRE(out[(1 * 2 + h) * 2 + 1] == Approx(30.0));
  }
}

TEST_CASE("attention shape rules are enforced", "[ch05][cpu]") {
  std::vector<float> buffer(64, 0.0f);
  REQUIRE_THROWS_AS(attention_cpu(buffer.data(), buffer.data(), buffer.data(), buffer.data(), 3, 2, 1, 1, 4),
                    std::invalid_argument);  // Tq > Tkv
  REQUIRE_THROWS_AS(attention_cpu(buffer.data(), buffer.data(), buffer.data(), buffer.data(), 1, 1, 3, 2, 4),
                    std::invalid_argument);  // H % Hkv != 0
  REQUIRE_THROWS_AS(attention_check_shapes("test", 1, 1, 12, 2, 96), std::invalid_argument);
  REQUIRE_THROWS_AS(attention_check_shapes("test", 5, 4, 12, 2, 128), std::invalid_argument);
  REQUIRE_NOTHROW(attention_check_shapes("test", 4, 5, 12, 2, 64));
}
