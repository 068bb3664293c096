// Chapter 06, CPU: the references against the float64 golden answers, and silu's edges.
#include <cmath>
#include <limits>
#include <string>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "npy.hpp"
#include "swiglu.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {
NpyArray golden(const std::string& name, const std::string& tensor) {
  return load_npy(golden_path("06_swiglu", name + "_" + tensor + ".npy"));
}
}  // namespace

TEST_CASE("swiglu_activation_cpu: hand-checked values and the limits of silu", "[ch06][cpu]") {
  std::vector<float> g = {0.0f, 1.0f, -1.0f, 2.0f, 100.0f, -100.0f, -1000.0f, 1e-30f};
  std::vector<float> u = {5.0f, 1.0f, 1.0f, -0.5f, 2.0f, 3.0f, 1.0f, 1.0f};
  std::vector<float> h(g.size());
  swiglu_activation_cpu(h.data(), g.data(), u.data(), g.size());
  REQUIRE(h[0] == 0.0f);                                            // silu(0) = 0
  REQUIRE(h[1] == Approx(1.0 / (1.0 + std::exp(-1.0))).epsilon(1e-6));  // sigmoid(1) = 0.7311
  REQUIRE(h[2] == Approx(-1.0 / (1.0 + std::exp(1.0))).epsilon(1e-6));  // -0.2689
  REQUIRE(h[3] == Approx(2.0 / (1.0 + std::exp(-2.0)) * -0.5).epsilon(1e-6));
  REQUIRE(h[4] == 200.0f);  // silu(z) = z for large z (exp(-100) is below fp32's epsilon)
  // exp(100) and exp(1000) overflow fp32 to inf: the quotient is -0, never NaN
  REQUIRE(h[5] == 0.0f);
  REQUIRE(h[6] == 0.0f);
  REQUIRE(std::isfinite(h[5]));
  REQUIRE(std::isfinite(h[6]));
  REQUIRE(h[7] == Approx(0.5e-30f));  // silu(z) = z / 2 near 0
}

TEST_CASE("swiglu_gate_up_cpu and mlp_cpu match the float64 golden answers", "[ch06][cpu]") {
  // "bielik" is checked on its first 2 rows: 2 x 55 M multiply-adds, quick on one core.
  for (const char* name : {"odd_a", "odd_b", "odd_c", "wide", "bielik"}) {
    NpyArray x = golden(name, "x"), Wg = golden(name, "Wg"), Wu = golden(name, "Wu"), Wd = golden(name, "Wd");
    int T = int(x.shape[0]), C = int(x.shape[1]), F = int(Wg.shape[0]);
    Wg.require_shape({size_t(F), size_t(C)});
    Wu.require_shape({size_t(F), size_t(C)});
    Wd.require_shape({size_t(C), size_t(F)});
    int rows = std::string(name) == "bielik" ? 2 : T;
    std::vector<float> xf = x.to_float(), Wgf = Wg.to_float(), Wuf = Wu.to_float(), Wdf = Wd.to_float();
    std::vector<float> bg = golden(name, "bg").to_float(), bu = golden(name, "bu").to_float(),
                       bd = golden(name, "bd").to_float();
    for (bool with_bias : {true, false}) {
      std::string label = std::string(name) + (with_bias ? " bias" : " no bias");
      INFO(label << " T=" << rows << " C=" << C << " F=" << F);
      std::vector<double> h_ref = golden(name, with_bias ? "h_bias" : "h_nobias").to_double();
      std::vector<double> y_ref = golden(name, with_bias ? "y_bias" : "y_nobias").to_double();
      h_ref.resize(size_t(rows) * F);
      y_ref.resize(size_t(rows) * C);

      std::vector<float> h(size_t(rows) * F, -12345.0f);
      swiglu_gate_up_cpu(h.data(), xf.data(), Wgf.data(), with_bias ? bg.data() : nullptr, Wuf.data(),
                         with_bias ? bu.data() : nullptr, rows, C, F);
      // fp32 sums of up to 1536 terms and an fp32 exp: ~1e-6 relative
      CompareResult h_result = compare(label + " h", h, h_ref, tolerance::kFp32);
      INFO(h_result.report);
      REQUIRE(h_result.passed);

      std::vector<float> y(size_t(rows) * C, -12345.0f);
      mlp_cpu(y.data(), xf.data(), Wgf.data(), with_bias ? bg.data() : nullptr, Wuf.data(),
              with_bias ? bu.data() : nullptr, Wdf.data(), with_bias ? bd.data() : nullptr, rows, C, F);
      // Both sides round h to bf16, the golden from float64, we from fp32: where h lies
      // within fp32 error of a bf16 rounding boundary (a few in 10^4 elements), the two
      // roundings differ by one bf16 step (2^-8 relative), which moves y by up to ~1e-4
      // relative. 1e-3 allows for that and still fails any real error (a missing bias
      // or an unrounded h is > 1e-3).
      CompareResult y_result = compare(label + " y", y, y_ref, 1e-3);
      INFO(y_result.report);
      REQUIRE(y_result.passed);
    }
  }
}

TEST_CASE("mlp_cpu rounds h to bf16 before the down projection", "[ch06][cpu]") {
  // T = 1, C = 1, F = 1: g = u = 1.01 (bf16 1.0078125), h = silu(g) * u = 0.7459...,
  // which bf16 stores as 0.74609375; Wd = 1, so y is exactly the stored h.
  std::vector<float> x = {1.0f}, Wg = {1.0078125f}, Wu = {1.0078125f}, Wd = {1.0f};
  std::vector<float> h(1), y(1);
  swiglu_gate_up_cpu(h.data(), x.data(), Wg.data(), nullptr, Wu.data(), nullptr, 1, 1, 1);
  mlp_cpu(y.data(), x.data(), Wg.data(), nullptr, Wu.data(), nullptr, Wd.data(), nullptr, 1, 1, 1);
  REQUIRE(h[0] != round_to_bf16(h[0]));  // the example needs an h that bf16 cannot hold
  REQUIRE(y[0] == round_to_bf16(h[0]));
}
