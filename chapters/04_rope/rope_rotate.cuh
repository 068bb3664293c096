/// @file rope_rotate.cuh
/// @brief The RoPE rotation of one pair, with every rounding spelled out: the one
/// expression every RoPE kernel of the book evaluates (chapter 04's v1-v3, and the fused
/// kernels of chapter 08 that rotate q and k inside other work).
///
/// Why not simply `a * cos - c * sin`: nvcc may contract a product and a sum into one FMA
/// (one rounding instead of two), and whether it does depends on the code around the
/// expression. The front end already turned v3's `c * cos + a * sin` into an FMA while
/// it left `a * cos - c * sin` as a multiply and a subtract, which ptxas may or may not
/// contract later. Two kernels computing "the same" rotation can then differ by one
/// float ulp, and that flips a bf16 rounding now and then: a bit-for-bit test between two
/// kernels fails for some seeds (docs/gpu_runs.md, 2026-11-29 22:00). The `_rn`
/// intrinsics are never contracted, so every kernel that calls these functions gets the
/// same bits from the same inputs.
#pragma once

#include <cuda_runtime.h>

namespace bielik {

/// First output of the rotation of the pair (a, c) = (x[i], x[i + D/2]):
/// a cos - c sin, each product and the difference rounded separately (round to nearest).
__device__ __forceinline__ float rope_rotate_first(float a, float c, float cosine, float sine) {
  return __fsub_rn(__fmul_rn(a, cosine), __fmul_rn(c, sine));
}

/// Second output of the same rotation: c cos + a sin, rounded the same way.
__device__ __forceinline__ float rope_rotate_second(float a, float c, float cosine, float sine) {
  return __fadd_rn(__fmul_rn(c, cosine), __fmul_rn(a, sine));
}

}  // namespace bielik
