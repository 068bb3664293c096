/// @file cpu_ops.hpp
/// @brief The CPU backend's building blocks: fp32 math on bf16 weights, threaded over rows.
///
/// The same ops as chapters 02-07's GPU kernels, written for a CPU: activations are
/// fp32 throughout, weights stay bf16 in memory (half the bytes to stream, and a
/// decode step is nothing but streaming weights) and are widened to fp32 on the fly.
/// Matmuls are split over output rows (features) among the pool's threads, which
/// never write the same element, so results do not depend on the thread count.
///
/// Symbols: T tokens of the chunk, C hidden, H query heads, Hkv kv heads, D head_dim,
/// F ffn hidden, V vocab, P = position of the chunk's first token.
#pragma once

#include <cstdint>

#include "thread_pool.hpp"

namespace bielik {

/// out = x W^T + b: a linear layer in nn.Linear's layout.
/// @param out  (T, N) fp32
/// @param x    (T, K) fp32
/// @param w    (N, K) bf16 bits
/// @param bias (N) fp32, or nullptr
void matmul_bf16_cpu(ThreadPool& pool, float* out, const float* x, const uint16_t* w, const float* bias, int64_t T,
                     int64_t N, int64_t K);

/// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight.
/// @param out    (T, C) fp32 (may alias x)
/// @param x      (T, C) fp32
/// @param weight (C) fp32
void rmsnorm_rows_cpu(float* out, const float* x, const float* weight, int64_t T, int64_t C, float eps);

/// HF rotate-half RoPE in place, row t at absolute position P + t:
///   y[i] = x[i] cos(a_i) - x[i + D/2] sin(a_i),  y[i + D/2] = x[i + D/2] cos(a_i) + x[i] sin(a_i)
/// with a_i = position * theta^(-2i/D), i < D/2 (cos/sin precomputed per position).
/// @param x       (T, heads, D) fp32, rotated in place
/// @param cos_sin (positions, D/2, 2) fp32: cos and sin of a_i for every position
void rope_rotate_half_cpu(float* x, const float* cos_sin, int64_t T, int64_t heads, int64_t D, int64_t P);

/// Causal grouped-query attention of a chunk over the KV cache, which already holds
/// positions 0..P+T-1 (the chunk's own keys included). Query head h reads kv head
/// h / (H / Hkv); row t attends to positions 0..P+t.
/// @param out     (T, H, D) fp32
/// @param q       (T, H, D) fp32, RoPE applied
/// @param k_cache (>= P+T, Hkv, D) fp32, RoPE applied
/// @param v_cache (>= P+T, Hkv, D) fp32
void attention_cpu(ThreadPool& pool, float* out, const float* q, const float* k_cache, const float* v_cache, int64_t T,
                   int64_t P, int64_t H, int64_t Hkv, int64_t D);

/// gate = silu(gate) * up, in place: the SwiGLU activation (biases already added).
/// @param gate (count) fp32, e.g. (T, F); overwritten with the result
/// @param up   (count) fp32
void swiglu_cpu(float* gate, const float* up, int64_t count);

}  // namespace bielik
