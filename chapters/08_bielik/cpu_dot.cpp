// The CPU backend's dot products: portable C++ and AVX2 + FMA, picked at run time.
#include "cpu_dot.hpp"

#include "bf16.hpp"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define BIELIK_HAVE_AVX2_BUILD 1
#endif

namespace bielik {

namespace {

// -1: not decided yet; then 0 or 1. Decided on first use from the CPU and the environment.
std::atomic<int> simd_state{-1};

}  // namespace

// Eight independent partial sums: the compiler turns the inner loop into SIMD
// multiply-adds (a single running sum would be one long dependency chain, and
// without -ffast-math the compiler may not reorder it for us).
float dot_f32_portable(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// The same with the weight row still in bf16: used for one token (decode), where each
// weight is used exactly once and widening it in registers saves a trip through memory.
float dot_bf16_portable(const float* a, const uint16_t* w, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * bf16_bits_to_float(w[i + j]);
  }
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += a[i] * bf16_bits_to_float(w[i]);
  return sum;
}

#ifdef BIELIK_HAVE_AVX2_BUILD

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}

namespace {

// The 8 lanes of v summed: the upper half folded onto the lower, then twice more.
__attribute__((target("avx2,fma"))) inline float lane_sum(__m256 v) {
  __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  half = _mm_add_ps(half, _mm_movehl_ps(half, half));
  half = _mm_add_ss(half, _mm_movehdup_ps(half));
  return _mm_cvtss_f32(half);
}

// 8 bf16 values (16 bytes) -> 8 floats: zero-extend each to 32 bits, move it to the top.
__attribute__((target("avx2,fma"))) inline __m256 load_bf16x8(const uint16_t* w) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

}  // namespace

// Four accumulators: an FMA takes 4 cycles and two can start each cycle, so one
// accumulator would leave the units idle 7 cycles in 8 waiting on itself.
__attribute__((target("avx2,fma"))) float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float sum = lane_sum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

__attribute__((target("avx2,fma"))) float dot_bf16_avx2(const float* a, const uint16_t* w, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_bf16x8(w + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_bf16x8(w + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), load_bf16x8(w + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), load_bf16x8(w + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_bf16x8(w + i), acc0);
  float sum = lane_sum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
  for (; i < n; ++i) sum += a[i] * bf16_bits_to_float(w[i]);
  return sum;
}

__attribute__((target("avx2,fma"))) void dot_2x4_f32_avx2(const float* x, const float* rows, int64_t K, float* out,
                                                          int64_t out_stride) {
  // acc[t][r]: token t against row r, 8 lanes each; 8 of the 16 vector registers.
  __m256 acc[4][2];
  for (auto& token : acc) token[0] = token[1] = _mm256_setzero_ps();
  const float* row0 = rows;
  const float* row1 = rows + K;
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 w0 = _mm256_loadu_ps(row0 + k), w1 = _mm256_loadu_ps(row1 + k);
    for (int t = 0; t < 4; ++t) {
      const __m256 xt = _mm256_loadu_ps(x + t * K + k);
      acc[t][0] = _mm256_fmadd_ps(xt, w0, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(xt, w1, acc[t][1]);
    }
  }
  for (int t = 0; t < 4; ++t) {
    float sum0 = lane_sum(acc[t][0]), sum1 = lane_sum(acc[t][1]);
    for (int64_t tail = k; tail < K; ++tail) {
      sum0 += x[t * K + tail] * row0[tail];
      sum1 += x[t * K + tail] * row1[tail];
    }
    out[t * out_stride] = sum0;
    out[t * out_stride + 1] = sum1;
  }
}

#else  // not x86-64 with GCC or clang: the portable versions only

bool cpu_has_avx2_fma() { return false; }
float dot_f32_avx2(const float*, const float*, int64_t) {
  throw std::logic_error("dot_f32_avx2: not built for this CPU (check cpu_has_avx2_fma() first)");
}
float dot_bf16_avx2(const float*, const uint16_t*, int64_t) {
  throw std::logic_error("dot_bf16_avx2: not built for this CPU (check cpu_has_avx2_fma() first)");
}
void dot_2x4_f32_avx2(const float*, const float*, int64_t, float*, int64_t) {
  throw std::logic_error("dot_2x4_f32_avx2: not built for this CPU (check cpu_has_avx2_fma() first)");
}

#endif

bool cpu_simd_enabled() {
  int state = simd_state.load(std::memory_order_relaxed);
  if (state < 0) {
    const char* env = std::getenv("BIELIK_CPU_SIMD");
    const bool wanted = !(env != nullptr && std::strcmp(env, "0") == 0);
    state = wanted && cpu_has_avx2_fma() ? 1 : 0;
    simd_state.store(state, std::memory_order_relaxed);
  }
  return state == 1;
}

void set_cpu_simd(bool enabled) { simd_state.store(enabled && cpu_has_avx2_fma() ? 1 : 0, std::memory_order_relaxed); }

}  // namespace bielik
