// Chapter 08: the CPU backend's dot products (cpu_dot.hpp), both builds, against a
// float64 sum of the same products, at lengths around the AVX2 loop's 8 and 32 and at
// the models' row lengths (SmolLM2's C = 576, F = 1536; Bielik's 1536 and 8960); the
// prefill's 2 x 4 block; and the matmul built from them, with both builds, at odd shapes.
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "catch_compat.hpp"
#include "cpu_dot.hpp"
#include "cpu_ops.hpp"
#include "test_support.hpp"

using namespace bielik;

namespace {

const int kLengths[] = {0, 1, 7, 8, 9, 31, 32, 33, 63, 100, 576, 1536, 8960};

}  // namespace

TEST_CASE("cpu dot: portable and AVX2 builds agree with float64 at odd and model lengths", "[ch08][cpu]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const bool avx2 = cpu_has_avx2_fma();
  if (!avx2) WARN("this CPU has no AVX2 + FMA: only the portable build is checked");
  for (int n : kLengths) {
    INFO("n = " << n);
    std::vector<float> a(size_t(n) + 1), b(size_t(n) + 1);  // +1: offset by one float, unaligned
    for (auto& v : a) v = normal(engine);
    for (auto& v : b) v = normal(engine);
    const std::vector<uint16_t> w = random_bf16(size_t(n) + 1, engine());
    double f32_ref = 0.0, bf16_ref = 0.0, magnitude = 0.0;
    std::vector<float> w_wide(size_t(n) + 1);
    for (int i = 0; i <= n; ++i) w_wide[size_t(i)] = bf16_bits_to_float(w[size_t(i)]);
    for (int i = 1; i <= n; ++i) {
      f32_ref += double(a[size_t(i)]) * b[size_t(i)];
      bf16_ref += double(a[size_t(i)]) * w_wide[size_t(i)];
      magnitude += std::fabs(double(a[size_t(i)]) * b[size_t(i)]) + std::fabs(double(a[size_t(i)]) * w_wide[size_t(i)]);
    }
    // fp32 sums of n products in a tree of partial sums: error well under n * 2^-24 of
    // the magnitude; 1e-6 relative to it plus a floor for n = 0.
    const double tolerance = 1e-6 * magnitude + 1e-30;
    const float* a1 = a.data() + 1;
    CHECK(std::fabs(dot_f32_portable(a1, b.data() + 1, n) - f32_ref) <= tolerance);
    CHECK(std::fabs(dot_bf16_portable(a1, w.data() + 1, n) - bf16_ref) <= tolerance);
    // The bf16 form is the f32 form on the widened row, operation for operation.
    CHECK(dot_bf16_portable(a1, w.data() + 1, n) == dot_f32_portable(a1, w_wide.data() + 1, n));
    if (avx2) {
      CHECK(std::fabs(dot_f32_avx2(a1, b.data() + 1, n) - f32_ref) <= tolerance);
      CHECK(std::fabs(dot_bf16_avx2(a1, w.data() + 1, n) - bf16_ref) <= tolerance);
      CHECK(dot_bf16_avx2(a1, w.data() + 1, n) == dot_f32_avx2(a1, w_wide.data() + 1, n));
    }
  }
}

TEST_CASE("cpu dot: the 2 x 4 prefill block against float64, leaving the rest of out alone", "[ch08][cpu]") {
  if (!cpu_has_avx2_fma()) {
    WARN("this CPU has no AVX2 + FMA: the 2 x 4 block is not built for it");
    return;
  }
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  constexpr int64_t kStride = 7;  // out is (4, 7): the block writes columns 3 and 4
  for (int K : kLengths) {
    INFO("K = " << K);
    std::vector<float> x(size_t(4 * K)), rows(size_t(2 * K));
    for (auto& v : x) v = normal(engine);
    for (auto& v : rows) v = normal(engine);
    std::vector<float> out(4 * kStride, NAN);  // poisoned: what is not written stays NaN
    dot_2x4_f32_avx2(x.data(), rows.data(), K, out.data() + 3, kStride);
    for (int t = 0; t < 4; ++t) {
      for (int64_t column = 0; column < kStride; ++column) {
        const float got = out[size_t(t * kStride + column)];
        if (column != 3 && column != 4) {
          CHECK(std::isnan(got));
          continue;
        }
        const int r = int(column - 3);
        double reference = 0.0, magnitude = 0.0;
        for (int k = 0; k < K; ++k) {
          reference += double(x[size_t(t * K + k)]) * rows[size_t(r * K + k)];
          magnitude += std::fabs(double(x[size_t(t * K + k)]) * rows[size_t(r * K + k)]);
        }
        INFO("token " << t << ", row " << r);
        CHECK(std::fabs(got - reference) <= 1e-6 * magnitude + 1e-30);
      }
    }
  }
}

TEST_CASE("cpu dot: matmul_bf16_cpu with either build against float64 at odd shapes", "[ch08][cpu]") {
  const uint64_t seed = fresh_seed();
  INFO("seed " << seed);
  std::mt19937_64 engine(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  ThreadPool pool(2);
  for (const bool simd : {false, true}) {
    set_cpu_simd(simd);
    for (int T : {1, 3, 4, 5, 9}) {
      for (int N : {1, 2, 7}) {
        for (int K : {5, 33, 576}) {
          for (const bool with_bias : {false, true}) {
            INFO("simd " << cpu_simd_enabled() << ", T = " << T << ", N = " << N << ", K = " << K << ", bias "
                         << with_bias);
            std::vector<float> x(static_cast<size_t>(T * K)), bias(static_cast<size_t>(N));
            for (auto& v : x) v = normal(engine);
            for (auto& v : bias) v = normal(engine);
            const std::vector<uint16_t> w = random_bf16(size_t(N * K), engine());
            std::vector<float> out(size_t(T * N), NAN);
            matmul_bf16_cpu(pool, out.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr, T, N, K);
            for (int t = 0; t < T; ++t) {
              for (int n = 0; n < N; ++n) {
                double reference = with_bias ? bias[size_t(n)] : 0.0, magnitude = std::fabs(reference);
                for (int k = 0; k < K; ++k) {
                  const double product = double(x[size_t(t * K + k)]) * bf16_bits_to_float(w[size_t(n * K + k)]);
                  reference += product;
                  magnitude += std::fabs(product);
                }
                CHECK(std::fabs(out[size_t(t * N + n)] - reference) <= 1e-6 * magnitude);
              }
            }
          }
        }
      }
    }
  }
  set_cpu_simd(true);
}

TEST_CASE("cpu dot: a NaN or inf anywhere reaches the result, in both builds", "[ch08][cpu]") {
  for (int n : {9, 33, 576}) {
    for (int at : {0, n / 2, n - 1}) {  // in the 32-wide body, the 8-wide loop and the tail
      INFO("n = " << n << ", special value at " << at);
      std::vector<float> a(size_t(n), 1.0f), b(size_t(n), 0.5f);
      std::vector<uint16_t> w(size_t(n), 0x3f00);  // bf16 0.5
      a[size_t(at)] = NAN;
      CHECK(std::isnan(dot_f32_portable(a.data(), b.data(), n)));
      CHECK(std::isnan(dot_bf16_portable(a.data(), w.data(), n)));
      if (cpu_has_avx2_fma()) {
        CHECK(std::isnan(dot_f32_avx2(a.data(), b.data(), n)));
        CHECK(std::isnan(dot_bf16_avx2(a.data(), w.data(), n)));
      }
      a[size_t(at)] = 1.0f;
      w[size_t(at)] = 0x7f80;  // bf16 +inf
      CHECK(dot_bf16_portable(a.data(), w.data(), n) == INFINITY);
      if (cpu_has_avx2_fma()) CHECK(dot_bf16_avx2(a.data(), w.data(), n) == INFINITY);
    }
  }
}

TEST_CASE("cpu dot: the switch between the builds", "[ch08][cpu]") {
  set_cpu_simd(false);
  CHECK_FALSE(cpu_simd_enabled());
  const std::vector<float> a = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  CHECK(dot_f32(a.data(), b.data(), 9) == dot_f32_portable(a.data(), b.data(), 9));
  set_cpu_simd(true);
  CHECK(cpu_simd_enabled() == cpu_has_avx2_fma());
  CHECK(dot_f32(a.data(), b.data(), 9) == 165.0f);  // small integers: exact in any order
}
