/// @file cpu_dot.hpp
/// @brief The dot products the CPU backend is made of, portable and AVX2 + FMA.
///
/// A decode step on the CPU is, like on the GPU, nothing but weight rows streamed past
/// the activations: out[n] = dot(x, W[n]). Each row is one call here, in one of two
/// builds with the same interface:
///   - portable C++: eight independent running sums, which the compiler turns into
///     SIMD on any x86-64 (SSE2) or ARM machine;
///   - AVX2 + FMA (x86-64 CPUs since 2013): four 8-wide accumulators, so 32 products
///     are in flight and the FMA's 4-cycle latency is hidden; bf16 weights are widened
///     in registers (zero-extend 16 -> 32 bits, shift left by 16: exact).
/// The two sum in different orders, so their results differ in the last bits (the tests
/// hold both to a float64 reference). Which one runs is decided once, at run time, from
/// the CPU's feature flags: the program stays portable.
#pragma once

#include <cstdint>

namespace bielik {

/// a . b over n floats; a and b need no alignment.
float dot_f32_portable(const float* a, const float* b, int64_t n);
/// a . widen(w) over n elements, w holding bf16 bits.
float dot_bf16_portable(const float* a, const uint16_t* w, int64_t n);

/// True when this CPU and this build can run the AVX2 + FMA versions.
bool cpu_has_avx2_fma();
/// The AVX2 + FMA versions; call only when cpu_has_avx2_fma().
float dot_f32_avx2(const float* a, const float* b, int64_t n);
float dot_bf16_avx2(const float* a, const uint16_t* w, int64_t n);

/// A 2 x 4 block of a matmul, for prefill: out[t * out_stride + r] = x_t . rows_r for
/// the 4 tokens x_t = x + t * K and the 2 fp32 rows rows_r = rows + r * K. Each weight
/// vector loaded serves 4 tokens and each token vector 2 rows, so 8 multiply-adds need
/// 6 loads instead of 16: the dots are no longer waiting on loads. AVX2 + FMA only.
void dot_2x4_f32_avx2(const float* x, const float* rows, int64_t K, float* out, int64_t out_stride);

/// Whether the CPU backend uses the AVX2 versions: cpu_has_avx2_fma(), unless the
/// environment says BIELIK_CPU_SIMD=0 or set_cpu_simd(false) was called (benchmarks
/// measure both in one run). Process-wide.
bool cpu_simd_enabled();
/// Turns the AVX2 versions off or back on (on only takes effect where they can run).
void set_cpu_simd(bool enabled);

/// The dispatching forms the backend calls.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  return cpu_simd_enabled() ? dot_f32_avx2(a, b, n) : dot_f32_portable(a, b, n);
}
inline float dot_bf16(const float* a, const uint16_t* w, int64_t n) {
  return cpu_simd_enabled() ? dot_bf16_avx2(a, w, n) : dot_bf16_portable(a, w, n);
}

}  // namespace bielik
