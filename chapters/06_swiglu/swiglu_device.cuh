/// @file swiglu_device.cuh
/// @brief What the chapter's kernels share: silu in fp32, the optional bias add, the bias,
/// shape and tile checks, and the GEMV's widening of 8 bf16.
///
/// unpack_bf16x8 does the same as unpack_8, private to chapter 03's
/// gemv_v1_warp_per_row.cu; it is written again here because that file keeps it in an
/// anonymous namespace (see README.md). The GEMV's streaming weight load is chapter 03's
/// ptx::load_streaming_16 (matmul_ptx.cuh).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace bielik {

/// silu(z) = z * sigmoid(z) = z / (1 + exp(-z)), in fp32. For z < -88, exp(-z)
/// overflows to +inf and the quotient is -0 (the right limit), never NaN; for z > 88,
/// exp(-z) is 0 and silu(z) = z. __expf (ex2.approx) is a few ulp off in fp32, far
/// below the bf16 rounding that follows.
__device__ __forceinline__ float silu(float z) { return z / (1.0f + __expf(-z)); }

/// acc + b with a bias, acc alone without one: no add of zero is even compiled
/// (x + 0.0f is not foldable in IEEE arithmetic: -0 + 0 = +0).
template <bool HasBias>
__device__ __forceinline__ float add_bias(float acc, float b) {
  if constexpr (HasBias) {
    return acc + b;
  } else {
    return acc;
  }
}

/// Widens 8 bf16 packed in 16 bytes to fp32: a bf16 is the top half of an fp32.
__device__ __forceinline__ void unpack_bf16x8(float (&v)[8], uint4 raw) {
  uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(words[i] << 16);
    v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

/// Host side: true with biases, false without; both or neither (see swiglu.cuh).
inline bool swiglu_has_bias(const void* bg, const void* bu) {
  if ((bg == nullptr) != (bu == nullptr)) {
    throw std::invalid_argument("swiglu: give both gate and up biases (Bielik) or neither (SmolLM2)");
  }
  return bg != nullptr;
}

/// Host side: the sizes swiglu.cuh promises to take, T >= 0, C >= 1, F >= 1; anything
/// else throws std::invalid_argument naming `who`. (Unchecked, a negative T became a
/// ~2^64-byte scratch request in v1 and C = 0 an h of silu(bg) * bu in v3.)
inline void swiglu_check_shape(const char* who, int T, int C, int F) {
  if (T < 0 || C < 1 || F < 1) {
    throw std::invalid_argument(std::string(who) + ": need T >= 0, C >= 1, F >= 1, got T=" + std::to_string(T) +
                                " C=" + std::to_string(C) + " F=" + std::to_string(F));
  }
}

/// Host side: `tile` must index a tile table of `count` entries (the *_tile launchers).
inline void swiglu_check_tile(const char* who, int tile, int count) {
  if (tile < 0 || tile >= count) {
    throw std::invalid_argument(std::string(who) + ": tile " + std::to_string(tile) + " is not in 0.." +
                                std::to_string(count - 1));
  }
}

}  // namespace bielik
