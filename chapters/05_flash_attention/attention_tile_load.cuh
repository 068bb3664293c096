/// @file attention_tile_load.cuh
/// @brief Copying a tile of token rows of one head into shared memory (v3, v4).
#pragma once

#include <cuda_bf16.h>

#include <cstddef>

#include "attention_ptx.cuh"

namespace bielik {

/// Shared-memory row stride in bf16: D plus 8 (16 bytes) of padding. Rows 2D + 16 bytes
/// apart shift by one 16-byte bank group per row, so the 8 rows one ldmatrix reads land
/// in 8 different bank groups: no bank conflicts, no swizzle needed.
template <int D>
constexpr int kTileStride = D + 8;

/// Issues cp.async for rows [row0, row0 + Rows) of one head into a (Rows, D + 8) tile,
/// 16 bytes per copy, spread over `Threads` threads numbered by `thread` (0..Threads-1:
/// the whole block, or one warp group of it). Rows at or past
/// row_end are zero-filled: a zero V row times a zero probability must give 0, and
/// stale shared memory (possibly NaN bits) would not.
template <int D, int Rows, int Threads>
__device__ __forceinline__ void load_tile_async(__nv_bfloat16* tile,        // (Rows, D + 8) shared
                                                const __nv_bfloat16* head,  // row 0 of this head, global
                                                size_t row_stride, int row0, int row_end, int thread) {
  constexpr int kChunksPerRow = D / 8;  // 16-byte chunks
  static_assert(Rows * kChunksPerRow % Threads == 0, "tile must split evenly over the threads");
#pragma unroll
  for (int it = 0; it < Rows * kChunksPerRow / Threads; ++it) {
    const int chunk = it * Threads + thread;
    const int r = chunk / kChunksPerRow, col = (chunk % kChunksPerRow) * 8;
    const int row = row0 + r;
    const bool valid = row < row_end;
    ptx::cp_async_16(tile + r * kTileStride<D> + col, head + size_t(valid ? row : 0) * row_stride + col, valid);
  }
}

}  // namespace bielik
