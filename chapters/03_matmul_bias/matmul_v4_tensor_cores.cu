// v4: bf16 tensor cores (mma.sync m16n8k16), ldmatrix, a 4-stage cp.async pipeline.
//
// What changed from v3:
//  1. Tensor cores. One `mma.sync.m16n8k16` instruction multiplies a 16x16 bf16 tile by
//     a 16x8 one into 16x8 fp32 accumulators: 4096 FLOPs per warp-instruction, where v3
//     needed 64 FMA instructions per thread for the same work. Inputs stay bf16 (no
//     conversion), accumulation is fp32, and the bias is added to the fp32 accumulators
//     in registers before the one rounding to bf16.
//  2. The layout is already right. The mma wants A (16x16) "row" = k contiguous within
//     each row of x, and B (16x8) "col" = k contiguous within each output column. y =
//     x W^T makes column n of B row n of W, and HuggingFace stores W row-major: k is
//     contiguous. Both operands are "K-major" exactly as they lie in memory, so nothing
//     is transposed anywhere (this is the "TN" GEMM every tensor core likes best).
//  3. ldmatrix: one instruction loads four 8x8 matrices from shared memory and hands
//     every lane precisely the elements the mma fragment wants. A tile row is 32 bf16
//     = 64 bytes, so 8 rows at one column would sit on only 4 of the 8 16-byte bank
//     groups (rows 0 and 2 collide): 2-way conflicts. The swizzle stores 16-byte chunk c
//     of row r at chunk c ^ ((r / 2) % 4), and then the 8 row addresses of every
//     ldmatrix phase fall on 8 different bank groups.
//  4. cp.async: global -> shared copies that do not pass through registers and do not
//     block the thread. Four stages: while the tensor cores chew on tile k, the copies
//     for tiles k+1..k+3 are in flight, hiding the ~1 us memory latency. Out-of-range
//     rows and C_in tails are zero-filled by the copy itself (src-size 0).
//  5. The tile shape is chosen per problem. A 2048 x 1536 output has 96 tiles of
//     128x256: 96 of the H200's 132 SMs work and 36 idle (73%). 64x128 tiles give 384
//     tiles, 3 per SM on 120 SMs and 2 on 12 (97% balanced) at a lower efficiency per
//     warp. matmul_v4_pick_tile estimates both effects (bench_matmul shows each tile).
//
// Edges and odd sizes: rows beyond T or C_out and k beyond C_in are zero-filled, so
// they contribute nothing; outputs outside y are not stored. When C_in % 8 != 0 (rows
// not 16-byte aligned) or a pointer is misaligned, cp.async of 16 bytes is impossible:
// the same kernel then fills shared memory element by element with ordinary loads
// (Vector = false; slower, still tensor cores) and stores outputs one at a time.
#include "cuda_check.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"
#include "matmul_ptx.cuh"

namespace bielik {

namespace {

constexpr int kV4K = 32;       // k slice per stage: 32 bf16 = 64 bytes = 4 chunks per row
constexpr int kV4Stages = 4;   // tiles in flight

/// Element offset of 16-byte chunk `chunk` (0..3) of row `row` in a (rows, 32) tile.
__device__ __forceinline__ int v4_swizzle(int row, int chunk) {
  return row * kV4K + ((chunk ^ ((row >> 1) & 3)) << 3);
}

/// Copies rows row0 .. row0+ROWS-1, columns k0 .. k0+31 of a (rows, K) matrix into a
/// swizzled shared tile, zeros outside the matrix.
template <int ROWS, int THREADS, bool Vector>
__device__ __forceinline__ void v4_load_tile(__nv_bfloat16* tile, const __nv_bfloat16* matrix, int row0, int rows,
                                             int k0, int K, int tid) {
  static_assert((ROWS * 4) % THREADS == 0, "every thread copies the same number of chunks");
#pragma unroll
  for (int i = 0; i < ROWS * 4 / THREADS; ++i) {
    int id = tid + i * THREADS;
    int r = id >> 2, c = id & 3;
    int row = row0 + r, k = k0 + c * 8;
    __nv_bfloat16* dst = tile + v4_swizzle(r, c);
    if constexpr (Vector) {  // K % 8 == 0: a chunk is entirely inside C_in or entirely outside
      bool valid = row < rows && k < K;
      ptx::cp_async_16(ptx::smem_address(dst), valid ? matrix + size_t(row) * K + k : matrix, valid);
    } else {
      uint32_t packed[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        unsigned short lo = 0, hi = 0;
        if (row < rows && k + 2 * j < K) lo = __bfloat16_as_ushort(matrix[size_t(row) * K + k + 2 * j]);
        if (row < rows && k + 2 * j + 1 < K) hi = __bfloat16_as_ushort(matrix[size_t(row) * K + k + 2 * j + 1]);
        packed[j] = uint32_t(lo) | (uint32_t(hi) << 16);
      }
      *reinterpret_cast<uint4*>(dst) = make_uint4(packed[0], packed[1], packed[2], packed[3]);
    }
  }
}

}  // namespace

/// One block computes a BM x BN tile of y with WarpsM x WarpsN warps; each warp owns a
/// (BM/WarpsM) x (BN/WarpsN) sub-tile = MmaM x MmaN mma tiles of 16x8.
template <int BM, int BN, int WarpsM, int WarpsN, bool HasBias, bool Vector>
__global__ void __launch_bounds__(32 * WarpsM * WarpsN, (WarpsM * WarpsN == 8) ? 1 : 2)
    matmul_v4_tensor_cores_kernel(__nv_bfloat16* y,           // (M, N)
                                  const __nv_bfloat16* x,     // (M, K)
                                  const __nv_bfloat16* W,     // (N, K)
                                  const __nv_bfloat16* bias,  // (N), unused when !HasBias
                                  int M, int N, int K) {
  constexpr int kThreads = 32 * WarpsM * WarpsN;
  constexpr int kWarpRows = BM / WarpsM, kWarpCols = BN / WarpsN;
  constexpr int kMmaM = kWarpRows / 16, kMmaN = kWarpCols / 8;
  constexpr int kStageElements = (BM + BN) * kV4K;
  static_assert(kMmaN % 2 == 0, "B fragments are loaded two 8-column tiles at a time");

  extern __shared__ __align__(128) __nv_bfloat16 smem[];  // kV4Stages x [x tile (BM, 32) | W tile (BN, 32)]
  int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  int warp_row0 = (warp / WarpsN) * kWarpRows, warp_col0 = (warp % WarpsN) * kWarpCols;
  int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;  // x walks M first: blocks sharing a W tile run together
  int k_tiles = (K + kV4K - 1) / kV4K;

  auto load_stage = [&](int kt) {
    __nv_bfloat16* stage = smem + (kt % kV4Stages) * kStageElements;
    v4_load_tile<BM, kThreads, Vector>(stage, x, m0, M, kt * kV4K, K, tid);
    v4_load_tile<BN, kThreads, Vector>(stage + BM * kV4K, W, n0, N, kt * kV4K, K, tid);
  };

  // Prologue: tiles 0 .. Stages-2 in flight. One commit per tile, even an empty one,
  // so "group kt" always means "tile kt" in the waits below.
  for (int s = 0; s < kV4Stages - 1; ++s) {
    if (s < k_tiles) load_stage(s);
    ptx::cp_async_commit();
  }

  float acc[kMmaM][kMmaN][4] = {};
  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<kV4Stages - 2>();  // this thread's copies of tile kt have landed...
    __syncthreads();                      // ...and everyone's; and stage kt-1 is free again
    if (kt + kV4Stages - 1 < k_tiles) load_stage(kt + kV4Stages - 1);  // into stage (kt-1)
    ptx::cp_async_commit();

    const __nv_bfloat16* xs = smem + (kt % kV4Stages) * kStageElements;
    const __nv_bfloat16* ws = xs + BM * kV4K;
#pragma unroll
    for (int ks = 0; ks < kV4K / 16; ++ks) {  // two k-steps of 16 per stage
      uint32_t a[kMmaM][4], b[kMmaN][2];
#pragma unroll
      for (int mt = 0; mt < kMmaM; ++mt) {
        // Matrices 0..3 = (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
        // (rows 8-15, k 8-15): lane l points at row l % 16, chunk 2*ks + l / 16.
        int row = warp_row0 + mt * 16 + (lane & 15);
        ptx::ldmatrix_x4(a[mt], ptx::smem_address(xs + v4_swizzle(row, ks * 2 + (lane >> 4))));
      }
#pragma unroll
      for (int pair = 0; pair < kMmaN / 2; ++pair) {
        // Two 8-column tiles: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7),
        // (n 8-15, k 8-15) -> b0, b1 of tile 2*pair, then of tile 2*pair + 1.
        int row = warp_col0 + pair * 16 + (lane & 7) + ((lane >> 4) << 3);
        uint32_t r[4];
        ptx::ldmatrix_x4(r, ptx::smem_address(ws + v4_swizzle(row, ks * 2 + ((lane >> 3) & 1))));
        b[2 * pair][0] = r[0];
        b[2 * pair][1] = r[1];
        b[2 * pair + 1][0] = r[2];
        b[2 * pair + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMmaM; ++mt)
#pragma unroll
        for (int nt = 0; nt < kMmaN; ++nt) ptx::mma_bf16_16x8x16(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
    }
  }

  // Epilogue: accumulator (mt, nt) holds rows g and g + 8, columns 2c and 2c + 1 of
  // its 16x8 tile (g = lane / 4, c = lane % 4).
  int g = lane >> 2, c2 = (lane & 3) * 2;
#pragma unroll
  for (int nt = 0; nt < kMmaN; ++nt) {
    int col = n0 + warp_col0 + nt * 8 + c2;
    float2 b = load_bias_pair<HasBias, Vector>(bias, N, col);  // once per column pair
#pragma unroll
    for (int mt = 0; mt < kMmaM; ++mt) {
      int row = m0 + warp_row0 + mt * 16 + g;
      store_output_pair<HasBias, Vector>(y, b, M, N, row, col, acc[mt][nt][0], acc[mt][nt][1]);
      store_output_pair<HasBias, Vector>(y, b, M, N, row + 8, col, acc[mt][nt][2], acc[mt][nt][3]);
    }
  }
}

namespace {

template <int BM, int BN, int WarpsM, int WarpsN, bool HasBias, bool Vector>
void v4_launch_instance(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias,
                        int M, int N, int K, cudaStream_t stream) {
  auto kernel = matmul_v4_tensor_cores_kernel<BM, BN, WarpsM, WarpsN, HasBias, Vector>;
  constexpr int kSmemBytes = kV4Stages * (BM + BN) * kV4K * int(sizeof(__nv_bfloat16));
  // More than 48 KB of dynamic shared memory must be asked for, once per kernel.
  static const bool configured = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
    return true;
  }();
  (void)configured;
  dim3 grid((M + BM - 1) / BM, (N + BN - 1) / BN);
  kernel<<<grid, 32 * WarpsM * WarpsN, kSmemBytes, stream>>>(y, x, W, bias, M, N, K);
  CUDA_CHECK_LAUNCH();
}

template <int BM, int BN, int WarpsM, int WarpsN>
void v4_launch(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, int M,
               int N, int K, cudaStream_t stream) {
  bool vector = matmul_vector_path_ok(y, x, W, bias, K, N);
  with_bias_flag(bias, [&](auto has_bias) {
    constexpr bool kHasBias = decltype(has_bias)::value;
    if (vector) {
      v4_launch_instance<BM, BN, WarpsM, WarpsN, kHasBias, true>(y, x, W, bias, M, N, K, stream);
    } else {
      v4_launch_instance<BM, BN, WarpsM, WarpsN, kHasBias, false>(y, x, W, bias, M, N, K, stream);
    }
  });
}

struct V4Tile {
  const char* name;
  int rows, cols;     // BM x BN
  double efficiency;  // relative throughput of one SM full of these tiles (warp tile size)
  void (*launch)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, int,
                 cudaStream_t);
};

// Efficiencies measured on the H200 (bench_matmul's tile table at T = 2048: outputs of
// the busiest SM per microsecond, relative to the best tile). Bigger warp tiles reuse
// each ldmatrix'd fragment for more mma (64x64 per warp: 4 + 4 ldmatrix.x4 per 32 mma;
// 32x32: 2 + 2 per 8), but 128x256 with 8 warps of 236 registers leaves one block per
// SM and no second block to hide its barriers: 128x128 at two blocks per SM wins.
constexpr V4Tile kV4Tiles[] = {
    {"128x256 (8 warps of 64x64)", 128, 256, 0.88, v4_launch<128, 256, 2, 4>},
    {"128x128 (4 warps of 64x64)", 128, 128, 1.00, v4_launch<128, 128, 2, 2>},
    {"64x128 (4 warps of 32x64)", 64, 128, 0.87, v4_launch<64, 128, 2, 2>},
    {"64x64 (4 warps of 32x32)", 64, 64, 0.75, v4_launch<64, 64, 2, 2>},
};
constexpr int kV4TileCount = int(sizeof(kV4Tiles) / sizeof(kV4Tiles[0]));

}  // namespace

int matmul_v4_tile_count() { return kV4TileCount; }
const char* matmul_v4_tile_name(int tile) { return kV4Tiles[tile].name; }

int matmul_v4_pick_tile(int T, int C_out) { return pick_tile_shape(kV4Tiles, T, C_out); }

void matmul_v4_tensor_cores_tile(int tile, __nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                                 const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("matmul_v4_tensor_cores_tile", T, C_in, C_out);
  matmul_check_tile("matmul_v4_tensor_cores_tile", tile, kV4TileCount);
  if (T == 0 || C_out == 0) return;
  kV4Tiles[tile].launch(y, x, W, bias, T, C_out, C_in, stream);
}

void matmul_v4_tensor_cores(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                            const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("matmul_v4_tensor_cores", T, C_in, C_out);  // before the tile pick asks the GPU
  if (T == 0 || C_out == 0) return;
  matmul_v4_tensor_cores_tile(matmul_v4_pick_tile(T, C_out), y, x, W, bias, T, C_in, C_out, stream);
}

}  // namespace bielik
