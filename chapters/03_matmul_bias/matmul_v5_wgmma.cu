// v5: Hopper warpgroup MMA (wgmma, sm_90a), operands straight from shared memory.
//
// What changed from v4: on Hopper, mma.sync is the old path. Each warp must first copy
// its operands from shared memory into registers (ldmatrix), and one instruction covers
// only 16x8x16. `wgmma.mma_async` is issued by a warpgroup (4 warps) for a 64 x N x 16
// tile with N up to 256, reads A and B directly from shared memory through descriptors,
// and runs asynchronously: the warps issue 4 of them (a 64-wide k slice), then go on
// to issue the copies of later tiles while the tensor cores work. No ldmatrix, no
// operand registers, 16x more work per instruction.
//
// The price is a strict shared-memory layout: the tensor cores read the tile in the
// "128-byte swizzle" format, rows of 64 bf16 (128 bytes), 16-byte chunk c of row r
// stored at chunk c ^ (r % 8), tiles 1024-byte aligned. It is the same XOR trick as
// v4's (8 rows of one column land on 8 different bank groups), now fixed by hardware;
// the cp.async copies write exactly that layout.
//
// Block: 2 warpgroups (256 threads), a 128 x BN tile of y (BN = 64, 128, 192, 224 or 256; or
// one warpgroup and 64 x 128 or 64 x 64 for small grids), chosen like v4's tile from the problem's
// shape (128x192 wins on every large Bielik shape); warpgroup w owns rows 64w..64w+63. Each
// k-tile of 64: wait for its copies, one barrier, 4 wgmma (k = 0, 16, 32, 48: the
// descriptor's start moves 32 bytes), commit, then wait until only this tile's group is
// unfinished, i.e. the previous tile's MMAs are done, and refill the stage of the tile
// before that. The copies run Stages - 2 tiles ahead of the MMAs.
//
// The grid's x walks M first: the 16 blocks that share one W tile (at T = 2048) run
// side by side, so every W tile comes from HBM once and x stays in L2. (With N first, a
// wave of 132 blocks would sweep the whole 98 MB lm_head weight once per row of tiles.)
//
// Requirements: sm_90a (this file is compiled for it alone), C_in % 8 == 0 and 16-byte
// aligned pointers for the 16-byte copies; anything else is handed to v4. Edges: rows
// beyond T or C_out and k beyond C_in are zero-filled by the copies.
#include "cuda_check.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"
#include "matmul_ptx.cuh"
#include "wgmma_ptx.cuh"
#include "wgmma_tiles.cuh"

namespace bielik {

namespace {

constexpr int kV5K = 64;  // k per stage: 64 bf16 = 128 bytes, one swizzle row

template <int BN, int WarpGroups, int Stages>
constexpr int v5_smem_bytes() {
  return Stages * (64 * WarpGroups + BN) * 128 + 1024;  // + slack to align the first tile to 1024
}

}  // namespace

template <int BN, int WarpGroups, int Stages, bool HasBias>
__global__ void __launch_bounds__(128 * WarpGroups, 1)
    matmul_v5_wgmma_kernel(__nv_bfloat16* y,           // (M, N)
                           const __nv_bfloat16* x,     // (M, K)
                           const __nv_bfloat16* W,     // (N, K)
                           const __nv_bfloat16* bias,  // (N), unused when !HasBias
                           int M, int N, int K) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __trap();  // wgmma exists only on sm_90a; the launcher never runs this elsewhere
#else
  constexpr int BM = 64 * WarpGroups, kThreads = 128 * WarpGroups;
  constexpr int kTileABytes = BM * 128, kStageBytes = (BM + BN) * 128;
  static_assert(Stages >= 3, "copies run Stages - 2 tiles ahead");

  extern __shared__ uint8_t smem_raw[];
  uint32_t smem = (ptx::smem_address(smem_raw) + 1023) & ~1023u;
  int tid = threadIdx.x, warpgroup = tid / 128;
  int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
  int k_tiles = (K + kV5K - 1) / kV5K;

  auto load_stage = [&](int kt) {
    uint32_t stage = smem + (kt % Stages) * kStageBytes;
    wgmma::load_swizzled_tile<BM, kThreads>(stage, x, m0, M, kt * kV5K, K, tid);
    wgmma::load_swizzled_tile<BN, kThreads>(stage + kTileABytes, W, n0, N, kt * kV5K, K, tid);
  };
  for (int s = 0; s < Stages - 2; ++s) {  // one commit per tile, even empty: group kt = tile kt
    if (s < k_tiles) load_stage(s);
    ptx::cp_async_commit();
  }

  float acc[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.0f;

  for (int kt = 0; kt < k_tiles; ++kt) {
    ptx::cp_async_wait<Stages - 3>();  // this thread's copies of tile kt have landed
    wgmma::fence_proxy_async();        // make them visible to the tensor cores' reads
    __syncthreads();                   // everyone's copies; and tile kt-2's MMAs are done

    uint32_t stage = smem + (kt % Stages) * kStageBytes;
    uint64_t a = wgmma::smem_descriptor(stage + warpgroup * 64 * 128);
    uint64_t b = wgmma::smem_descriptor(stage + kTileABytes);
    wgmma::fence_operands(acc);
    wgmma::fence();
#pragma unroll
    for (int ks = 0; ks < kV5K / 16; ++ks) wgmma::mma_async<BN>(acc, a + 2 * ks, b + 2 * ks);
    wgmma::commit_group();
    wgmma::wait_group<1>();  // tile kt-1's MMAs are finished (tile kt's may still run)
    wgmma::fence_operands(acc);

    if (kt + Stages - 2 < k_tiles) load_stage(kt + Stages - 2);  // the stage tile kt-2 used
    ptx::cp_async_commit();
  }
  wgmma::wait_group<0>();
  wgmma::fence_operands(acc);

  // Epilogue: warp w of the warpgroup holds rows 16w + g and 16w + g + 8 of its 64-row
  // slice; accumulator 4j + {0,1} / {2,3} are columns 8j + 2c + {0,1} of those rows.
  int lane = tid & 31, warp_in_group = (tid % 128) / 32;
  int row = m0 + warpgroup * 64 + warp_in_group * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j) {
    int col = n0 + j * 8 + (lane & 3) * 2;
    float2 b = load_bias_pair<HasBias, true>(bias, N, col);
    store_output_pair<HasBias, true>(y, b, M, N, row, col, acc[4 * j], acc[4 * j + 1]);
    store_output_pair<HasBias, true>(y, b, M, N, row + 8, col, acc[4 * j + 2], acc[4 * j + 3]);
  }
#endif
}

namespace {

template <int BN, int WarpGroups, int Stages>
void v5_launch(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, int M,
               int N, int K, cudaStream_t stream) {
  constexpr int BM = 64 * WarpGroups, kSmemBytes = v5_smem_bytes<BN, WarpGroups, Stages>();
  dim3 grid((M + BM - 1) / BM, (N + BN - 1) / BN);
  with_bias_flag(bias, [&](auto has_bias) {
    auto kernel = matmul_v5_wgmma_kernel<BN, WarpGroups, Stages, decltype(has_bias)::value>;
    static const bool configured = [&] {
      CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
      return true;
    }();
    (void)configured;
    kernel<<<grid, 128 * WarpGroups, kSmemBytes, stream>>>(y, x, W, bias, M, N, K);
  });
  CUDA_CHECK_LAUNCH();
}

struct V5Tile {
  const char* name;
  int rows, cols;
  double efficiency;  // relative throughput measured on the H200, as in v4
  void (*launch)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, int,
                 cudaStream_t);
};

constexpr V5Tile kV5Tiles[] = {
    {"128x256 (2 warpgroups, 4 stages)", 128, 256, 0.91, v5_launch<256, 2, 4>},  // 192 KB of stages
    {"128x192 (2 warpgroups, 5 stages)", 128, 192, 1.00, v5_launch<192, 2, 5>},  // 200 KB
    {"128x224 (2 warpgroups, 5 stages)", 128, 224, 0.98, v5_launch<224, 2, 5>},  // 221 KB: gate/up's 8960 = 40 x 224
    {"128x128 (2 warpgroups, 5 stages)", 128, 128, 0.88, v5_launch<128, 2, 5>},  // 160 KB
    {"64x128 (1 warpgroup, 4 stages)", 64, 128, 0.40, v5_launch<128, 1, 4>},     // 96 KB: 2 blocks per SM
    // Narrow tiles for narrow outputs (k/v: C_out = 256, 32 blocks of 128 x 128 at
    // T = 2048 leave 100 SMs idle): 128 blocks of 64 x 64.
    {"128x64 (2 warpgroups, 6 stages)", 128, 64, 0.30, v5_launch<64, 2, 6>},     // 145 KB
    {"64x64 (1 warpgroup, 6 stages)", 64, 64, 0.25, v5_launch<64, 1, 6>},        // 97 KB: 2 blocks per SM
};
constexpr int kV5TileCount = int(sizeof(kV5Tiles) / sizeof(kV5Tiles[0]));

}  // namespace

int matmul_v5_tile_count() { return kV5TileCount; }
const char* matmul_v5_tile_name(int tile) { return kV5Tiles[tile].name; }

int matmul_v5_pick_tile(int T, int C_out) { return pick_tile_shape(kV5Tiles, T, C_out); }

bool matmul_v5_available() {
  static const bool available = sm90a_kernel_runs(matmul_v5_wgmma_kernel<128, 1, 4, false>);
  return available;
}

void matmul_v5_wgmma_tile(int tile, __nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                          const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("matmul_v5_wgmma_tile", T, C_in, C_out);
  matmul_check_tile("matmul_v5_wgmma_tile", tile, kV5TileCount);
  if (T == 0 || C_out == 0) return;
  if (!matmul_vector_path_ok(y, x, W, bias, C_in, C_out)) {  // no 16-byte copies possible
    matmul_v4_tensor_cores(y, x, W, bias, T, C_in, C_out, stream);
    return;
  }
  kV5Tiles[tile].launch(y, x, W, bias, T, C_out, C_in, stream);
}

void matmul_v5_wgmma(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias,
                     int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("matmul_v5_wgmma", T, C_in, C_out);  // before the tile pick asks the GPU
  matmul_v5_wgmma_tile(matmul_v5_pick_tile(T, C_out), y, x, W, bias, T, C_in, C_out, stream);
}

}  // namespace bielik
