// Chapter 03, CPU: the fp32 reference against the float64 golden answers (random cases
// within fp32 rounding, exact integer cases bit for bit), and the layout it assumes.
#include <string>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "matmul.cuh"
#include "npy.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {
NpyArray golden(const std::string& name, const std::string& tensor) {
  return load_npy(golden_path("03_matmul_bias", name + "_" + tensor + ".npy"));
}
}  // namespace

TEST_CASE("matmul_cpu matches the float64 golden answers", "[ch03][cpu]") {
  // The large Bielik cases (F = 8960, V = 32000) are left to the GPU tests: on one CPU
  // core they would take seconds and test nothing new about a triple loop.
  for (const char* name : {"odd_a", "odd_b", "odd_c", "kv_proj", "q_proj"}) {
    NpyArray x = golden(name, "x"), W = golden(name, "W"), b = golden(name, "b");
    int T = int(x.shape[0]), C_in = int(x.shape[1]), C_out = int(W.shape[0]);
    REQUIRE(W.shape[1] == size_t(C_in));
    for (bool with_bias : {true, false}) {
      NpyArray expected = golden(name, with_bias ? "y_bias" : "y_nobias");
      expected.require_shape({size_t(T), size_t(C_out)});
      std::vector<float> y(size_t(T) * C_out, -12345.0f);
      std::vector<float> bias = b.to_float();
      matmul_cpu(y.data(), x.to_float().data(), W.to_float().data(), with_bias ? bias.data() : nullptr, T, C_in,
                 C_out);
      // fp32 sums of up to 1536 terms: ~1e-6 relative; 1e-5 leaves room, 1e-2 would not test anything
      CompareResult result = compare(std::string(name) + (with_bias ? " bias" : " no bias"), y, expected.to_double(),
                                     tolerance::kFp32);
      INFO(result.report);
      REQUIRE(result.passed);
    }
  }
}

TEST_CASE("matmul_cpu is exact on small integers", "[ch03][cpu]") {
  for (const char* name : {"exact_a", "exact_b", "exact_c"}) {
    NpyArray x = golden(name, "x"), W = golden(name, "W"), b = golden(name, "b");
    int T = int(x.shape[0]), C_in = int(x.shape[1]), C_out = int(W.shape[0]);
    std::vector<float> bias = b.to_float();
    for (bool with_bias : {true, false}) {
      std::vector<float> y(size_t(T) * C_out);
      matmul_cpu(y.data(), x.to_float().data(), W.to_float().data(), with_bias ? bias.data() : nullptr, T, C_in,
                 C_out);
      INFO("case " << name << (with_bias ? " bias" : " no bias"));
      REQUIRE(y == golden(name, with_bias ? "y_bias" : "y_nobias").to_float());
    }
  }
}

TEST_CASE("matmul_cpu: y[t, n] is the dot product of row t of x and row n of W", "[ch03][cpu]") {
  // The HuggingFace layout, spelled out on a 2x3 input and a 2x3 weight (C_out = 2).
  std::vector<float> x = {1, 2, 3,    //
                          4, 5, 6};   // (T = 2, C_in = 3)
  std::vector<float> W = {1, 0, -1,   // output feature 0: x0 - x2
                          0.5f, 1, 0};  // output feature 1: x0/2 + x1
  std::vector<float> b = {10, 20};
  std::vector<float> y(4);
  matmul_cpu(y.data(), x.data(), W.data(), b.data(), 2, 3, 2);
  REQUIRE(y == std::vector<float>{1 - 3 + 10, 0.5f + 2 + 20, 4 - 6 + 10, 2 + 5 + 20});
  matmul_cpu(y.data(), x.data(), W.data(), nullptr, 2, 3, 2);
  REQUIRE(y == std::vector<float>{-2, 2.5f, -2, 7});
}
