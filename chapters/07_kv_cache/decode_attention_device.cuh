// Device building blocks shared by the decode attention versions (not a public API).
//
// The lane layout both versions use: one key row of D bf16 is D/8 16-byte vectors, so
// an aligned group of kLanesPerKey = D/8 lanes reads one key with one load each
// (D=128: 16 lanes, two keys per warp; D=64: 8 lanes, four keys per warp). Each lane
// owns 8 of the D dimensions: its slice of q, of every key and value, and of the output
// accumulator. A dot product is 8 FMAs per lane plus log2(D/8) shuffles.
//
// Softmax state. For a set of keys S and one query head the state is
//     m = max_{j in S} s_j,   l = sum_j 2^(s_j - m),   acc = sum_j 2^(s_j - m) v_j
// with s_j the score in log2 units (q is pre-multiplied by log2(e)/sqrt(D), so 2^s is
// e^(q.k/sqrt(D)) and the kernel uses the cheap exp2). Two states over disjoint key
// sets merge exactly (rescale both to the larger max and add), which is what lets
// lanes, warps, blocks and splits each work on their own keys: out = acc / l at the end.
// An empty set has m = -inf, l = 0, acc = 0 and weighs nothing in a merge.
#pragma once

#include <cuda_bf16.h>

#include <cmath>

namespace bielik::decode {

constexpr float kLog2e = 1.4426950408889634f;

/// Lanes that share one key row, and keys side by side in one warp.
template <int D>
struct LaneLayout {
  static_assert(D == 64 || D == 128, "decode attention is compiled for D = 64 and 128");
  static constexpr int kLanesPerKey = D / 8;
  static constexpr int kKeysPerWarp = 32 / kLanesPerKey;
};

/// One 16-byte load (8 bf16) widened to fp32.
__device__ __forceinline__ void bf16x8_to_float(const int4& raw, float (&out)[8]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

/// Sum over the kLanes lanes of an aligned lane group; every lane of the group gets it.
/// All 32 lanes must call it (full-warp shuffles).
template <int kLanes>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
  for (int offset = kLanes / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

/// (m, l, acc) <- merge of itself and (m_other, l_other, acc_other).
__device__ __forceinline__ void merge_state(float& m, float& l, float (&acc)[8], float m_other, float l_other,
                                            const float (&acc_other)[8]) {
  float m_new = fmaxf(m, m_other);
  if (m_new == -INFINITY) return;  // both empty
  float a = exp2f(m - m_new), b = exp2f(m_other - m_new);  // exp2(-inf) = 0
  l = l * a + l_other * b;
#pragma unroll
  for (int e = 0; e < 8; ++e) acc[e] = acc[e] * a + acc_other[e] * b;
  m = m_new;
}

/// Merges the states of all lane groups of a warp into every group (butterfly over the
/// group index). All 32 lanes must call it.
template <int kLanesPerKey>
__device__ __forceinline__ void warp_merge_groups(float& m, float& l, float (&acc)[8]) {
#pragma unroll
  for (int offset = kLanesPerKey; offset < 32; offset *= 2) {
    float m_other = __shfl_xor_sync(0xffffffffu, m, offset);
    float l_other = __shfl_xor_sync(0xffffffffu, l, offset);
    float acc_other[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc_other[e] = __shfl_xor_sync(0xffffffffu, acc[e], offset);
    merge_state(m, l, acc, m_other, l_other, acc_other);
  }
}

}  // namespace bielik::decode
