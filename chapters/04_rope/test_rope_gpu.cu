// Chapter 04, GPU: every version against the float64 golden rotation, against the CPU
// reference on fresh random inputs (Bielik's and SmolLM2's heads, D = 40, and 140 heads,
// more than one v3 block holds at once), the positions helper, the table, and the loud
// failure on out-of-range positions.
//
// RoPE works in place, so the usual "poison the output" trick would destroy the input.
// Instead every element is checked individually as well as by the norm: an element a
// kernel forgot to rotate keeps its input value, which is off by O(1) at any position
// other than 0, far outside the per-element bound.
#include <cmath>
#include <stdexcept>
#include <string>

#include "catch_compat.hpp"
#include "compare.hpp"
#include "device_buffer.cuh"
#include "npy.hpp"
#include "rope.cuh"
#include "test_support.hpp"

using namespace bielik;

namespace {

constexpr int kMaxPositions = 8192;  // Bielik's context length; golden positions reach 8191

// bf16 output: rounding alone costs ~1.5e-3 relative norm (printed by gen_04_rope.py).
constexpr double kRopeTolerance = 4e-3;

// Where a version's angles come from, which sets its per-element bound.
enum class Angles {
  kFloat32,  // v1: HF's float32 inv_freq and product, up to ~5e-4 rad off at pos 8191
  kTable,    // v2, v3: rope_table_build's float64 angles, cos/sin rounded once to float
};
Angles angles_of(const RopeVersion& version) {
  return version.launch == rope_v1_sincos ? Angles::kFloat32 : Angles::kTable;
}

// Per element, e the reference value and n = |(e[i], e[i + D/2])| the length of its
// rotation pair (a rotation keeps it, so the reference gives the input pair's length):
//  * kFloat32: half a bf16 spacing (<= 2^-8 |e|) plus v1's angle error, up to ~5e-4 rad
//    times a pair length < 6 for N(0,1) inputs: 2^-8 |e| + 4e-3.
//  * kTable: the kernel's fp32 value v is close to the exact rotation: cos and sin are
//    floats of float64 values (off by <= u = 2^-24 each), and two products and a sum,
//    each rounded (rope_rotate.cuh), add <= 3u (|x1| + |x2|); so |v - exact| <= 4u (|x1|
//    + |x2|) <= 4 sqrt(2) u n < 6u n. rope_cpu's fp32 reference is built the same way
//    (< 6u n again); the float64 golden one is exact. So with s = 16u n = 2^-20 n,
//    |out - e| <= s + half a bf16 spacing at |e| + s: one correct rounding of an exact
//    rotation, which is what the table promises, and what a bf16 table, float32 angles
//    or a second rounding would break.
int count_bad_elements(const std::vector<float>& actual, const std::vector<double>& expected, int D, Angles angles) {
  int bad = 0;
  const int half = D / 2;
  for (size_t i = 0; i < actual.size(); ++i) {
    double e = expected[i], bound = 0;
    if (angles == Angles::kFloat32) {
      bound = std::ldexp(std::fabs(e), -8) + 4e-3;
    } else {
      const size_t partner = int(i % D) < half ? i + half : i - half;
      const double slack = std::ldexp(std::hypot(e, expected[partner]), -20);
      int exponent = 0;
      std::frexp(std::fabs(e) + slack, &exponent);  // |e| + s = m 2^exponent, m in [0.5, 1)
      bound = slack + (std::fabs(e) + slack > 0 ? 0.5 * std::ldexp(1.0, exponent - 8) : 0.0);
    }
    if (!(std::fabs(actual[i] - e) <= bound)) ++bad;  // NaN counts as bad
  }
  return bad;
}

void require_close(const std::string& label, const std::vector<uint16_t>& actual_bits,
                   const std::vector<double>& expected, int D, Angles angles) {
  CompareResult result = compare_bf16(label, actual_bits, expected, kRopeTolerance);
  int bad = count_bad_elements(bf16_to_float(actual_bits), expected, D, angles);
  INFO(result.report << "\n  elements outside the per-element bound ("
                     << (angles == Angles::kFloat32 ? "float32 angles" : "float64 table") << "): " << bad);
  REQUIRE(result.passed);
  REQUIRE(bad == 0);
}

struct RopeOutput {
  std::vector<uint16_t> q, k;
};

RopeOutput run_version(const RopeVersion& version, const std::vector<uint16_t>& q_bits,
                       const std::vector<uint16_t>& k_bits, const std::vector<int32_t>& positions, int T, int H,
                       int Hkv, const RopeTable& table) {
  DeviceBuffer<uint16_t> q(q_bits), k(k_bits);
  DeviceBuffer<int32_t> pos(positions);
  version.launch(reinterpret_cast<__nv_bfloat16*>(q.data()), reinterpret_cast<__nv_bfloat16*>(k.data()), pos.data(),
                 T, H, Hkv, table, 0);
  CUDA_CHECK(cudaDeviceSynchronize());
  return {q.to_host(), k.to_host()};
}

std::vector<double> to_double(const std::vector<float>& values) { return {values.begin(), values.end()}; }

NpyArray load(const std::string& name, const std::string& tensor) {
  return load_npy(golden_path("04_rope", name + "_" + tensor + ".npy"));
}

}  // namespace

// v3 needs D % 16 == 0: at D = 40 it must refuse (and v1, v2 must be right).
bool refused_by_v3(const RopeVersion& version, int D) {
  return version.launch == rope_v3_fused_vectorized && D % 16 != 0;
}

TEST_CASE("every rope version matches the float64 golden rotation", "[ch04][gpu]") {
  for (const char* name : {"odd64", "odd128", "smollm2", "bielik", "decode", "d40"}) {
    NpyArray q = load(name, "q"), k = load(name, "k");
    int T = int(q.shape[0]), H = int(q.shape[1]), D = int(q.shape[2]), Hkv = int(k.shape[1]);
    RopeTable table = rope_table_build(D, load(name, "theta").to_float()[0], kMaxPositions);
    for (const RopeVersion& version : kRopeVersions) {
      INFO("case " << name << " version " << version.name << " T=" << T << " H=" << H << " Hkv=" << Hkv
                   << " D=" << D);
      std::vector<int32_t> positions = load(name, "positions").to_int32();
      if (refused_by_v3(version, D)) {
        REQUIRE_THROWS_AS(run_version(version, q.bf16_bits(), k.bf16_bits(), positions, T, H, Hkv, table),
                          std::invalid_argument);
        continue;
      }
      RopeOutput out = run_version(version, q.bf16_bits(), k.bf16_bits(), positions, T, H, Hkv, table);
      require_close("q", out.q, load(name, "q_expected").to_double(), D, angles_of(version));
      require_close("k", out.k, load(name, "k_expected").to_double(), D, angles_of(version));
    }
  }
}

TEST_CASE("every rope version matches the CPU reference on fresh random inputs", "[ch04][gpu]") {
  uint64_t seed = fresh_seed();
  // (T, H, Hkv, D, theta): odd heads, SmolLM2, Bielik, D = 40 (v3 refuses it), and 140
  // heads of 128: 140 x 8 threads > 1024, so v3's block holds 128 head slots and its
  // threads loop over the last 12 heads (`head += slots`), which Bielik's 14 never do.
  for (auto [T, H, Hkv, D, theta] : {std::tuple{7, 3, 1, 64, 1e5f}, std::tuple{5, 3, 1, 128, 1e6f},
                                     std::tuple{41, 9, 3, 64, 1e5f}, std::tuple{300, 12, 2, 128, 1e6f},
                                     std::tuple{6, 5, 2, 40, 1e4f}, std::tuple{3, 120, 20, 128, 1e6f}}) {
    INFO("seed " << seed << " T=" << T << " H=" << H << " Hkv=" << Hkv << " D=" << D);
    std::vector<uint16_t> q = random_bf16(size_t(T) * H * D, seed), k = random_bf16(size_t(T) * Hkv * D, seed + 1);
    std::vector<int32_t> positions = random_ints(T, seed + 2, 0, kMaxPositions - 1);
    positions[0] = kMaxPositions - 1;
    std::vector<float> q_expected = bf16_to_float(q), k_expected = bf16_to_float(k);
    rope_cpu(q_expected.data(), k_expected.data(), positions.data(), T, H, Hkv, D, theta);
    RopeTable table = rope_table_build(D, theta, kMaxPositions);
    for (const RopeVersion& version : kRopeVersions) {
      INFO("version " << version.name);
      if (refused_by_v3(version, D)) {
        REQUIRE_THROWS_AS(run_version(version, q, k, positions, T, H, Hkv, table), std::invalid_argument);
        continue;
      }
      RopeOutput out = run_version(version, q, k, positions, T, H, Hkv, table);
      require_close("q", out.q, to_double(q_expected), D, angles_of(version));
      require_close("k", out.k, to_double(k_expected), D, angles_of(version));
    }
  }
}

TEST_CASE("prefill in one call equals token-by-token decode, and the offset helper", "[ch04][gpu]") {
  const int T = 13, H = 3, Hkv = 1, D = 64, start = 4000;
  uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::vector<uint16_t> q = random_bf16(size_t(T) * H * D, seed), k = random_bf16(size_t(T) * Hkv * D, seed + 1);
  RopeTable table = rope_table_build(D, 1e5f, kMaxPositions);

  DeviceBuffer<int32_t> positions(T);
  rope_positions_from_offset(positions.data(), T, start);
  std::vector<int32_t> host_positions = positions.to_host();
  for (int t = 0; t < T; ++t) REQUIRE(host_positions[t] == start + t);

  for (const RopeVersion& version : kRopeVersions) {
    INFO("version " << version.name);
    RopeOutput whole = run_version(version, q, k, host_positions, T, H, Hkv, table);
    for (int t = 0; t < T; ++t) {  // one token at a time, as decode would see them
      std::vector<uint16_t> q_row(q.begin() + size_t(t) * H * D, q.begin() + size_t(t + 1) * H * D);
      std::vector<uint16_t> k_row(k.begin() + size_t(t) * Hkv * D, k.begin() + size_t(t + 1) * Hkv * D);
      RopeOutput one = run_version(version, q_row, k_row, {start + t}, 1, H, Hkv, table);
      REQUIRE(std::equal(one.q.begin(), one.q.end(), whole.q.begin() + size_t(t) * H * D));
      REQUIRE(std::equal(one.k.begin(), one.k.end(), whole.k.begin() + size_t(t) * Hkv * D));
    }
  }
}

TEST_CASE("out-of-range positions give NaN rows, never reads past the table", "[ch04][gpu]") {
  const int T = 3, H = 3, Hkv = 1, D = 128, max_positions = 64;
  uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::vector<uint16_t> q = random_bf16(size_t(T) * H * D, seed), k = random_bf16(size_t(T) * Hkv * D, seed + 1);
  std::vector<int32_t> positions = {-1, 63, max_positions};  // tokens 0 and 2 are invalid
  RopeTable table = rope_table_build(D, 1e6f, max_positions);
  std::vector<float> q_expected = bf16_to_float(q), k_expected = bf16_to_float(k);
  int32_t good = 63;
  rope_cpu(q_expected.data() + H * D, k_expected.data() + Hkv * D, &good, 1, H, Hkv, D, 1e6f);
  for (const RopeVersion& version : kRopeVersions) {
    INFO("version " << version.name);
    RopeOutput out = run_version(version, q, k, positions, T, H, Hkv, table);
    std::vector<float> qf = bf16_to_float(out.q), kf = bf16_to_float(out.k);
    for (int t : {0, 2}) {
      for (int e = 0; e < H * D; ++e) REQUIRE(std::isnan(qf[size_t(t) * H * D + e]));
      for (int e = 0; e < Hkv * D; ++e) REQUIRE(std::isnan(kf[size_t(t) * Hkv * D + e]));
    }
    std::vector<uint16_t> q_mid(out.q.begin() + H * D, out.q.begin() + 2 * H * D);
    std::vector<double> q_mid_expected(q_expected.begin() + H * D, q_expected.begin() + 2 * H * D);
    require_close("q token 1", q_mid, q_mid_expected, D, angles_of(version));
  }
}

TEST_CASE("the cos/sin table matches float64 angles", "[ch04][gpu]") {
  for (auto [D, theta] : {std::pair{128, 1e6f}, std::pair{64, 1e5f}}) {
    RopeTable table = rope_table_build(D, theta, kMaxPositions);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> cos_values = table.cos.to_host(), sin_values = table.sin.to_host();
    double worst = 0;
    for (int pos = 0; pos < kMaxPositions; ++pos) {
      for (int i = 0; i < D / 2; ++i) {
        double angle = pos * std::pow(double(theta), -2.0 * i / D);
        size_t at = size_t(pos) * (D / 2) + i;
        worst = std::fmax(worst, std::fabs(cos_values[at] - std::cos(angle)));
        worst = std::fmax(worst, std::fabs(sin_values[at] - std::sin(angle)));
      }
    }
    INFO("D=" << D << " worst |table - float64| = " << worst);
    REQUIRE(worst <= 1e-7);  // float rounding of a value in [-1, 1]: <= 6e-8
  }
}

TEST_CASE("rope v3 refuses head dims it cannot vectorize", "[ch04][gpu]") {
  RopeTable table = rope_table_build(40, 1e4f, 16);
  DeviceBuffer<uint16_t> q(40), k(40);
  DeviceBuffer<int32_t> pos(std::vector<int32_t>{0});
  REQUIRE_THROWS_AS(rope_v3_fused_vectorized(reinterpret_cast<__nv_bfloat16*>(q.data()),
                                             reinterpret_cast<__nv_bfloat16*>(k.data()), pos.data(), 1, 1, 1, table),
                    std::invalid_argument);
}
