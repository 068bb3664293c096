// Chapter 02, GPU: every version against the float64 golden cases and against the CPU
// reference on fresh random inputs, at odd sizes, Bielik's and SmolLM2's sizes, a row
// too wide for the register path, and misaligned pointers. Outputs are poisoned with
// 0xFF bytes (bf16 NaN) first, so an element a kernel forgot to write fails.
//
// Two checks per output. The book-wide one: relative norm error <= kBf16Output. And a
// per-element one that is much sharper: the kernels compute in fp32 and round once to
// bf16, so every element must lie within kMaxUlps bf16 steps of the exact value (0.5
// for the rounding plus a little for fp32 error). A kernel that truncates instead of
// rounding, rounds twice, or accumulates in bf16 fails it.
#include <cmath>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "device_buffer.cuh"
#include "npy.hpp"
#include "rmsnorm.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

constexpr double kMaxUlps = 0.6;

NpyArray load(const std::string& name) { return load_npy(golden_path("02_rmsnorm", name + ".npy")); }

__nv_bfloat16* as_bf16(uint16_t* bits) { return reinterpret_cast<__nv_bfloat16*>(bits); }

// The largest |actual - expected| in units of one bf16 step (ulp) at the expected value.
struct UlpReport {
  double worst_ulps = 0;
  size_t index = 0;
};
UlpReport bf16_ulp_error(const std::vector<uint16_t>& actual_bits, const std::vector<double>& expected) {
  UlpReport report;
  for (size_t i = 0; i < expected.size(); ++i) {
    double actual = bf16_bits_to_float(actual_bits[i]), e = expected[i];
    int exponent = 0;
    std::frexp(e, &exponent);  // |e| = m * 2^exponent, m in [0.5, 1): bf16 keeps 8 significant bits
    double ulp = std::ldexp(1.0, exponent - 8);
    double ulps = e == 0 ? (actual == 0 ? 0 : INFINITY) : std::fabs(actual - e) / ulp;
    if (!(ulps <= report.worst_ulps)) {  // NaN counts as the worst
      report.worst_ulps = std::isnan(ulps) ? INFINITY : ulps;
      report.index = i;
    }
  }
  return report;
}

void require_close(const std::string& label, const std::vector<uint16_t>& actual_bits,
                   const std::vector<double>& expected) {
  CompareResult result = compare_bf16(label, actual_bits, expected, tolerance::kBf16Output);
  INFO(result.report);
  REQUIRE(result.passed);
  UlpReport ulps = bf16_ulp_error(actual_bits, expected);
  INFO(label << ": worst error " << ulps.worst_ulps << " bf16 ulps at [" << ulps.index << "]: "
             << bf16_bits_to_float(actual_bits[ulps.index]) << " vs " << expected[ulps.index]);
  REQUIRE(ulps.worst_ulps <= kMaxUlps);
}

// A device copy of `host` starting `offset` elements into its allocation, so offset 1
// gives a pointer that is 2 bytes past a 16-byte boundary.
struct OffsetBuffer {
  DeviceBuffer<uint16_t> storage;
  size_t offset;
  OffsetBuffer(const std::vector<uint16_t>& host, size_t offset_elements)
      : storage(host.size() + offset_elements), offset(offset_elements) {
    CUDA_CHECK(cudaMemcpy(storage.data() + offset, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  }
  uint16_t* data() { return storage.data() + offset; }
  std::vector<uint16_t> to_host() const {
    std::vector<uint16_t> all = storage.to_host();
    return std::vector<uint16_t>(all.begin() + long(offset), all.end());
  }
};

// Runs one plain version on poisoned output and returns y as bf16 bits.
std::vector<uint16_t> run_rmsnorm(const RmsnormVersion& version, const std::vector<uint16_t>& x_bits,
                                  const std::vector<uint16_t>& w_bits, int T, int C, float eps, size_t offset = 0) {
  OffsetBuffer x(x_bits, offset), w(w_bits, offset);
  OffsetBuffer y(std::vector<uint16_t>(size_t(T) * C, 0xFFFF), offset);  // poison: bf16 NaN
  version.launch(as_bf16(y.data()), as_bf16(x.data()), as_bf16(w.data()), T, C, eps, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  return y.to_host();
}

// Runs one fused version; returns y and updates `residual_bits` in place.
std::vector<uint16_t> run_fused(const FusedResidualRmsnormVersion& version, std::vector<uint16_t>& residual_bits,
                                const std::vector<uint16_t>& x_bits, const std::vector<uint16_t>& w_bits, int T,
                                int C, float eps, size_t offset = 0) {
  OffsetBuffer residual(residual_bits, offset), x(x_bits, offset), w(w_bits, offset);
  OffsetBuffer y(std::vector<uint16_t>(size_t(T) * C, 0xFFFF), offset);
  version.launch(as_bf16(y.data()), as_bf16(residual.data()), as_bf16(x.data()), as_bf16(w.data()), T, C, eps, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  residual_bits = residual.to_host();
  return y.to_host();
}

// The CPU references on bf16 inputs, as float64 for the comparisons.
std::vector<double> cpu_rmsnorm(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int T, int C,
                                float eps) {
  std::vector<float> y(size_t(T) * C);
  rmsnorm_cpu(y.data(), bf16_to_float(x).data(), bf16_to_float(w).data(), T, C, eps);
  return std::vector<double>(y.begin(), y.end());
}

// v4 launched with programmatic dependent launch, as chapter 08's prefill launches it.
void v4_launched_with_pdl(__nv_bfloat16* y, __nv_bfloat16* residual, const __nv_bfloat16* x,
                          const __nv_bfloat16* weight, int T, int C, float eps, cudaStream_t stream) {
  rmsnorm_v4_fused_residual_pdl(y, residual, x, weight, T, C, eps, stream, true);
}

// The table's fused versions, plus v4's PDL launch.
std::vector<FusedResidualRmsnormVersion> fused_versions_under_test() {
  std::vector<FusedResidualRmsnormVersion> versions(std::begin(kFusedResidualRmsnormVersions),
                                                    std::end(kFusedResidualRmsnormVersions));
  versions.push_back({"v4_fused_residual, PDL launch", v4_launched_with_pdl});
  return versions;
}

}  // namespace

TEST_CASE("every rmsnorm version matches the float64 golden cases", "[ch02][gpu]") {
  for (std::string name : {"odd", "vec", "bielik", "bielik_t1", "large", "tiny"}) {
    NpyArray x = load(name + "_x"), w = load(name + "_w"), expected = load(name + "_y");
    int T = int(x.shape[0]), C = int(x.shape[1]);
    float eps = float(load(name + "_eps").to_double()[0]);
    for (const RmsnormVersion& version : kRmsnormVersions) {
      INFO("case " << name << " version " << version.name << " T=" << T << " C=" << C << " eps=" << eps);
      std::vector<uint16_t> y = run_rmsnorm(version, x.bf16_bits(), w.bf16_bits(), T, C, eps);
      require_close(std::string(version.name) + " " + name, y, expected.to_double());
    }
  }
}

TEST_CASE("every rmsnorm version matches the CPU reference on fresh random inputs", "[ch02][gpu]") {
  uint64_t seed = fresh_seed();
  // (T, C, eps, scale): tiny rows, Bielik, odd C, SmolLM2, and C = 4104 > 4096 (scalar
  // form). With the vector path, each lane holds ceil(C / 256) vectors, rounded up to a
  // compiled instance of 1, 2, 3, 4, 6, 8, 12 or 16 (rmsnorm_warp.cuh): C = 8, 512, 576,
  // 1024, 1536, 2048, 2056 (9 -> 12) and 4096 run each of them once.
  for (auto [T, C, eps, scale] : {std::tuple{1, 8, 1e-6f, 1.0f}, std::tuple{33, 1536, 1e-6f, 3.0f},
                                  std::tuple{5, 577, 1e-5f, 1.0f}, std::tuple{17, 576, 1e-5f, 0.01f},
                                  std::tuple{3, 512, 1e-6f, 1.0f}, std::tuple{3, 1024, 1e-6f, 1.0f},
                                  std::tuple{3, 2048, 1e-6f, 1.0f}, std::tuple{6, 2056, 1e-6f, 1.0f},
                                  std::tuple{2, 4096, 1e-6f, 1.0f}, std::tuple{3, 4104, 1e-6f, 1.0f}}) {
    INFO("seed " << seed << " T=" << T << " C=" << C << " eps=" << eps << " scale=" << scale);
    std::vector<uint16_t> x = random_bf16(size_t(T) * C, seed, scale);
    std::vector<uint16_t> w = random_bf16(size_t(C), seed + 1, 1.0f);
    std::vector<double> expected = cpu_rmsnorm(x, w, T, C, eps);
    for (const RmsnormVersion& version : kRmsnormVersions) {
      INFO("version " << version.name);
      require_close(version.name, run_rmsnorm(version, x, w, T, C, eps), expected);
    }
  }
}

TEST_CASE("misaligned pointers fall back to the scalar path and stay correct", "[ch02][gpu]") {
  uint64_t seed = fresh_seed();
  const int T = 9, C = 1536;  // vector-friendly C, but every pointer 2 bytes off 16
  INFO("seed " << seed);
  std::vector<uint16_t> x = random_bf16(size_t(T) * C, seed), w = random_bf16(size_t(C), seed + 1);
  std::vector<double> expected = cpu_rmsnorm(x, w, T, C, 1e-6f);
  for (const RmsnormVersion& version : kRmsnormVersions) {
    INFO("version " << version.name);
    require_close(version.name, run_rmsnorm(version, x, w, T, C, 1e-6f, 1), expected);
  }
  std::vector<uint16_t> residual = random_bf16(size_t(T) * C, seed + 2);
  std::vector<float> residual_cpu = bf16_to_float(residual), y_cpu(size_t(T) * C);
  fused_residual_rmsnorm_cpu(y_cpu.data(), residual_cpu.data(), bf16_to_float(x).data(), bf16_to_float(w).data(),
                             T, C, 1e-6f);
  for (const FusedResidualRmsnormVersion& version : fused_versions_under_test()) {
    INFO("version " << version.name);
    std::vector<uint16_t> residual_gpu = residual;
    std::vector<uint16_t> y = run_fused(version, residual_gpu, x, w, T, C, 1e-6f, 1);
    REQUIRE(bf16_to_float(residual_gpu) == residual_cpu);
    require_close(version.name, y, std::vector<double>(y_cpu.begin(), y_cpu.end()));
  }
}

TEST_CASE("every fused residual rmsnorm version matches the golden cases", "[ch02][gpu]") {
  for (std::string name : {"odd", "vec", "bielik", "bielik_t1", "large"}) {
    std::string prefix = "fused_" + name;
    NpyArray residual = load(prefix + "_residual"), x = load(prefix + "_x"), w = load(prefix + "_w");
    NpyArray expected_residual = load(prefix + "_residual_out"), expected_y = load(prefix + "_y");
    int T = int(x.shape[0]), C = int(x.shape[1]);
    float eps = float(load(prefix + "_eps").to_double()[0]);
    for (const FusedResidualRmsnormVersion& version : fused_versions_under_test()) {
      INFO("case " << name << " version " << version.name << " T=" << T << " C=" << C);
      std::vector<uint16_t> residual_bits = residual.bf16_bits();
      std::vector<uint16_t> y = run_fused(version, residual_bits, x.bf16_bits(), w.bf16_bits(), T, C, eps);
      REQUIRE(residual_bits == expected_residual.bf16_bits());  // the bf16 stream: bit-exact
      require_close(std::string(version.name) + " " + name, y, expected_y.to_double());
    }
  }
}

TEST_CASE("every fused version matches the CPU reference on fresh random inputs", "[ch02][gpu]") {
  uint64_t seed = fresh_seed();
  // Every vectors-per-lane instance of v4 (1, 2, 3, 4, 6, 8, 12, 16: C = 8, 512, 576,
  // 1024, 1536, 2048, 2056, 4096, as in the plain test above), odd C and C > 4096.
  for (auto [T, C] : {std::tuple{1, 8}, std::tuple{33, 1536}, std::tuple{5, 577}, std::tuple{17, 576},
                      std::tuple{3, 512}, std::tuple{3, 1024}, std::tuple{3, 2048}, std::tuple{6, 2056},
                      std::tuple{2, 4096}, std::tuple{3, 4104}}) {
    INFO("seed " << seed << " T=" << T << " C=" << C);
    std::vector<uint16_t> residual = random_bf16(size_t(T) * C, seed, 4.0f);
    std::vector<uint16_t> x = random_bf16(size_t(T) * C, seed + 1), w = random_bf16(size_t(C), seed + 2);
    std::vector<float> residual_cpu = bf16_to_float(residual), y_cpu(size_t(T) * C);
    fused_residual_rmsnorm_cpu(y_cpu.data(), residual_cpu.data(), bf16_to_float(x).data(),
                               bf16_to_float(w).data(), T, C, 1e-6f);
    for (const FusedResidualRmsnormVersion& version : fused_versions_under_test()) {
      INFO("version " << version.name);
      std::vector<uint16_t> residual_gpu = residual;
      std::vector<uint16_t> y = run_fused(version, residual_gpu, x, w, T, C, 1e-6f);
      REQUIRE(bf16_to_float(residual_gpu) == residual_cpu);
      require_close(version.name, y, std::vector<double>(y_cpu.begin(), y_cpu.end()));
    }
  }
}
