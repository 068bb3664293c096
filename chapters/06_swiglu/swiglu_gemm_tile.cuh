/// @file swiglu_gemm_tile.cuh
/// @brief The tensor-core main loop of v2 and v3: x times one weight (v2: Wu) or two
/// weights at once (v3: Wg and Wu, sharing every x tile), into fp32 accumulators.
///
/// It is chapter 03's v4 loop (matmul_v4_tensor_cores.cu: read that file's header for
/// the why of each piece) generalized to NumB weight matrices: bf16 mma.sync m16n8k16
/// with fp32 accumulators, ldmatrix from a swizzled shared tile, a 4-stage cp.async
/// pipeline with k slices of 32. The PTX wrappers (cp.async, ldmatrix, mma) come from
/// chapter 03's matmul_ptx.cuh. The tile loader is written again here because chapter
/// 03's is private to its .cu file (README.md: it belongs in matmul_common.cuh).
///
/// With NumB = 2 a stage holds [x tile (BM, 32) | Wg tile (BN, 32) | Wu tile (BN, 32)],
/// and every warp keeps acc[0] (gate) and acc[1] (up) for the same (row, column)
/// positions: the epilogue finds g and u of one output in the same thread, the same
/// registers' slots, with no shuffle and no trip through memory.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "matmul_ptx.cuh"

namespace bielik::swiglu_gemm {

constexpr int kK = 32;       // k slice per stage: 32 bf16 = 64 bytes = 4 chunks per row
constexpr int kStages = 4;   // slices in flight

/// A block computes BM rows (tokens) x BN columns (features j) of the output for each
/// of NumB weights, with WarpsM x WarpsN warps; a warp owns (BM/WarpsM) x (BN/WarpsN)
/// of each, i.e. MmaM x MmaN mma tiles of 16x8 per weight.
template <int BM_, int BN_, int WarpsM_, int WarpsN_, int NumB_>
struct Tile {
  static constexpr int BM = BM_, BN = BN_, WarpsM = WarpsM_, WarpsN = WarpsN_, NumB = NumB_;
  static constexpr int kThreads = 32 * WarpsM * WarpsN;
  static constexpr int kWarpRows = BM / WarpsM, kWarpCols = BN / WarpsN;
  static constexpr int kMmaM = kWarpRows / 16, kMmaN = kWarpCols / 8;
  static constexpr int kStageElements = (BM + NumB * BN) * kK;
  static constexpr int kSmemBytes = kStages * kStageElements * int(sizeof(__nv_bfloat16));
  static_assert(kWarpRows % 16 == 0 && kWarpCols % 16 == 0, "warp tile: 16-row mma tiles, 8-column pairs");
  static_assert(kMmaN % 2 == 0, "B fragments are loaded two 8-column tiles at a time");
  static_assert((BM * 4) % kThreads == 0 && (BN * 4) % kThreads == 0, "every thread copies whole chunks");
};

/// Element offset of 16-byte chunk `chunk` (0..3) of row `row` in a (rows, 32) tile.
/// Chunk c of row r is stored at chunk c ^ ((r / 2) % 4): the 8 rows one ldmatrix phase
/// reads at one logical chunk then land in 8 different 16-byte bank groups.
__device__ __forceinline__ int swizzle(int row, int chunk) { return row * kK + ((chunk ^ ((row >> 1) & 3)) << 3); }

/// Copies rows row0 .. row0+ROWS-1, columns k0 .. k0+31 of a (rows, K) matrix into a
/// swizzled shared tile, zeros outside the matrix (rows past the end, k past K).
/// Vector: K % 8 == 0 and a 16-byte-aligned matrix, so a 16-byte chunk lies entirely
/// inside or entirely outside a row; cp.async with src-size 0 writes the zeros.
/// Otherwise element by element with ordinary loads (slower, same result).
template <int ROWS, int THREADS, bool Vector>
__device__ __forceinline__ void load_tile(__nv_bfloat16* tile, const __nv_bfloat16* matrix, int row0, int rows,
                                          int k0, int K, int tid) {
#pragma unroll
  for (int i = 0; i < ROWS * 4 / THREADS; ++i) {
    int id = tid + i * THREADS;
    int r = id >> 2, c = id & 3;
    int row = row0 + r, k = k0 + c * 8;
    __nv_bfloat16* dst = tile + swizzle(r, c);
    if constexpr (Vector) {
      bool valid = row < rows && k < K;
      ptx::cp_async_16(ptx::smem_address(dst), valid ? matrix + size_t(row) * K + k : matrix, valid);
    } else {
      uint32_t packed[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t lo = 0, hi = 0;
        if (row < rows && k + 2 * j < K) lo = __bfloat16_as_ushort(matrix[size_t(row) * K + k + 2 * j]);
        if (row < rows && k + 2 * j + 1 < K) hi = __bfloat16_as_ushort(matrix[size_t(row) * K + k + 2 * j + 1]);
        packed[j] = lo | (hi << 16);
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
}

/// acc[b] += x[m0 : m0+BM, :] * W_b[n0 : n0+BN, :]^T over all of K, for b < NumB
/// (W_0 = Wa, W_1 = Wb). `smem` is the block's dynamic shared memory, Tile::kSmemBytes.
/// Accumulator (b, mt, nt) of a warp holds, per lane (g = lane / 4, c = lane % 4),
/// rows warp_row0 + mt*16 + g (+8 for entries 2, 3), columns warp_col0 + nt*8 + 2c (+1).
template <class Tile, bool Vector>
__device__ __forceinline__ void mainloop(float (&acc)[Tile::NumB][Tile::kMmaM][Tile::kMmaN][4],
                                         __nv_bfloat16* smem,
                                         const __nv_bfloat16* x,   // (M, K)
                                         const __nv_bfloat16* Wa,  // (N, K)
                                         const __nv_bfloat16* Wb,  // (N, K), unused when NumB == 1
                                         int M, int N, int K, int m0, int n0) {
  constexpr int BM = Tile::BM, BN = Tile::BN, kThreads = Tile::kThreads;
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int warp_row0 = (warp / Tile::WarpsN) * Tile::kWarpRows, warp_col0 = (warp % Tile::WarpsN) * Tile::kWarpCols;
  int k_tiles = (K + kK - 1) / kK;

  auto load_stage = [&](int kt) {
    __nv_bfloat16* stage = smem + (kt % kStages) * Tile::kStageElements;
    load_tile<BM, kThreads, Vector>(stage, x, m0, M, kt * kK, K, tid);
    load_tile<BN, kThreads, Vector>(stage + BM * kK, Wa, n0, N, kt * kK, K, tid);
    if constexpr (Tile::NumB == 2) load_tile<BN, kThreads, Vector>(stage + (BM + BN) * kK, Wb, n0, N, kt * kK, K, tid);
  };

  // Prologue: slices 0 .. kStages-2 in flight; one commit per slice, even an empty one,
  // so "group kt" always means "slice kt" in the waits below.
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < k_tiles) load_stage(s);
    ptx::cp_async_commit();
  }

#pragma unroll
  for (int b = 0; b < Tile::NumB; ++b)
#pragma unroll
    for (int mt = 0; mt < Tile::kMmaM; ++mt)
#pragma unroll
      for (int nt = 0; nt < Tile::kMmaN; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[b][mt][nt][i] = 0.0f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<kStages - 2>();  // this thread's copies of slice kt have landed...
    __syncthreads();                    // ...and everyone's; and stage kt-1 is free again
    if (kt + kStages - 1 < k_tiles) load_stage(kt + kStages - 1);  // into stage (kt-1)'s slot
    ptx::cp_async_commit();

    const __nv_bfloat16* xs = smem + (kt % kStages) * Tile::kStageElements;
#pragma unroll
    for (int ks = 0; ks < kK / 16; ++ks) {  // two k-steps of 16 per slice
      uint32_t a[Tile::kMmaM][4], bf[Tile::NumB][Tile::kMmaN][2];
#pragma unroll
      for (int mt = 0; mt < Tile::kMmaM; ++mt) {
        // Matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
        // (rows 8-15, k 8-15) = a0..a3: lane l points at row l % 16, chunk 2ks + l / 16.
        int row = warp_row0 + mt * 16 + (lane & 15);
        ptx::ldmatrix_x4(a[mt], ptx::smem_address(xs + swizzle(row, ks * 2 + (lane >> 4))));
      }
#pragma unroll
      for (int b = 0; b < Tile::NumB; ++b) {
        const __nv_bfloat16* ws = xs + (BM + b * BN) * kK;
#pragma unroll
        for (int pair = 0; pair < Tile::kMmaN / 2; ++pair) {
          // Matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15):
          // b0, b1 of 8-column tile 2*pair, then of tile 2*pair + 1.
          int row = warp_col0 + pair * 16 + (lane & 7) + ((lane >> 4) << 3);
          uint32_t r[4];
          ptx::ldmatrix_x4(r, ptx::smem_address(ws + swizzle(row, ks * 2 + ((lane >> 3) & 1))));
          bf[b][2 * pair][0] = r[0];
          bf[b][2 * pair][1] = r[1];
          bf[b][2 * pair + 1][0] = r[2];
          bf[b][2 * pair + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int b = 0; b < Tile::NumB; ++b)
#pragma unroll
        for (int mt = 0; mt < Tile::kMmaM; ++mt)
#pragma unroll
          for (int nt = 0; nt < Tile::kMmaN; ++nt)
            ptx::mma_bf16_16x8x16(acc[b][mt][nt], a[mt], bf[b][nt][0], bf[b][nt][1]);
    }
  }
}

/// The warp's first row and column inside the block tile (same formula as mainloop).
template <class Tile>
__device__ __forceinline__ int2 warp_origin() {
  int warp = threadIdx.x >> 5;
  return make_int2((warp / Tile::WarpsN) * Tile::kWarpRows, (warp % Tile::WarpsN) * Tile::kWarpCols);
}

}  // namespace bielik::swiglu_gemm
