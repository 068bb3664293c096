// Chapter 03, GPU: every matmul version, the GEMV and the dispatcher against the golden
// answers (odd sizes, every Bielik projection, with and without bias), bit-exact on
// small integers, against the CPU reference on fresh random inputs, and through the
// scalar paths (odd C_in, misaligned pointers). Outputs are poisoned with 0xFF bytes
// (bf16 NaN) first, so an element a kernel forgot to write fails, and the rows past T
// must still hold the poison afterwards, so a kernel writing out of bounds fails too.
//
// Built twice (CMakeLists.txt): without BIELIK_TEST_ONLY_WGMMA it tests every portable
// version; with it, only the Hopper-only v5 and v6, in a process of its own.
#include <algorithm>
#include <functional>
#include <string>
#include <tuple>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "device_buffer.cuh"
#include "matmul.cuh"
#include "npy.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

using Launcher = std::function<void(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                    int, int, int, cudaStream_t)>;
struct Named {
  std::string name;
  Launcher launch;
};

// The versions this executable tests (see the header comment).
std::vector<Named> versions_under_test() {
  std::vector<Named> versions;
  for (const MatmulVersion& version : kMatmulVersions) {
#ifdef BIELIK_TEST_ONLY_WGMMA
    bool wanted = version.launch == matmul_v5_wgmma;
#else
    bool wanted = version.launch != matmul_v5_wgmma;
#endif
    if (wanted && version.available()) versions.push_back({version.name, version.launch});
  }
  if (versions.empty()) WARN("no version of this build runs on this GPU (v5 needs compute capability 9.0)");
  return versions;
}

// Every fixed-tile variant of v4 or v5: pick_tile only ever runs one per shape.
std::vector<Named> tiles_under_test() {
  std::vector<Named> tiles;
#ifdef BIELIK_TEST_ONLY_WGMMA
  if (!matmul_v5_available()) return tiles;
  for (int i = 0; i < matmul_v5_tile_count(); ++i) {
    tiles.push_back({std::string("v5 ") + matmul_v5_tile_name(i), [i](auto... args) { matmul_v5_wgmma_tile(i, args...); }});
  }
#else
  for (int i = 0; i < matmul_v4_tile_count(); ++i) {
    tiles.push_back(
        {std::string("v4 ") + matmul_v4_tile_name(i), [i](auto... args) { matmul_v4_tensor_cores_tile(i, args...); }});
  }
#endif
  return tiles;
}

__nv_bfloat16* bf16(uint16_t* p) { return reinterpret_cast<__nv_bfloat16*>(p); }

struct GoldenCase {
  std::string name;
  int T = 0, C_in = 0, C_out = 0;
  std::vector<uint16_t> x, W, b;
  NpyArray y_bias, y_nobias;
  bool exact = false;  // references are bf16 bits that must match exactly
};

GoldenCase load_case(const std::string& name) {
  auto file = [&](const char* tensor) { return load_npy(golden_path("03_matmul_bias", name + "_" + tensor + ".npy")); };
  GoldenCase c;
  c.name = name;
  NpyArray x = file("x"), W = file("W");
  c.T = int(x.shape[0]);
  c.C_in = int(x.shape[1]);
  c.C_out = int(W.shape[0]);
  W.require_shape({size_t(c.C_out), size_t(c.C_in)});
  c.x = x.bf16_bits();
  c.W = W.bf16_bits();
  c.b = file("b").bf16_bits();
  c.y_bias = file("y_bias");
  c.y_nobias = file("y_nobias");
  c.exact = c.y_bias.dtype == "<u2";
  return c;
}

// Inputs on the device once per case; y is poisoned before every run.
struct DeviceCase {
  const GoldenCase& golden;
  DeviceBuffer<uint16_t> x, W, b, y;
  explicit DeviceCase(const GoldenCase& c) : golden(c), x(c.x), W(c.W), b(c.b), y(size_t(c.T) * c.C_out) {}

  // Runs on the first T rows of x; returns those T rows of y. Fails if rows past T changed.
  std::vector<uint16_t> run(const Launcher& launch, int T, bool with_bias) {
    y.fill_bytes(0xFF);
    launch(bf16(y.data()), bf16(x.data()), bf16(W.data()), with_bias ? bf16(b.data()) : nullptr, T, golden.C_in,
           golden.C_out, 0);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> out = y.to_host();
    size_t used = size_t(T) * golden.C_out;
    size_t first_changed = std::find_if(out.begin() + used, out.end(), [](uint16_t v) { return v != 0xFFFF; }) -
                           out.begin();
    INFO("case " << golden.name << " T=" << T << ": first element written past row T: " << first_changed);
    CHECK(first_changed == out.size());
    out.resize(used);
    return out;
  }

  // Compares the first T rows with the golden answer (bits for exact cases).
  void check(const std::string& label, const std::vector<uint16_t>& out, int T, bool with_bias) const {
    const NpyArray& expected = with_bias ? golden.y_bias : golden.y_nobias;
    size_t used = size_t(T) * golden.C_out;
    INFO(label << " case " << golden.name << " T=" << T << " C_in=" << golden.C_in << " C_out=" << golden.C_out
               << (with_bias ? " bias" : " no bias"));
    if (golden.exact) {
      std::vector<uint16_t> bits = expected.bf16_bits();
      bits.resize(used);
      size_t mismatches = 0;
      for (size_t i = 0; i < used; ++i) mismatches += out[i] != bits[i];
      CHECK(mismatches == 0);
    } else {
      std::vector<double> reference = expected.to_double();
      reference.resize(used);
      CompareResult result = compare_bf16(label, out, reference, tolerance::kBf16Output);
      INFO(result.report);
      CHECK(result.passed);
    }
  }
};

const char* kOddCases[] = {"odd_a", "odd_b", "odd_c"};
const char* kBielikCases[] = {"q_proj", "kv_proj", "up_proj", "down_proj", "lm_head"};
const char* kExactCases[] = {"exact_a", "exact_b", "exact_c"};

// Fresh random inputs of one projection: x (T, C_in), W (C_out, C_in) small enough that
// the sums stay near x's scale, b (C_out).
struct RandomProjection {
  std::vector<uint16_t> x, W, b;
};
RandomProjection random_projection(int T, int C_in, int C_out, uint64_t seed) {
  return {random_bf16(size_t(T) * C_in, seed), random_bf16(size_t(C_out) * C_in, seed + 1, 0.05f),
          random_bf16(C_out, seed + 2, 0.5f)};
}

// The CPU reference on bf16 inputs, as fp32.
std::vector<float> cpu_reference(const std::vector<uint16_t>& x, const std::vector<uint16_t>& W,
                                 const std::vector<uint16_t>* b, int T, int C_in, int C_out) {
  std::vector<float> y(size_t(T) * C_out);
  std::vector<float> bias = b ? bf16_to_float(*b) : std::vector<float>();
  matmul_cpu(y.data(), bf16_to_float(x).data(), bf16_to_float(W).data(), b ? bias.data() : nullptr, T, C_in, C_out);
  return y;
}

// Poisons y (NaN bits everywhere, so an output left unwritten fails), runs `launch`, and
// checks the first `used` outputs against `expected` and that nothing past them changed.
void check_poisoned_run(const std::string& label, DeviceBuffer<uint16_t>& y, size_t used,
                        const std::function<void()>& launch, const std::vector<float>& expected) {
  y.fill_bytes(0xFF);
  launch();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> out = y.to_host();
  for (size_t i = used; i < out.size(); ++i) REQUIRE(out[i] == 0xFFFF);  // nothing past y
  out.resize(used);
  CompareResult result = compare_bf16(label, out, expected, tolerance::kBf16Output);
  INFO(result.report);
  CHECK(result.passed);
}

}  // namespace

TEST_CASE("every matmul version matches the golden answers at odd and Bielik shapes", "[ch03][gpu]") {
  std::vector<Named> versions = versions_under_test();
  std::vector<std::string> names(std::begin(kOddCases), std::end(kOddCases));
  names.insert(names.end(), std::begin(kBielikCases), std::end(kBielikCases));
  for (const std::string& name : names) {
    GoldenCase golden = load_case(name);
    DeviceCase device(golden);
    for (const Named& version : versions) {
      for (bool with_bias : {true, false}) {
        device.check(version.name, device.run(version.launch, golden.T, with_bias), golden.T, with_bias);
      }
    }
  }
}

TEST_CASE("every matmul version is bit-exact on small integers", "[ch03][gpu]") {
  std::vector<Named> versions = versions_under_test();
#ifndef BIELIK_TEST_ONLY_WGMMA
  versions.push_back({"matmul_forward", matmul_forward});
#endif
  for (const char* name : kExactCases) {
    GoldenCase golden = load_case(name);
    DeviceCase device(golden);
    for (bool with_bias : {true, false}) {
      for (const Named& version : versions) {
        device.check(version.name, device.run(version.launch, golden.T, with_bias), golden.T, with_bias);
      }
#ifndef BIELIK_TEST_ONLY_WGMMA
      for (int T : {1, 2, 5, 8}) {  // the GEMV on the first rows
        if (T > golden.T) continue;
        device.check("gemv_v1", device.run(gemv_v1_warp_per_row, T, with_bias), T, with_bias);
      }
      for (int T : {1, 2, 8, 9, 16}) {  // and on the tensor cores, where it takes the shape
        if (T > golden.T || golden.C_in % 8 != 0) continue;
        device.check("gemv_v2", device.run(gemv_v2_tensor_cores, T, with_bias), T, with_bias);
      }
#endif
    }
  }
}

TEST_CASE("every tile shape is correct, not only the one picked for a shape", "[ch03][gpu]") {
  for (const char* name : {"odd_b", "odd_c", "exact_b", "kv_proj"}) {
    GoldenCase golden = load_case(name);
    DeviceCase device(golden);
    for (const Named& tile : tiles_under_test()) {
      for (bool with_bias : {true, false}) {
        device.check(tile.name, device.run(tile.launch, golden.T, with_bias), golden.T, with_bias);
      }
    }
  }
}

TEST_CASE("every matmul version matches the CPU reference on fresh random inputs", "[ch03][gpu]") {
  uint64_t seed = fresh_seed();
  std::vector<Named> versions = versions_under_test();
#ifndef BIELIK_TEST_ONLY_WGMMA
  versions.push_back({"matmul_forward", matmul_forward});
#endif
  for (auto [T, C_in, C_out] : {std::tuple{3, 40, 24}, std::tuple{8, 1536, 256}, std::tuple{19, 200, 333},
                                std::tuple{77, 1536, 1536}, std::tuple{150, 256, 520}}) {
    INFO("seed " << seed << " T=" << T << " C_in=" << C_in << " C_out=" << C_out);
    const auto [x, W, b] = random_projection(T, C_in, C_out, seed);
    DeviceBuffer<uint16_t> dx(x), dW(W), db(b), dy(size_t(T) * C_out);
    std::vector<Named> runs = versions;
#ifndef BIELIK_TEST_ONLY_WGMMA
    if (T <= kGemvMaxTokens) runs.push_back({"gemv_v1", gemv_v1_warp_per_row});
#endif
    for (bool with_bias : {true, false}) {
      std::vector<float> expected = cpu_reference(x, W, with_bias ? &b : nullptr, T, C_in, C_out);
      for (const Named& version : runs) {
        dy.fill_bytes(0xFF);
        version.launch(bf16(dy.data()), bf16(dx.data()), bf16(dW.data()), with_bias ? bf16(db.data()) : nullptr, T,
                       C_in, C_out, 0);
        CUDA_CHECK(cudaDeviceSynchronize());
        CompareResult result = compare_bf16(version.name + (with_bias ? " bias" : " no bias"), dy.to_host(), expected,
                                            tolerance::kBf16Output);
        INFO(result.report);
        CHECK(result.passed);
      }
    }
  }
}

#ifndef BIELIK_TEST_ONLY_WGMMA
TEST_CASE("matmul_cublaslt_w_in_out: the weights stored (C_in, C_out) give the same product", "[ch03][gpu]") {
  uint64_t seed = fresh_seed();
  // T = 1 and the decode sizes too: chapter 08 runs its prefill's down projection here
  // at any T, Bielik's (8960 -> 1536) among them.
  for (auto [T, C_in, C_out] : {std::tuple{1, 8960, 1536}, std::tuple{3, 40, 24}, std::tuple{19, 200, 333},
                                std::tuple{9, 8960, 1536}}) {
    INFO("seed " << seed << " T=" << T << " C_in=" << C_in << " C_out=" << C_out);
    const auto [x, W, b] = random_projection(T, C_in, C_out, seed);
    std::vector<uint16_t> W_in_out(W.size());  // (C_in, C_out): W transposed
    for (int n = 0; n < C_out; ++n) {
      for (int k = 0; k < C_in; ++k) W_in_out[size_t(k) * C_out + n] = W[size_t(n) * C_in + k];
    }
    DeviceBuffer<uint16_t> dx(x), dW(W_in_out), db(b), dy(size_t(T) * C_out + 8);
    for (bool with_bias : {true, false}) {
      std::vector<float> expected = cpu_reference(x, W, with_bias ? &b : nullptr, T, C_in, C_out);
      dy.fill_bytes(0xFF);
      matmul_cublaslt_w_in_out(bf16(dy.data()), bf16(dx.data()), bf16(dW.data()), with_bias ? bf16(db.data()) : nullptr,
                               T, C_in, C_out, 0);
      CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint16_t> out = dy.to_host();
      std::vector<uint16_t> got(out.begin(), out.begin() + size_t(T) * C_out);
      CompareResult result = compare_bf16(std::string("w_in_out") + (with_bias ? " bias" : " no bias"), got, expected,
                                          tolerance::kBf16Output);
      INFO(result.report);
      CHECK(result.passed);
      CHECK(std::all_of(out.begin() + size_t(T) * C_out, out.end(), [](uint16_t v) { return v == 0xFFFF; }));
    }
  }
}
#endif

TEST_CASE("misaligned pointers take the scalar paths and stay correct", "[ch03][gpu]") {
  // Every tensor starts one element (2 bytes) into its buffer: no 16-byte access is
  // legal, so each version must notice and take its element-by-element path.
  uint64_t seed = fresh_seed();
  const int T = 21, C_in = 64, C_out = 50;
  INFO("seed " << seed);
  std::vector<uint16_t> x = random_bf16(size_t(T) * C_in + 1, seed);
  std::vector<uint16_t> W = random_bf16(size_t(C_out) * C_in + 1, seed + 1, 0.1f);
  std::vector<uint16_t> b = random_bf16(C_out + 1, seed + 2, 0.5f);
  DeviceBuffer<uint16_t> dx(x), dW(W), db(b), dy(size_t(T) * C_out + 1);
  std::vector<uint16_t> x_used(x.begin() + 1, x.end()), W_used(W.begin() + 1, W.end()), b_used(b.begin() + 1, b.end());
  std::vector<float> expected = cpu_reference(x_used, W_used, &b_used, T, C_in, C_out);
  std::vector<Named> runs = versions_under_test();
#ifndef BIELIK_TEST_ONLY_WGMMA
  runs.push_back({"gemv_v1 (first 5 rows)", [](auto y, auto x, auto W, auto b, int, int K, int N, cudaStream_t s) {
                    gemv_v1_warp_per_row(y, x, W, b, 5, K, N, s);
                  }});
#endif
  for (const Named& version : runs) {
    INFO(version.name);
    dy.fill_bytes(0xFF);
    try {  // a library refusing the alignment throws: report it and go on with the others
      version.launch(bf16(dy.data()) + 1, bf16(dx.data()) + 1, bf16(dW.data()) + 1, bf16(db.data()) + 1, T, C_in,
                     C_out, 0);
      CUDA_CHECK(cudaDeviceSynchronize());
    } catch (const std::exception& error) {
      FAIL_CHECK(version.name << " threw: " << error.what());
      continue;
    }
    std::vector<uint16_t> out = dy.to_host();
    CHECK(out[0] == 0xFFFF);  // nothing written before y
    int rows = version.name.rfind("gemv", 0) == 0 ? 5 : T;
    std::vector<uint16_t> got(out.begin() + 1, out.begin() + 1 + size_t(rows) * C_out);
    std::vector<float> want(expected.begin(), expected.begin() + size_t(rows) * C_out);
    CompareResult result = compare_bf16(version.name, got, want, tolerance::kBf16Output);
    INFO(result.report);
    CHECK(result.passed);
  }
}

#ifndef BIELIK_TEST_ONLY_WGMMA
TEST_CASE("gemv_v1 matches the golden answers for every T = 1..8", "[ch03][gpu]") {
  std::vector<std::string> names(std::begin(kOddCases), std::end(kOddCases));
  names.insert(names.end(), std::begin(kBielikCases), std::end(kBielikCases));
  for (const std::string& name : names) {
    GoldenCase golden = load_case(name);
    DeviceCase device(golden);
    for (int T = 1; T <= kGemvMaxTokens && T <= golden.T; ++T) {
      for (bool with_bias : {true, false}) {
        device.check("gemv_v1", device.run(gemv_v1_warp_per_row, T, with_bias), T, with_bias);
      }
    }
  }
}

TEST_CASE("gemv_v2 matches the golden answers for every T = 1..16", "[ch03][gpu]") {
  std::vector<std::string> names(std::begin(kOddCases), std::end(kOddCases));
  names.insert(names.end(), std::begin(kBielikCases), std::end(kBielikCases));
  int checked = 0;
  for (const std::string& name : names) {
    GoldenCase golden = load_case(name);
    DeviceCase device(golden);
    if (golden.C_in % 8 != 0) continue;  // odd_a: gemv_v2_supported says no (tested below)
    for (int T = 1; T <= kGemvV2MaxTokens && T <= golden.T; ++T) {
      for (bool with_bias : {true, false}) {
        device.check("gemv_v2", device.run(gemv_v2_tensor_cores, T, with_bias), T, with_bias);
        ++checked;
      }
    }
  }
  REQUIRE(checked == 7 * 16 * 2);  // odd_b, odd_c and the five Bielik shapes, every T
}

TEST_CASE("gemv_v2 on fresh random inputs: odd rows, long rows, both column tiles", "[ch03][gpu]") {
  uint64_t seed = fresh_seed();
  // C_out not a multiple of 16 (a partial last block), K not a multiple of 32 (a partial
  // last step), long rows (blocks of 16 warps) with one and with two column tiles.
  for (auto [T, C_in, C_out] : {std::tuple{1, 40, 24}, std::tuple{5, 1544, 257}, std::tuple{9, 8, 3},
                                std::tuple{13, 8960, 1537}, std::tuple{16, 4104, 33}, std::tuple{8, 1536, 8960}}) {
    INFO("seed " << seed << " T=" << T << " C_in=" << C_in << " C_out=" << C_out);
    const auto [x, W, b] = random_projection(T, C_in, C_out, seed);
    DeviceBuffer<uint16_t> dx(x), dW(W), db(b), dy(size_t(T) * C_out + 8);
    for (bool with_bias : {true, false}) {
      std::vector<float> expected = cpu_reference(x, W, with_bias ? &b : nullptr, T, C_in, C_out);
      check_poisoned_run(std::string("gemv_v2") + (with_bias ? " bias" : " no bias"), dy, size_t(T) * C_out, [&] {
        gemv_v2_tensor_cores(bf16(dy.data()), bf16(dx.data()), bf16(dW.data()), with_bias ? bf16(db.data()) : nullptr,
                             T, C_in, C_out, 0);
      }, expected);
    }
  }
}

TEST_CASE("gemv_v2 refuses what it cannot run and writes nothing at T = 0", "[ch03][gpu]") {
  GoldenCase golden = load_case("odd_b");
  DeviceCase device(golden);
  REQUIRE(device.run(gemv_v2_tensor_cores, 0, true).empty());  // run() checks that y kept its poison
  REQUIRE_THROWS_AS(device.run(gemv_v2_tensor_cores, kGemvV2MaxTokens + 1, true), std::invalid_argument);
  GoldenCase odd_k = load_case("odd_a");  // C_in = 100: not a multiple of 8
  DeviceCase odd_device(odd_k);
  REQUIRE_THROWS_AS(odd_device.run(gemv_v2_tensor_cores, 2, true), std::invalid_argument);
  REQUIRE_FALSE(gemv_v2_supported(nullptr, nullptr, 17, 1536));
}

TEST_CASE("matmul_forward is right on both sides of the GEMV/GEMM switch", "[ch03][gpu]") {
  GoldenCase golden = load_case("q_proj");
  DeviceCase device(golden);
  for (int T : {1, 2, kGemvMaxTokens, kGemvMaxTokens + 1, golden.T}) {
    device.check("matmul_forward", device.run(matmul_forward, T, true), T, true);
  }
}

TEST_CASE("T = 0 writes nothing; the GEMV refuses T > 8", "[ch03][gpu]") {
  GoldenCase golden = load_case("odd_a");
  DeviceCase device(golden);
  std::vector<Named> runs = versions_under_test();
  runs.push_back({"gemv_v1", gemv_v1_warp_per_row});
  for (const Named& version : runs) {
    INFO(version.name);
    REQUIRE(device.run(version.launch, 0, true).empty());  // run() checks that y kept its poison
  }
  REQUIRE_THROWS_AS(device.run(gemv_v1_warp_per_row, kGemvMaxTokens + 1, true), std::invalid_argument);
}
#endif

#ifdef BIELIK_TEST_ONLY_WGMMA
// v6 (sm_90a, like v5): in the wgmma process. T up to 64: the golden cases' first rows.
namespace {
bool v6_runs_here() {
  if (matmul_v6_available()) return true;
  WARN("v6 needs compute capability 9.0 and an sm_90a build: not run");
  return false;
}
}  // namespace

TEST_CASE("v6 matches the golden answers at T = 1..64, every column tile", "[ch03][gpu]") {
  if (!v6_runs_here()) return;
  std::vector<std::string> names = {"odd_b", "odd_c", "exact_a", "exact_b"};  // odd_a, exact_c: C_in % 8 != 0
  names.insert(names.end(), std::begin(kBielikCases), std::end(kBielikCases));
  int checked = 0;
  for (const std::string& name : names) {
    GoldenCase golden = load_case(name);
    REQUIRE(golden.C_in % 8 == 0);
    DeviceCase device(golden);
    for (int T : {1, 2, 3, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64}) {
      if (T > golden.T) continue;
      for (bool with_bias : {true, false}) {
        device.check("v6", device.run(matmul_v6_few_tokens, T, with_bias), T, with_bias);
        ++checked;
      }
    }
  }
  // 14 T values on the five Bielik shapes (T = 64), odd_c (131) and exact_b (130); 11 on
  // odd_b (33) and exact_a (37); with and without bias.
  REQUIRE(checked == (7 * 14 + 2 * 11) * 2);
}

TEST_CASE("v6 on fresh random inputs at every split count: odd rows, short and long K", "[ch03][gpu]") {
  if (!v6_runs_here()) return;
  uint64_t seed = fresh_seed();
  // C_out not a multiple of 64 (a partial last tile), K not a multiple of 64 (a partial
  // last k tile), K shorter than the splits (empty slices), each column tile.
  for (auto [T, C_in, C_out] : {std::tuple{1, 8, 3}, std::tuple{5, 1544, 257}, std::tuple{17, 8960, 1537},
                                std::tuple{33, 4104, 65}, std::tuple{64, 1536, 100}, std::tuple{16, 1536, 8960}}) {
    const auto [x, W, b] = random_projection(T, C_in, C_out, seed);
    DeviceBuffer<uint16_t> dx(x), dW(W), db(b), dy(size_t(T) * C_out + 8);
    for (bool with_bias : {true, false}) {
      std::vector<float> expected = cpu_reference(x, W, with_bias ? &b : nullptr, T, C_in, C_out);
      for (int splits = 1; splits <= 8; ++splits) {
        INFO("seed " << seed << " T=" << T << " C_in=" << C_in << " C_out=" << C_out << " splits=" << splits
                     << (with_bias ? " bias" : " no bias"));
        check_poisoned_run("v6", dy, size_t(T) * C_out, [&] {
          matmul_v6_few_tokens_splits(splits, bf16(dy.data()), bf16(dx.data()), bf16(dW.data()),
                                      with_bias ? bf16(db.data()) : nullptr, T, C_in, C_out, 0);
        }, expected);
      }
    }
  }
}

TEST_CASE("every v6 instance on fresh random inputs, at its widest T and at T = 1", "[ch03][gpu]") {
  if (!v6_runs_here()) return;
  uint64_t seed = fresh_seed();
  REQUIRE(matmul_v6_config_count() >= 3);
  for (auto [C_in, C_out] : {std::tuple{1544, 257}, std::tuple{8960, 200}, std::tuple{520, 1537}}) {
    for (int config = 0; config < matmul_v6_config_count(); ++config) {
      for (int T : {1, matmul_v6_config_max_tokens(config)}) {
        const auto [x, W, b] = random_projection(T, C_in, C_out, seed);
        DeviceBuffer<uint16_t> dx(x), dW(W), db(b), dy(size_t(T) * C_out + 8);
        std::vector<float> expected = cpu_reference(x, W, &b, T, C_in, C_out);
        for (int splits : {0, 3, 8}) {  // 0: chosen for the shape
          INFO("seed " << seed << " " << matmul_v6_config_name(config) << " T=" << T << " C_in=" << C_in
                       << " C_out=" << C_out << " splits=" << splits);
          check_poisoned_run("v6 instance", dy, size_t(T) * C_out, [&] {
            matmul_v6_few_tokens_config(config, splits, bf16(dy.data()), bf16(dx.data()), bf16(dW.data()),
                                        bf16(db.data()), T, C_in, C_out, 0);
          }, expected);
        }
      }
    }
    seed += 3;
  }
}

TEST_CASE("v6 refuses what it cannot run and writes nothing at T = 0", "[ch03][gpu]") {
  if (!v6_runs_here()) return;
  GoldenCase golden = load_case("q_proj");
  DeviceCase device(golden);
  REQUIRE(device.run(matmul_v6_few_tokens, 0, true).empty());  // run() checks that y kept its poison
  REQUIRE_THROWS_AS(device.run(matmul_v6_few_tokens, kMatmulV6MaxTokens + 1, true), std::invalid_argument);
  for (int splits : {-1, 9}) {
    auto with_splits = [splits](auto... args) { matmul_v6_few_tokens_splits(splits, args...); };
    REQUIRE_THROWS_AS(device.run(with_splits, 4, true), std::invalid_argument);
  }
  GoldenCase odd_k = load_case("odd_a");  // C_in = 100: not a multiple of 8
  DeviceCase odd_device(odd_k);
  REQUIRE_THROWS_AS(odd_device.run(matmul_v6_few_tokens, 2, true), std::invalid_argument);
  REQUIRE_FALSE(matmul_v6_supported(nullptr, nullptr, kMatmulV6MaxTokens + 1, 1536));
  // An instance that does not exist, or one narrower than T.
  for (int config : {-1, matmul_v6_config_count()}) {
    auto on_config = [config](auto... args) { matmul_v6_few_tokens_config(config, 0, args...); };
    REQUIRE_THROWS_AS(device.run(on_config, 4, true), std::invalid_argument);
  }
  auto narrow = [](auto... args) { matmul_v6_few_tokens_config(0, 0, args...); };  // 16 tokens wide
  REQUIRE(matmul_v6_config_max_tokens(0) == 16);
  REQUIRE_THROWS_AS(device.run(narrow, 17, true), std::invalid_argument);
  // Bielik's shapes: enough blocks for the GPU, never more splits than k tiles.
  REQUIRE(matmul_v6_splits(16, 1536, 2048) >= 4);
  REQUIRE(matmul_v6_splits(16, 8, 1536) == 1);
}
#endif
