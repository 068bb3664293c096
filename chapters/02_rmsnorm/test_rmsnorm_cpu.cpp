// Chapter 02, CPU: the references against a row checked by hand and against the
// float64 golden cases (fp32 math: relative norm error under tolerance::kFp32; the
// bf16 residual stream of the fused op bit for bit), and the GPU launchers' refusal of
// negative sizes (checked before any CUDA call).
#include <cmath>
#include <stdexcept>
#include <string>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "npy.hpp"
#include "rmsnorm.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {
NpyArray load(const std::string& name) { return load_npy(golden_path("02_rmsnorm", name + ".npy")); }
}  // namespace

TEST_CASE("rmsnorm_cpu on rows checked by hand", "[ch02][cpu]") {
  // Row 0: mean of squares (9 + 16) / 2 = 12.5, eps 0.5 makes it 13; Row 1: all zeros
  // must give zeros (0 / sqrt(eps)), not NaN.
  std::vector<float> x = {3.0f, 4.0f, 0.0f, 0.0f}, weight = {2.0f, -1.0f}, y(4, 99.0f);
  rmsnorm_cpu(y.data(), x.data(), weight.data(), 2, 2, 0.5f);
  float inverse_rms = 1.0f / std::sqrt(13.0f);
  REQUIRE(y[0] == Approx(3.0f * inverse_rms * 2.0f).epsilon(1e-6));
  REQUIRE(y[1] == Approx(4.0f * inverse_rms * -1.0f).epsilon(1e-6));
  REQUIRE(y[2] == 0.0f);
  REQUIRE(y[3] == 0.0f);
}

TEST_CASE("fused_residual_rmsnorm_cpu rounds the residual stream to bf16", "[ch02][cpu]") {
  // 256 + 1 = 257 is not a bf16 value (8 significant bits): it rounds to 256 (ties to
  // even), so the residual keeps 256 and the norm sees 256, not 257.
  std::vector<float> residual = {256.0f, 1.0f}, x = {1.0f, 2.0f}, weight = {1.0f, 1.0f}, y(2);
  fused_residual_rmsnorm_cpu(y.data(), residual.data(), x.data(), weight.data(), 1, 2, 1e-6f);
  REQUIRE(residual[0] == 256.0f);
  REQUIRE(residual[1] == 3.0f);
  float inverse_rms = 1.0f / std::sqrt((256.0f * 256.0f + 9.0f) / 2.0f + 1e-6f);
  REQUIRE(y[0] == Approx(256.0f * inverse_rms).epsilon(1e-6));
  REQUIRE(y[1] == Approx(3.0f * inverse_rms).epsilon(1e-6));
}

TEST_CASE("rmsnorm_cpu matches the float64 golden cases", "[ch02][cpu]") {
  for (std::string name : {"odd", "vec", "bielik", "bielik_t1", "large", "tiny"}) {
    NpyArray x = load(name + "_x"), w = load(name + "_w"), expected = load(name + "_y");
    int T = int(x.shape[0]), C = int(x.shape[1]);
    float eps = float(load(name + "_eps").to_double()[0]);
    w.require_shape({size_t(C)});
    expected.require_shape({size_t(T), size_t(C)});
    std::vector<float> y(size_t(T) * C, -12345.0f);
    rmsnorm_cpu(y.data(), x.to_float().data(), w.to_float().data(), T, C, eps);
    CompareResult result = compare("rmsnorm_cpu " + name, y, expected.to_double(), tolerance::kFp32);
    INFO(result.report);
    REQUIRE(result.passed);
  }
}

TEST_CASE("fused_residual_rmsnorm_cpu matches the golden cases", "[ch02][cpu]") {
  for (std::string name : {"odd", "vec", "bielik", "bielik_t1", "large"}) {
    std::string prefix = "fused_" + name;
    NpyArray residual = load(prefix + "_residual"), x = load(prefix + "_x"), w = load(prefix + "_w");
    NpyArray expected_residual = load(prefix + "_residual_out"), expected_y = load(prefix + "_y");
    int T = int(x.shape[0]), C = int(x.shape[1]);
    float eps = float(load(prefix + "_eps").to_double()[0]);
    std::vector<float> residual_values = residual.to_float(), y(size_t(T) * C, -12345.0f);
    fused_residual_rmsnorm_cpu(y.data(), residual_values.data(), x.to_float().data(), w.to_float().data(), T, C,
                               eps);
    INFO("case " << name << " T=" << T << " C=" << C);
    REQUIRE(residual_values == expected_residual.to_float());  // bf16 rounding: bit-exact
    CompareResult result = compare("fused_residual_rmsnorm_cpu " + name, y, expected_y.to_double(),
                                   tolerance::kFp32);
    INFO(result.report);
    REQUIRE(result.passed);
  }
}

TEST_CASE("every GPU rmsnorm launcher refuses negative sizes before any CUDA call", "[ch02][cpu]") {
  // C = -8 passed v3's and v4's C % 8 == 0 test and wrote nothing at all. The pointers
  // are null: a launcher that got past its check would fail with another message.
  const int bad_sizes[][2] = {{1, -8}, {1, -1}, {-1, 8}, {0, -8}};  // T, C
  for (const auto& size : bad_sizes) {
    for (const RmsnormVersion& version : kRmsnormVersions) {
      INFO(version.name << " T=" << size[0] << " C=" << size[1]);
      std::string error =
          error_of<std::invalid_argument>([&] { version.launch(nullptr, nullptr, nullptr, size[0], size[1], 1e-6f, 0); });
      REQUIRE(contains(error, version.name));
      REQUIRE(contains(error, "T >= 0 and C >= 0"));
    }
    for (const FusedResidualRmsnormVersion& version : kFusedResidualRmsnormVersions) {
      INFO(version.name << " T=" << size[0] << " C=" << size[1]);
      std::string error = error_of<std::invalid_argument>(
          [&] { version.launch(nullptr, nullptr, nullptr, nullptr, size[0], size[1], 1e-6f, 0); });
      REQUIRE(contains(error, "rmsnorm_v4_fused_residual"));
    }
    INFO("the PDL launch, T=" << size[0] << " C=" << size[1]);
    REQUIRE(contains(error_of<std::invalid_argument>([&] {
                       rmsnorm_v4_fused_residual_pdl(nullptr, nullptr, nullptr, nullptr, size[0], size[1], 1e-6f, 0,
                                                     true);
                     }),
                     "rmsnorm_v4_fused_residual"));
  }
}
