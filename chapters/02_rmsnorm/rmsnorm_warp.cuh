// Pieces shared by v3 and v4 (one warp per row, 16-byte vectors). Internal to the
// chapter: the public API is rmsnorm.cuh.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

namespace bielik {
namespace rmsnorm_warp {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 4;  // 4 rows per block of 128 threads
constexpr int kBf16PerVector = 8;  // one int4 = 16 bytes = 8 bf16, the widest load a thread can issue

/// Sum over the 32 lanes of a warp, returned to every lane. Each round adds the value
/// held by the lane `offset` away (xor pairs them up), so after 5 rounds every lane
/// holds the total: no shared memory and no __syncthreads(), only register exchanges.
__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}

/// The 8 bf16 values of one 16-byte vector, widened to fp32 (exact).
__device__ __forceinline__ void unpack_bf16x8(const int4& packed, float (&values)[kBf16PerVector]) {
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    float2 pair = __bfloat1622float2(pairs[k]);
    values[2 * k] = pair.x;
    values[2 * k + 1] = pair.y;
  }
}

/// 8 fp32 values rounded to bf16 (nearest even) and packed into one 16-byte vector.
__device__ __forceinline__ int4 pack_bf16x8(const float (&values)[kBf16PerVector]) {
  int4 packed;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&packed);
#pragma unroll
  for (int k = 0; k < 4; ++k) pairs[k] = __floats2bfloat162_rn(values[2 * k], values[2 * k + 1]);
  return packed;
}

inline bool aligned_16_bytes(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

/// Calls launch(std::integral_constant<int, N>{}) with the smallest compiled N >= the
/// 16-byte vectors each lane must hold for a row of `vectors` vectors, so the kernel can
/// keep the row in a fixed-size register array (N = 6 for Bielik's C = 1536, 3 for
/// SmolLM2's 576). Returns false when a row is too wide (C > 4096) for registers.
template <typename Launch>
bool launch_with_vectors_per_lane(int vectors, Launch&& launch) {
  int per_lane = (vectors + kWarpSize - 1) / kWarpSize;
  if (per_lane <= 1) launch(std::integral_constant<int, 1>{});
  else if (per_lane <= 2) launch(std::integral_constant<int, 2>{});
  else if (per_lane <= 3) launch(std::integral_constant<int, 3>{});
  else if (per_lane <= 4) launch(std::integral_constant<int, 4>{});
  else if (per_lane <= 6) launch(std::integral_constant<int, 6>{});
  else if (per_lane <= 8) launch(std::integral_constant<int, 8>{});
  else if (per_lane <= 12) launch(std::integral_constant<int, 12>{});
  else if (per_lane <= 16) launch(std::integral_constant<int, 16>{});
  else return false;
  return true;
}

}  // namespace rmsnorm_warp
}  // namespace bielik
