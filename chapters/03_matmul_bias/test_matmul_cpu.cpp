// Chapter 03, CPU: the fp32 reference against the float64 golden answers (random cases
// within fp32 rounding, exact integer cases bit for bit), the layout it assumes, and the
// launchers' refusal of impossible sizes (checked before any CUDA call, so no GPU needed).
#include <functional>
#include <stdexcept>
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

TEST_CASE("matmul_cpu is exact on integers, and one rounding to bf16 gives the golden bits", "[ch03][cpu]") {
  // exact_*: the fp32 sums are the answers themselves. rounding_*: the fp32 sums are exact
  // but need more bits than bf16 has; rounded once they must give the golden bits, which
  // checks the generator's "one rounding" answers independently of numpy.
  for (const char* name : {"exact_a", "exact_b", "exact_c", "rounding_a", "rounding_b"}) {
    NpyArray x = golden(name, "x"), W = golden(name, "W"), b = golden(name, "b");
    int T = int(x.shape[0]), C_in = int(x.shape[1]), C_out = int(W.shape[0]);
    std::vector<float> bias = b.to_float();
    for (bool with_bias : {true, false}) {
      std::vector<float> y(size_t(T) * C_out);
      matmul_cpu(y.data(), x.to_float().data(), W.to_float().data(), with_bias ? bias.data() : nullptr, T, C_in,
                 C_out);
      INFO("case " << name << (with_bias ? " bias" : " no bias"));
      REQUIRE(float_to_bf16(y) == golden(name, with_bias ? "y_bias" : "y_nobias").bf16_bits());
    }
  }
}

TEST_CASE("every matmul launcher refuses impossible sizes and tiles before any CUDA call", "[ch03][cpu]") {
  // matmul.cuh: T >= 0, C_in >= 1, C_out >= 0. Before these checks a negative C_in made
  // every version store the bias alone, and a negative T returned without a word. The
  // pointers are null: a launcher that got past its check would fail differently.
  using Launch = std::function<void(int, int, int)>;
  const std::vector<std::pair<const char*, Launch>> launchers = {
      {"matmul_v1_naive", [](int T, int K, int N) { matmul_v1_naive(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_v2_smem_tiling",
       [](int T, int K, int N) { matmul_v2_smem_tiling(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_v3_register_blocking",
       [](int T, int K, int N) { matmul_v3_register_blocking(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_v4_tensor_cores",
       [](int T, int K, int N) { matmul_v4_tensor_cores(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_v4_tensor_cores_tile",
       [](int T, int K, int N) { matmul_v4_tensor_cores_tile(0, nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_v5_wgmma", [](int T, int K, int N) { matmul_v5_wgmma(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_v5_wgmma_tile",
       [](int T, int K, int N) { matmul_v5_wgmma_tile(0, nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_v6_few_tokens",
       [](int T, int K, int N) { matmul_v6_few_tokens(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_cublaslt", [](int T, int K, int N) { matmul_cublaslt(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_cublaslt_w_in_out",
       [](int T, int K, int N) { matmul_cublaslt_w_in_out(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"gemv_v1_warp_per_row",
       [](int T, int K, int N) { gemv_v1_warp_per_row(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"gemv_v2_tensor_cores",
       [](int T, int K, int N) { gemv_v2_tensor_cores(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
      {"matmul_forward", [](int T, int K, int N) { matmul_forward(nullptr, nullptr, nullptr, nullptr, T, K, N); }},
  };
  const int bad_sizes[][3] = {{-1, 8, 8}, {1, 0, 8}, {1, -8, 8}, {0, -8, 8}, {1, 8, -2}};  // T, C_in, C_out
  for (const auto& launcher : launchers) {
    for (const auto& size : bad_sizes) {
      INFO(launcher.first << " T=" << size[0] << " C_in=" << size[1] << " C_out=" << size[2]);
      std::string error = error_of<std::invalid_argument>([&] { launcher.second(size[0], size[1], size[2]); });
      REQUIRE(contains(error, "C_in >= 1"));
      // matmul_forward's message names the launcher it dispatched to
      if (std::string(launcher.first) != "matmul_forward") REQUIRE(contains(error, launcher.first));
    }
  }
  // A tile that does not exist (valid sizes, T = 0: nothing to launch either way).
  for (int tile : {-1, matmul_v4_tile_count()}) {
    REQUIRE(contains(error_of<std::invalid_argument>(
                         [&] { matmul_v4_tensor_cores_tile(tile, nullptr, nullptr, nullptr, nullptr, 0, 8, 8); }),
                     "does not exist"));
  }
  for (int tile : {-1, matmul_v5_tile_count()}) {
    REQUIRE(contains(
        error_of<std::invalid_argument>([&] { matmul_v5_wgmma_tile(tile, nullptr, nullptr, nullptr, nullptr, 0, 8, 8); }),
        "does not exist"));
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
