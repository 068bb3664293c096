/// @file attention_tile_step.cuh
/// @brief One warp's step of flash attention over one 64-key tile (v3, v5, v6).
///
/// v3 introduced this step; v5 and v6 only change which tiles a warp visits and how the
/// partial results meet, so the step itself lives here once:
///   1. S = Q K^T for the warp's 16 query rows x the tile's keys (mma.sync m16n8k16);
///   2. the causal / end-of-keys mask, only on tiles that need it;
///   3. the online softmax: new running max per row, rescale the past (O and the sum);
///   4. O += P V with P taken straight from the S registers (FlashAttention-2's trick:
///      the accumulator layout of S is the A-operand layout of P V).
/// v3's file explains each step in full.
#pragma once

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "attention_ptx.cuh"
#include "attention_tile_load.cuh"

namespace bielik {

/// Keys per tile, for every tensor-core version.
constexpr int kFlashTileKeys = 64;

/// Loads the warp's 16 query rows of a (rows, D + 8) shared-memory Q tile as mma A
/// fragments, kept in registers for the whole key loop.
/// @param q_frag (D/16, 4) registers, written
/// @param q_rows the warp's first row in the Q tile (shared)
template <int D>
__device__ __forceinline__ void load_query_fragments(uint32_t (&q_frag)[D / 16][4], const __nv_bfloat16* q_rows,
                                                     int lane) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    // lanes 0-7: rows 0-7 / cols 0-7, 8-15: rows 8-15 / cols 0-7, 16-23: rows 0-7 / cols 8-15, 24-31: rows 8-15 / cols 8-15
    ptx::ldmatrix_x4(q_frag[kk], q_rows + (lane % 8 + (lane / 8) % 2 * 8) * kTileStride<D> + kk * 16 + lane / 16 * 8);
  }
}

/// One tile of keys for one warp. The thread holds rows row_top and row_bottom
/// (= row_top + 8) of O in the mma C layout, their running max (unscaled scores, -inf
/// while nothing was visible) and its share of their softmax sums.
/// @param k_tile (64, D + 8) shared, keys tile * 64 .. tile * 64 + 63
/// @param v_tile (64, D + 8) shared, the same keys' values
/// @param needs_mask whether the diagonal or the end of the keys crosses this tile
/// @param offset Tkv - Tq: query row i sits at position offset + i
template <int D>
__device__ __forceinline__ void flash_tile_step(const uint32_t (&q_frag)[D / 16][4], const __nv_bfloat16* k_tile,
                                                const __nv_bfloat16* v_tile, int tile, bool needs_mask, int offset,
                                                int Tkv, int row_top, int row_bottom, float scale_log2, int lane,
                                                float (&o)[D / 8][4], float (&row_max)[2], float (&row_sum)[2]) {
  constexpr int S = kTileStride<D>;
  constexpr int kBlockN = kFlashTileKeys;
  const int thread_in_group = lane % 4;

  // S = Q K^T for 16 rows x 64 keys: s[j] is the 16x8 block of keys 8j .. 8j+7.
  float s[kBlockN / 8][4] = {};
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
    for (int jp = 0; jp < kBlockN / 16; ++jp) {
      // K rows are B columns. lanes 0-7: keys 0-7 / d 0-7, 8-15: keys 0-7 / d 8-15,
      // 16-23: keys 8-15 / d 0-7, 24-31: keys 8-15 / d 8-15 (of this 16x16 block).
      uint32_t b[4];
      ptx::ldmatrix_x4(b, k_tile + (jp * 16 + lane % 8 + lane / 16 * 8) * S + kk * 16 + (lane / 8) % 2 * 8);
      ptx::mma_bf16_16x8x16(s[2 * jp], q_frag[kk], b[0], b[1]);
      ptx::mma_bf16_16x8x16(s[2 * jp + 1], q_frag[kk], b[2], b[3]);
    }
  }

  if (needs_mask) {
    const int key0 = tile * kBlockN + 2 * thread_in_group;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + 8 * j + (e & 1);
        const int row = e < 2 ? row_top : row_bottom;
        if (key > offset + row || key >= Tkv) s[j][e] = -INFINITY;
      }
    }
  }

  // Online softmax: new running max per row (4 lanes share a row), rescale the past.
  float scaled_max[2], correction[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) tile_max = fmaxf(tile_max, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
    const float new_max = fmaxf(row_max[r], tile_max);
    // A row with nothing visible yet keeps max -inf (v5 and v6 can start a row on a fully
    // masked tile); use 0 so exp2 sees -inf, not NaN.
    scaled_max[r] = new_max == -INFINITY ? 0.0f : new_max * scale_log2;
    correction[r] = exp2f(row_max[r] * scale_log2 - scaled_max[r]);  // 0 on the first tile
    row_max[r] = new_max;
  }
  float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
  for (int j = 0; j < kBlockN / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[j][e] = exp2f(fmaf(s[j][e], scale_log2, -scaled_max[e / 2]));  // masked: exp2(-inf) = 0
      tile_sum[e / 2] += s[j][e];
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) row_sum[r] = row_sum[r] * correction[r] + tile_sum[r];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
    o[j][0] *= correction[0], o[j][1] *= correction[0];
    o[j][2] *= correction[1], o[j][3] *= correction[1];
  }

  // O += P V. P's A fragment for keys 16kk .. 16kk+15 is s[2kk] and s[2kk+1], packed.
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    const uint32_t p[4] = {ptx::pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), ptx::pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                           ptx::pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                           ptx::pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      // V rows are B rows (keys = k). Transposed loads: lanes 0-7: keys 0-7 / d 0-7,
      // 8-15: keys 8-15 / d 0-7, 16-23: keys 0-7 / d 8-15, 24-31: keys 8-15 / d 8-15.
      uint32_t b[4];
      ptx::ldmatrix_x4_trans(b, v_tile + (kk * 16 + lane % 8 + (lane / 8) % 2 * 8) * S + dp * 16 + lane / 16 * 8);
      ptx::mma_bf16_16x8x16(o[2 * dp], p, b[0], b[1]);
      ptx::mma_bf16_16x8x16(o[2 * dp + 1], p, b[2], b[3]);
    }
  }
}

/// Merges another partial softmax state of the same rows into this thread's (exact:
/// m = max(m0, m1), l = l0 e^(m0-m) + l1 e^(m1-m), O = O0 e^(m0-m) + O1 e^(m1-m)).
/// Either side may have seen nothing yet (max -inf, sum 0, O 0); both sides at -inf
/// stay at -inf. `other_o(j, e)` returns the other state's o[j][e].
template <int D, typename OtherO>
__device__ __forceinline__ void merge_softmax_state(float (&o)[D / 8][4], float (&row_max)[2], float (&row_sum)[2],
                                                    const float (&other_max)[2], const float (&other_sum)[2],
                                                    OtherO other_o, float scale_log2) {
  float scale_own[2], scale_other[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float merged_max = fmaxf(row_max[r], other_max[r]);
    const bool none = merged_max == -INFINITY;
    scale_own[r] = none ? 0.0f : exp2f((row_max[r] - merged_max) * scale_log2);      // 0 if this side saw nothing
    scale_other[r] = none ? 0.0f : exp2f((other_max[r] - merged_max) * scale_log2);  // 0 if the other did
    row_sum[r] = row_sum[r] * scale_own[r] + other_sum[r] * scale_other[r];
    row_max[r] = merged_max;
  }
#pragma unroll
  for (int j = 0; j < D / 8; ++j) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[j][e] = o[j][e] * scale_own[e / 2] + other_o(j, e) * scale_other[e / 2];
  }
}

/// Writes the thread's two rows of O, normalized by the full softmax sums (the sum over
/// the 4 lanes that share a row), as bf16. Rows at or past Tq (padding) are skipped.
/// @param out_head (Tq, H, D) global, already offset to this head's first column
template <int D>
__device__ __forceinline__ void store_normalized_rows(__nv_bfloat16* out_head, size_t row_stride,
                                                      const float (&o)[D / 8][4], const float (&row_sum)[2],
                                                      int row_top, int row_bottom, int Tq, int lane) {
  const int col = 2 * (lane % 4);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float sum = row_sum[r];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const float inverse = 1.0f / sum;
    const int row = r == 0 ? row_top : row_bottom;
    if (row >= Tq) continue;  // padding rows of the last block
    __nv_bfloat16* out_row = out_head + size_t(row) * row_stride + col;
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
      *reinterpret_cast<uint32_t*>(out_row + 8 * j) =
          ptx::pack_bf16x2(o[j][2 * r] * inverse, o[j][2 * r + 1] * inverse);
    }
  }
}

}  // namespace bielik
