/// @file wgmma_tiles.cuh
/// @brief Filling the shared-memory tiles that wgmma reads (v5, v6) with cp.async.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "matmul_ptx.cuh"

namespace bielik::wgmma {

/// Copies rows row0 .. row0+ROWS-1, columns k0 .. k0+63 of a (rows, K) matrix into the
/// 128-byte-swizzled tile at shared address `tile` (the layout smem_descriptor describes:
/// 16-byte chunk c of row r at chunk c ^ (r % 8)), zeros outside the matrix. Every one of
/// the THREADS threads issues the same number of 16-byte cp.async copies.
template <int ROWS, int THREADS>
__device__ __forceinline__ void load_swizzled_tile(uint32_t tile, const __nv_bfloat16* matrix, int row0, int rows,
                                                   int k0, int K, int tid) {
  static_assert((ROWS * 8) % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int i = 0; i < ROWS * 8 / THREADS; ++i) {
    int id = tid + i * THREADS;
    int r = id >> 3, c = id & 7;
    int row = row0 + r, k = k0 + c * 8;
    bool valid = row < rows && k < K;
    ptx::cp_async_16(tile + r * 128 + ((c ^ (r & 7)) << 4), valid ? matrix + size_t(row) * K + k : matrix, valid);
  }
}

}  // namespace bielik::wgmma
