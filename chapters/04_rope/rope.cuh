/// @file rope.cuh
/// @brief Chapter 04: rotary position embedding (RoPE), HuggingFace Llama layout.
///
/// RoPE turns "where is this token" into a rotation of q and k, so that the attention
/// score q_i . k_j depends only on the distance i - j. Every head vector of D values is
/// cut into D/2 pairs and pair i is rotated by the angle pos * inv_freq[i]:
///
///     inv_freq[i] = theta^(-2i/D),  i = 0 .. D/2-1      (theta = rope_theta)
///     x1 = x[i], x2 = x[i + D/2]                        ("rotate half" pairing)
///     x[i]       = x1 * cos(pos * inv_freq[i]) - x2 * sin(pos * inv_freq[i])
///     x[i + D/2] = x2 * cos(pos * inv_freq[i]) + x1 * sin(pos * inv_freq[i])
///
/// The pairing matters: HuggingFace Llama (and so Bielik and SmolLM2 checkpoints)
/// pairs dimension i with i + D/2; llama2.c and the original paper pair 2i with 2i+1.
/// Using the wrong one gives a model that runs and talks nonsense.
///
/// Symbols (docs/conventions.md): T tokens, H query heads, Hkv kv heads, D head_dim.
/// q and k are token-major, as the QKV projection writes them: q (T, H, D), k (T, Hkv, D),
/// bf16, rotated IN PLACE with fp32 math. Each token's position comes from a device
/// array `positions` (T), so one kernel serves prefill (0..T-1), decode (one position)
/// and a prompt appended to an existing KV cache (start..start+T-1).
///
/// A position outside [0, table.max_positions) is a bug upstream (the model checks the
/// context length on the host). Every version writes NaN into that token's q and k rows
/// instead of reading past the table, so the bug cannot go unnoticed downstream.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "device_buffer.cuh"

namespace bielik {

/// The rotation for one model: D, theta, and cos/sin of every angle up to max_positions,
/// built once at load time (rope_table_build). v1 only reads D, theta and max_positions;
/// v2 and v3 read the precomputed values.
struct RopeTable {
  int D = 0;              ///< head_dim (even)
  float theta = 0;        ///< rope_theta: Bielik 1e6, SmolLM2 1e5
  int max_positions = 0;  ///< positions 0 .. max_positions-1 are valid
  DeviceBuffer<float> cos;  ///< (max_positions, D/2) cos(pos * inv_freq[i])
  DeviceBuffer<float> sin;  ///< (max_positions, D/2) sin(pos * inv_freq[i])
};

/// Builds the table on the GPU. Angles are computed in float64 and rounded to float
/// once, so the table is exact to float precision at every position (see README: a
/// float32 product pos * inv_freq is off by up to ~pos * 6e-8 radians).
/// Throws std::invalid_argument for odd or non-positive D, theta <= 0, max_positions <= 0.
RopeTable rope_table_build(int D, float theta, int max_positions, cudaStream_t stream = 0);

/// positions[t] = start + t for t < T: the positions of a prompt of T tokens appended
/// after `start` tokens already in the KV cache (start = 0 for a fresh prefill).
/// Throws std::invalid_argument, before any CUDA call, for T < 0, start < 0, or a last
/// position start + T - 1 that does not fit an int32.
/// @param positions (T) device, written
void rope_positions_from_offset(int32_t* positions, int T, int start, cudaStream_t stream = 0);

/// The size check every GPU version runs first, before any CUDA call: throws
/// std::invalid_argument naming `launcher` for T, H or Hkv < 0 (a negative T used to wrap
/// around in v1's and v2's element count and launch a huge grid). T = 0 or no heads is an
/// empty call and writes nothing.
void rope_check_sizes(const char* launcher, int T, int H, int Hkv);

/// Plain C++ reference: float64 angles, fp32 rotation, in place on fp32 arrays.
/// Throws std::invalid_argument for odd D or a negative position.
/// @param q         (T, H, D)   rotated in place
/// @param k         (T, Hkv, D) rotated in place
/// @param positions (T)         position of each token
void rope_cpu(float* q, float* k, const int32_t* positions, int T, int H, int Hkv, int D, float theta);

/// v1: one thread per rotation pair; the angle is computed in the kernel with
/// powf + sincosf in float32, exactly as HF computes it (so it inherits HF's angle error).
/// q and k are two launches.
/// @param q         (T, H, D) device, rotated in place
/// @param k         (T, Hkv, D) device, rotated in place
/// @param positions (T) device
void rope_v1_sincos(__nv_bfloat16* q, __nv_bfloat16* k, const int32_t* positions, int T, int H, int Hkv,
                    const RopeTable& table, cudaStream_t stream = 0);

/// v2: like v1, but cos/sin are read from the precomputed table: no transcendental
/// functions in the kernel, and exact angles. Same parameters as v1.
void rope_v2_table(__nv_bfloat16* q, __nv_bfloat16* k, const int32_t* positions, int T, int H, int Hkv,
                   const RopeTable& table, cudaStream_t stream = 0);

/// v3: one block per token, q and k in ONE launch, 16-byte loads and stores (8 pairs
/// per thread), each thread loads its cos/sin once and reuses them for every head.
/// Needs D % 16 == 0 and 16-byte aligned q and k (throws std::invalid_argument).
/// Same parameters as v1.
void rope_v3_fused_vectorized(__nv_bfloat16* q, __nv_bfloat16* k, const int32_t* positions, int T, int H,
                              int Hkv, const RopeTable& table, cudaStream_t stream = 0);

/// Every GPU version, in order, so tests and the benchmark loop over the same list.
using RopeLauncher = void (*)(__nv_bfloat16*, __nv_bfloat16*, const int32_t*, int, int, int, const RopeTable&,
                              cudaStream_t);
struct RopeVersion {
  const char* name;
  RopeLauncher launch;
};
inline constexpr RopeVersion kRopeVersions[] = {
    {"v1_sincos", rope_v1_sincos},
    {"v2_table", rope_v2_table},
    {"v3_fused_vectorized", rope_v3_fused_vectorized},
};

/// The version later chapters call (the fastest one measured: v3).
inline void rope_forward(__nv_bfloat16* q, __nv_bfloat16* k, const int32_t* positions, int T, int H, int Hkv,
                         const RopeTable& table, cudaStream_t stream = 0) {
  rope_v3_fused_vectorized(q, k, positions, T, H, Hkv, table, stream);
}

}  // namespace bielik
