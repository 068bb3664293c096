// Chapter 06, GPU: every gate/up version, every tile shape, the decode GEMV at every T,
// the dispatchers and the whole MLP, against the float64 golden answers (odd shapes,
// saturated silu, Bielik's C = 1536 / F = 8960 at T = 1 and 64, with and without
// biases), against the CPU reference on fresh random inputs (SmolLM2's shape among
// them), and through the scalar paths (misaligned pointers, odd counts). Outputs are
// poisoned with 0xFF bytes (bf16 NaN) first, so an element a kernel forgot to write
// fails, and the rows past T must still hold the poison, so writing out of bounds fails.
#include <algorithm>
#include <cmath>
#include <functional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "device_buffer.cuh"
#include "npy.hpp"
#include "swiglu.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

using Launcher = std::function<void(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                    const __nv_bfloat16*, const __nv_bfloat16*, int, int, int, cudaStream_t)>;
struct Named {
  std::string name;
  Launcher launch;
  int max_tokens = INT_MAX;
};

// Every version and the dispatcher; with BIELIK_TEST_OWN_KERNELS_ONLY, those whose GEMMs
// are all cuBLASLt's are left out (v2 stays: its fused epilogue GEMM is ours).
std::vector<Named> versions_and_forward() {
  std::vector<Named> all;
  for (const SwigluVersion& v : kSwigluVersions) {
    const std::string name = v.name;
    if ((name == "v1_unfused" || name == "cublaslt_unfused") && leave_out_library_path(name)) continue;
    all.push_back({v.name, v.launch, v.max_tokens});
  }
  if (!leave_out_library_path("swiglu_gate_up_forward")) {
    all.push_back({"swiglu_gate_up_forward", swiglu_gate_up_forward, INT_MAX});
  }
  return all;
}

std::vector<Named> every_tile() {
  std::vector<Named> tiles;
  for (int i = 0; i < swiglu_v2_tile_count(); ++i) {
    tiles.push_back({std::string("v2 ") + swiglu_v2_tile_name(i),
                     [i](auto... args) { swiglu_v2_epilogue_fused_tile(i, args...); }});
  }
  for (int i = 0; i < swiglu_v3_tile_count(); ++i) {
    tiles.push_back({std::string("v3 ") + swiglu_v3_tile_name(i),
                     [i](auto... args) { swiglu_v3_dual_gemm_tile(i, args...); }});
  }
  return tiles;
}

__nv_bfloat16* bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

struct GoldenCase {
  std::string name;
  int T = 0, C = 0, F = 0;
  std::vector<uint16_t> x, Wg, bg, Wu, bu, Wd, bd;
  NpyArray h_bias, h_nobias, y_bias, y_nobias;
};

GoldenCase load_case(const std::string& name) {
  auto file = [&](const char* tensor) { return load_npy(golden_path("06_swiglu", name + "_" + tensor + ".npy")); };
  GoldenCase c;
  c.name = name;
  NpyArray x = file("x"), Wg = file("Wg");
  c.T = int(x.shape[0]);
  c.C = int(x.shape[1]);
  c.F = int(Wg.shape[0]);
  c.x = x.bf16_bits();
  c.Wg = Wg.bf16_bits();
  c.Wu = file("Wu").bf16_bits();
  c.Wd = file("Wd").bf16_bits();
  c.bg = file("bg").bf16_bits();
  c.bu = file("bu").bf16_bits();
  c.bd = file("bd").bf16_bits();
  c.h_bias = file("h_bias");
  c.h_nobias = file("h_nobias");
  c.y_bias = file("y_bias");
  c.y_nobias = file("y_nobias");
  c.h_bias.require_shape({size_t(c.T), size_t(c.F)});
  c.y_bias.require_shape({size_t(c.T), size_t(c.C)});
  return c;
}

// The first `used` elements of `out` compared with the first `used` of `expected`;
// everything after must still be poison.
// CHECK, not REQUIRE: one failing version must not hide the others' results.
void check_rows(const std::string& label, std::vector<uint16_t> out, const NpyArray& expected, size_t used) {
  INFO(label);
  size_t written_past = 0;
  for (size_t i = used; i < out.size(); ++i) written_past += out[i] != 0xFFFF;
  CHECK(written_past == 0);  // elements past the first T rows that lost their poison
  out.resize(used);
  std::vector<double> reference = expected.to_double();
  reference.resize(used);
  CompareResult result = compare_bf16(label, out, reference, tolerance::kBf16Output);
  INFO(result.report);
  CHECK(result.passed);
}

// Inputs on the device once per case; outputs poisoned before every run.
struct DeviceCase {
  const GoldenCase& golden;
  DeviceBuffer<uint16_t> x, Wg, bg, Wu, bu, Wd, bd, h, y;
  explicit DeviceCase(const GoldenCase& c)
      : golden(c), x(c.x), Wg(c.Wg), bg(c.bg), Wu(c.Wu), bu(c.bu), Wd(c.Wd), bd(c.bd),
        h(size_t(c.T) * c.F), y(size_t(c.T) * c.C) {}

  std::string label(const std::string& what, int T, bool with_bias) const {
    return what + " case " + golden.name + " T=" + std::to_string(T) + " C=" + std::to_string(golden.C) +
           " F=" + std::to_string(golden.F) + (with_bias ? " bias" : " no bias");
  }

  // h for the first T rows of x, checked against the golden h.
  void check_gate_up(const Named& version, int T, bool with_bias) {
    h.fill_bytes(0xFF);
    version.launch(bf16(h.data()), bf16(x.data()), bf16(Wg.data()), with_bias ? bf16(bg.data()) : nullptr,
                   bf16(Wu.data()), with_bias ? bf16(bu.data()) : nullptr, T, golden.C, golden.F, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    check_rows(label(version.name, T, with_bias), h.to_host(), with_bias ? golden.h_bias : golden.h_nobias,
               size_t(T) * golden.F);
  }

  // y = mlp_forward(first T rows of x), checked against the golden y.
  void check_mlp(int T, bool with_bias) {
    h.fill_bytes(0xFF);
    y.fill_bytes(0xFF);
    mlp_forward(bf16(y.data()), bf16(h.data()), bf16(x.data()), bf16(Wg.data()),
                with_bias ? bf16(bg.data()) : nullptr, bf16(Wu.data()), with_bias ? bf16(bu.data()) : nullptr,
                bf16(Wd.data()), with_bias ? bf16(bd.data()) : nullptr, T, golden.C, golden.F, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    check_rows(label("mlp_forward y", T, with_bias), y.to_host(), with_bias ? golden.y_bias : golden.y_nobias,
               size_t(T) * golden.C);
    check_rows(label("mlp_forward h", T, with_bias), h.to_host(), with_bias ? golden.h_bias : golden.h_nobias,
               size_t(T) * golden.F);
  }
};

const char* kCases[] = {"odd_a", "odd_b", "odd_c", "wide", "bielik"};

// The CPU reference on bf16 inputs, fp32, h not rounded.
std::vector<float> cpu_gate_up(const std::vector<uint16_t>& x, const std::vector<uint16_t>& Wg,
                               const std::vector<uint16_t>* bg, const std::vector<uint16_t>& Wu,
                               const std::vector<uint16_t>* bu, int T, int C, int F) {
  std::vector<float> h(size_t(T) * F);
  std::vector<float> bgf = bg ? bf16_to_float(*bg) : std::vector<float>();
  std::vector<float> buf = bu ? bf16_to_float(*bu) : std::vector<float>();
  swiglu_gate_up_cpu(h.data(), bf16_to_float(x).data(), bf16_to_float(Wg).data(), bg ? bgf.data() : nullptr,
                     bf16_to_float(Wu).data(), bu ? buf.data() : nullptr, T, C, F);
  return h;
}

}  // namespace

TEST_CASE("every gate/up version matches the golden h at odd and Bielik shapes", "[ch06][gpu]") {
  for (const char* name : kCases) {
    GoldenCase golden = load_case(name);
    DeviceCase device(golden);
    for (const Named& version : versions_and_forward()) {
      // The whole case, and T = 1 (decode) on its first row; the GEMV form up to its 8.
      for (int T : {golden.T, 1, std::min(golden.T, kSwigluGemvMaxTokens)}) {
        if (T > version.max_tokens) continue;
        for (bool with_bias : {true, false}) device.check_gate_up(version, T, with_bias);
      }
    }
  }
}

TEST_CASE("the decode GEMV is right at every T from 1 to 8", "[ch06][gpu]") {
  for (const char* name : {"bielik", "odd_a", "odd_c", "wide"}) {  // vector path; C % 8 != 0; odd F; saturated silu
    GoldenCase golden = load_case(name);
    DeviceCase device(golden);
    for (int T = 1; T <= kSwigluGemvMaxTokens && T <= golden.T; ++T) {
      for (bool with_bias : {true, false}) device.check_gate_up({"v4_gemv", swiglu_v4_gemv}, T, with_bias);
    }
  }
}

TEST_CASE("every tile shape of v2 and v3 is correct, not only the ones picked", "[ch06][gpu]") {
  for (const char* name : {"odd_a", "odd_b", "odd_c", "wide", "bielik"}) {
    GoldenCase golden = load_case(name);
    DeviceCase device(golden);
    for (const Named& tile : every_tile()) {
      for (bool with_bias : {true, false}) device.check_gate_up(tile, golden.T, with_bias);
    }
  }
}

TEST_CASE("mlp_forward matches the golden y (and leaves the golden h in its scratch)", "[ch06][gpu]") {
  if (leave_out_library_path("mlp_forward")) return;
  for (const char* name : kCases) {
    GoldenCase golden = load_case(name);
    DeviceCase device(golden);
    for (int T : {golden.T, 1, std::min(golden.T, kSwigluGemvFasterUpTo + 1)}) {  // GEMM, GEMV, first GEMM size
      for (bool with_bias : {true, false}) device.check_mlp(T, with_bias);
    }
  }
}

TEST_CASE("every gate/up version matches the CPU reference on fresh random inputs", "[ch06][gpu]") {
  uint64_t seed = fresh_seed();
  // SmolLM2's MLP (C = 576, F = 1536, no biases in the model, both tested here) at
  // decode and prefill sizes; odd shapes; a k tail and several tiles.
  for (auto [T, C, F] : {std::tuple{1, 576, 1536}, std::tuple{8, 576, 1536}, std::tuple{40, 576, 1536},
                         std::tuple{3, 40, 24}, std::tuple{19, 200, 333}, std::tuple{77, 1536, 520},
                         std::tuple{150, 264, 130}}) {
    INFO("seed " << seed << " T=" << T << " C=" << C << " F=" << F);
    std::vector<uint16_t> x = random_bf16(size_t(T) * C, seed);
    std::vector<uint16_t> Wg = random_bf16(size_t(F) * C, seed + 1, 1.0f / std::sqrt(float(C)));
    std::vector<uint16_t> Wu = random_bf16(size_t(F) * C, seed + 2, 1.0f / std::sqrt(float(C)));
    std::vector<uint16_t> bg = random_bf16(F, seed + 3, 0.5f), bu = random_bf16(F, seed + 4, 0.5f);
    DeviceBuffer<uint16_t> dx(x), dWg(Wg), dWu(Wu), dbg(bg), dbu(bu), dh(size_t(T) * F);
    for (bool with_bias : {true, false}) {
      std::vector<float> expected =
          cpu_gate_up(x, Wg, with_bias ? &bg : nullptr, Wu, with_bias ? &bu : nullptr, T, C, F);
      for (const Named& version : versions_and_forward()) {
        if (T > version.max_tokens) continue;
        dh.fill_bytes(0xFF);
        version.launch(bf16(dh.data()), bf16(dx.data()), bf16(dWg.data()), with_bias ? bf16(dbg.data()) : nullptr,
                       bf16(dWu.data()), with_bias ? bf16(dbu.data()) : nullptr, T, C, F, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        CompareResult result = compare_bf16(version.name + (with_bias ? " bias" : " no bias"), dh.to_host(),
                                            expected, tolerance::kBf16Output);
        INFO(result.report);
        CHECK(result.passed);
      }
    }
  }
}

TEST_CASE("misaligned pointers take the scalar paths and stay correct", "[ch06][gpu]") {
  // Every tensor starts one element (2 bytes) into its buffer: no 16-byte load and no
  // paired store is legal, so each version must notice and take its scalar path.
  uint64_t seed = fresh_seed();
  const int T = 21, C = 64, F = 50;
  INFO("seed " << seed);
  std::vector<uint16_t> x = random_bf16(size_t(T) * C + 1, seed);
  std::vector<uint16_t> Wg = random_bf16(size_t(F) * C + 1, seed + 1, 0.125f);
  std::vector<uint16_t> Wu = random_bf16(size_t(F) * C + 1, seed + 2, 0.125f);
  std::vector<uint16_t> bg = random_bf16(F + 1, seed + 3, 0.5f), bu = random_bf16(F + 1, seed + 4, 0.5f);
  DeviceBuffer<uint16_t> dx(x), dWg(Wg), dWu(Wu), dbg(bg), dbu(bu), dh(size_t(T) * F + 1);
  auto tail = [](const std::vector<uint16_t>& v) { return std::vector<uint16_t>(v.begin() + 1, v.end()); };
  std::vector<uint16_t> bg_used = tail(bg), bu_used = tail(bu);
  std::vector<float> expected = cpu_gate_up(tail(x), tail(Wg), &bg_used, tail(Wu), &bu_used, T, C, F);
  for (const Named& version : versions_and_forward()) {
    int rows = std::min(T, version.max_tokens);
    INFO(version.name);
    dh.fill_bytes(0xFF);
    try {  // one version failing (v1/v2 lean on chapter 03's GEMMs) must not hide the others
      version.launch(bf16(dh.data()) + 1, bf16(dx.data()) + 1, bf16(dWg.data()) + 1, bf16(dbg.data()) + 1,
                     bf16(dWu.data()) + 1, bf16(dbu.data()) + 1, rows, C, F, 0);
      CUDA_CHECK(cudaDeviceSynchronize());
    } catch (const std::exception& error) {
      FAIL_CHECK(error.what());
      continue;
    }
    std::vector<uint16_t> out = dh.to_host();
    CHECK(out[0] == 0xFFFF);  // nothing written before h
    std::vector<uint16_t> got(out.begin() + 1, out.begin() + 1 + size_t(rows) * F);
    std::vector<float> want(expected.begin(), expected.begin() + size_t(rows) * F);
    CompareResult result = compare_bf16(version.name, got, want, tolerance::kBf16Output);
    INFO(result.report);
    CHECK(result.passed);
  }
}

TEST_CASE("swiglu_activation matches the CPU reference, vector and scalar paths", "[ch06][gpu]") {
  uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  // 8000: vector path; 1001: count % 8 != 0; offset 1: misaligned. Gate values up to
  // ~+-150 (scale 50): saturated silu on both sides must not give NaN.
  for (auto [count, offset] : {std::tuple{size_t(8000), 0}, std::tuple{size_t(1001), 0}, std::tuple{size_t(800), 1}}) {
    std::vector<uint16_t> g = random_bf16(count + offset, seed, 50.0f), u = random_bf16(count + offset, seed + 1);
    DeviceBuffer<uint16_t> dg(g), du(u), dh(count + offset);
    dh.fill_bytes(0xFF);
    swiglu_activation(bf16(dh.data()) + offset, bf16(dg.data()) + offset, bf16(du.data()) + offset, count, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> gf = bf16_to_float(g), uf = bf16_to_float(u), expected(count);
    swiglu_activation_cpu(expected.data(), gf.data() + offset, uf.data() + offset, count);
    std::vector<uint16_t> out = dh.to_host();
    std::vector<uint16_t> got(out.begin() + offset, out.end());
    INFO("count " << count << " offset " << offset);
    CompareResult result = compare_bf16("swiglu_activation", got, expected, tolerance::kBf16Output);
    INFO(result.report);
    REQUIRE(result.passed);
    // Sharper than the norm: fp32 math rounded once, so every element within one bf16
    // step (2^-8 relative) of the fp32 reference (plus 1% of that for __expf).
    for (size_t i = 0; i < count; ++i) {
      float v = bf16_bits_to_float(got[i]);
      REQUIRE(std::abs(v - expected[i]) <= std::abs(expected[i]) * (1.01f / 256) + 1e-30f);
    }
  }
}

TEST_CASE("swiglu_gate_up_forward is right on both sides of the GEMV/cuBLASLt switch", "[ch06][gpu]") {
  if (leave_out_library_path("swiglu_gate_up_forward's switch")) return;
  GoldenCase golden = load_case("bielik");
  DeviceCase device(golden);
  for (int T : {1, kSwigluGemvFasterUpTo, kSwigluGemvFasterUpTo + 1, kSwigluGemvMaxTokens + 1, golden.T}) {
    for (bool with_bias : {true, false}) {
      device.check_gate_up({"swiglu_gate_up_forward", swiglu_gate_up_forward}, T, with_bias);
    }
  }
}

TEST_CASE("T = 0 writes nothing; the GEMV refuses T > 8; one bias without the other is refused", "[ch06][gpu]") {
  GoldenCase golden = load_case("odd_b");
  DeviceCase device(golden);
  for (const Named& version : versions_and_forward()) {
    INFO(version.name);
    device.h.fill_bytes(0xFF);
    version.launch(bf16(device.h.data()), bf16(device.x.data()), bf16(device.Wg.data()), bf16(device.bg.data()),
                   bf16(device.Wu.data()), bf16(device.bu.data()), 0, golden.C, golden.F, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    for (uint16_t v : device.h.to_host()) REQUIRE(v == 0xFFFF);
    REQUIRE_THROWS_AS(version.launch(bf16(device.h.data()), bf16(device.x.data()), bf16(device.Wg.data()),
                                     bf16(device.bg.data()), bf16(device.Wu.data()), nullptr, 4, golden.C, golden.F,
                                     0),
                      std::invalid_argument);
  }
  REQUIRE_THROWS_AS(swiglu_v4_gemv(bf16(device.h.data()), bf16(device.x.data()), bf16(device.Wg.data()), nullptr,
                                   bf16(device.Wu.data()), nullptr, kSwigluGemvMaxTokens + 1, golden.C, golden.F, 0),
                    std::invalid_argument);
}

TEST_CASE("sizes outside T >= 0, C >= 1, F >= 1 and tiles outside the tables are refused", "[ch06][gpu]") {
  GoldenCase golden = load_case("odd_b");
  DeviceCase device(golden);
  auto* h = bf16(device.h.data());
  const auto *x = bf16(device.x.data()), *Wg = bf16(device.Wg.data()), *Wu = bf16(device.Wu.data());
  const auto *bg = bf16(device.bg.data()), *bu = bf16(device.bu.data());
  for (const Named& version : versions_and_forward()) {
    INFO(version.name);
    for (auto [T, C, F] : {std::tuple{-1, golden.C, golden.F}, std::tuple{1, 0, golden.F},
                           std::tuple{1, golden.C, 0}, std::tuple{0, golden.C, -3}}) {
      INFO("T=" << T << " C=" << C << " F=" << F);
      REQUIRE_THROWS_AS(version.launch(h, x, Wg, bg, Wu, bu, T, C, F, 0), std::invalid_argument);
    }
  }
  for (int tile : {-1, swiglu_v2_tile_count()}) {
    REQUIRE_THROWS_AS(swiglu_v2_epilogue_fused_tile(tile, h, x, Wg, bg, Wu, bu, 1, golden.C, golden.F, 0),
                      std::invalid_argument);
    REQUIRE_THROWS_AS(swiglu_v2_tile_name(tile), std::invalid_argument);
  }
  for (int tile : {-1, swiglu_v3_tile_count()}) {
    REQUIRE_THROWS_AS(swiglu_v3_dual_gemm_tile(tile, h, x, Wg, bg, Wu, bu, 1, golden.C, golden.F, 0),
                      std::invalid_argument);
    REQUIRE_THROWS_AS(swiglu_v3_tile_name(tile), std::invalid_argument);
  }
}

TEST_CASE("the unfused forms' scratch is safe for calls on two streams at once", "[ch06][gpu]") {
  // Stream ordering, not shared memory: memcheck and `make test` run it, racecheck need not.
  if (leave_out_library_path("the two-stream scratch case (2048-token GEMMs)")) return;
  // g and u live in one process-wide scratch. Call A (2048 tokens, ~0.2 ms) on one
  // stream and right behind it, on the host, call B (16 other tokens) on another:
  // unless B's stream waits until A's kernels are done with the scratch, B's GEMMs
  // overwrite g and u while A's kernels still read them. Each result must equal, bit
  // for bit, the same call made alone (which the other tests check for correctness).
  uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  const int C = 1536, F = 8960, TA = 2048, TB = 16;
  DeviceBuffer<uint16_t> xa(random_bf16(size_t(TA) * C, seed)), xb(random_bf16(size_t(TB) * C, seed + 1));
  DeviceBuffer<uint16_t> Wg(random_bf16(size_t(F) * C, seed + 2, 1.0f / std::sqrt(float(C))));
  DeviceBuffer<uint16_t> Wu(random_bf16(size_t(F) * C, seed + 3, 1.0f / std::sqrt(float(C))));
  DeviceBuffer<uint16_t> bg(random_bf16(F, seed + 4, 0.5f)), bu(random_bf16(F, seed + 5, 0.5f));
  DeviceBuffer<uint16_t> ha(size_t(TA) * F), hb(size_t(TB) * F);
  cudaStream_t a = nullptr, b = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  for (const SwigluVersion& version : kSwigluVersions) {
    const std::string name = version.name;
    if (name != "v1_unfused" && name != "v2_epilogue_fused" && name != "cublaslt_unfused") continue;  // no scratch
    INFO(name);
    auto run_a = [&] {  // with biases
      version.launch(bf16(ha.data()), bf16(xa.data()), bf16(Wg.data()), bf16(bg.data()), bf16(Wu.data()),
                     bf16(bu.data()), TA, C, F, a);
    };
    auto run_b = [&] {  // without, so that its g and u differ from A's everywhere
      version.launch(bf16(hb.data()), bf16(xb.data()), bf16(Wg.data()), nullptr, bf16(Wu.data()), nullptr, TB, C, F,
                     b);
    };
    auto poison = [&] {  // on the legacy stream, which non-blocking streams do not wait for
      ha.fill_bytes(0xFF);
      hb.fill_bytes(0xFF);
      CUDA_CHECK(cudaDeviceSynchronize());
    };
    poison();
    run_a();  // alone (this also grows the scratch to A's size, which would synchronize)
    CUDA_CHECK(cudaDeviceSynchronize());
    run_b();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> alone_a = ha.to_host(), alone_b = hb.to_host();
    for (int round = 0; round < 3; ++round) {
      INFO("round " << round);
      poison();
      run_a();
      run_b();
      CUDA_CHECK(cudaDeviceSynchronize());
      CHECK(ha.to_host() == alone_a);
      CHECK(hb.to_host() == alone_b);
    }
  }
  CUDA_CHECK(cudaStreamDestroy(a));
  CUDA_CHECK(cudaStreamDestroy(b));
}
