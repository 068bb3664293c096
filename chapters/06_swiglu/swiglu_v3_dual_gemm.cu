// v3: gate and up in one tensor-core GEMM; h = silu(g + bg) * (u + bu) in its epilogue.
//
// What changed from v2:
//  1. One pass over x. v2 runs two GEMMs (gate, then up), so every x tile is fetched
//     from L2 into shared memory twice and two kernels pay their ramp-up and tail. Here
//     a block loads one x tile per k slice together with the tiles of BOTH weights at the
//     same rows j: each x fragment (ldmatrix) feeds twice as many mma instructions.
//  2. No intermediate at all. v2 still wrote g to global memory (T * F * 2 bytes) and
//     read it back in the up GEMM's epilogue; v1 wrote and re-read g and u. Here the
//     block holds g and u for the same outputs in two sets of fp32 accumulators, in
//     the same thread and the same register slots (acc[0][mt][nt][i] and
//     acc[1][mt][nt][i] are one output position), so the epilogue is pure arithmetic:
//     add the biases, silu, multiply, round once, store h. The only (T, F) tensor that
//     ever reaches global memory is h.
//  3. The tile shapes account for the doubled accumulators: a warp tile of 64x32 per
//     weight is 64x64 outputs' worth of accumulators (128 fp32 registers per thread),
//     as many as chapter 03's biggest warp tile, and each x fragment is reused for 2 x 4
//     mma per k step, as there. (Measured, the 32x32-per-weight warp tile wins: below.)
//
// Why not interleave Wg and Wu rows in memory at load time (one ordinary GEMM over
// (2F, C) with the epilogue pairing columns)? That needs a second copy of the weights
// or a model loader that rewrites them; two tiles side by side in shared memory give
// the same pairing with the checkpoint's layout untouched. (Chapter 08's loader does
// rewrite them, Wg's rows then Wu's as one (2F, C) matrix, but for a different
// reason: its prefill runs one cuBLASLt GEMM over it and a separate SwiGLU kernel,
// since cuBLASLt's speed beat this kernel's fusion, and its decode GEMV reads the
// gate and up rows of one feature from that matrix.)
//
// Odd sizes are handled as in chapter 03: out-of-range rows and k are zero-filled, so
// they add nothing; outputs outside h are not stored; C % 8 != 0 or misaligned x/Wg/Wu
// take the element-by-element tile loads (Vector = false); odd F or misaligned h/bg/bu
// store one value at a time (Paired = false).
#include "cuda_check.cuh"
#include "matmul_common.cuh"
#include "swiglu.cuh"
#include "swiglu_device.cuh"
#include "swiglu_gemm_tile.cuh"

namespace bielik {

template <class Tile, bool HasBias, bool Vector, bool Paired>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kThreads == 256 ? 1 : 2)
    swiglu_v3_dual_gemm_kernel(__nv_bfloat16* h,          // (M, N) = (T, F)
                               const __nv_bfloat16* x,    // (M, K) = (T, C)
                               const __nv_bfloat16* Wg,   // (N, K)
                               const __nv_bfloat16* bg,   // (N), unused when !HasBias
                               const __nv_bfloat16* Wu,   // (N, K)
                               const __nv_bfloat16* bu,   // (N), unused when !HasBias
                               int M, int N, int K) {
  extern __shared__ __align__(128) __nv_bfloat16 smem[];
  int m0 = blockIdx.x * Tile::BM, n0 = blockIdx.y * Tile::BN;  // M first: blocks sharing weight tiles run together
  float acc[2][Tile::kMmaM][Tile::kMmaN][4];
  swiglu_gemm::mainloop<Tile, Vector>(acc, smem, x, Wg, Wu, M, N, K, m0, n0);

  int2 origin = swiglu_gemm::warp_origin<Tile>();
  int lane = threadIdx.x & 31, g = lane >> 2, c2 = (lane & 3) * 2;
#pragma unroll
  for (int nt = 0; nt < Tile::kMmaN; ++nt) {
    int col = n0 + origin.y + nt * 8 + c2;
    float2 bias_g = load_bias_pair<HasBias, Paired>(bg, N, col);  // once per column pair
    float2 bias_u = load_bias_pair<HasBias, Paired>(bu, N, col);
#pragma unroll
    for (int mt = 0; mt < Tile::kMmaM; ++mt) {
      int row = m0 + origin.x + mt * 16 + g;
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // rows g and g + 8: accumulator entries {0, 1} and {2, 3}
        const float* ga = &acc[0][mt][nt][2 * half];
        const float* ua = &acc[1][mt][nt][2 * half];
        float h0 = silu(add_bias<HasBias>(ga[0], bias_g.x)) * add_bias<HasBias>(ua[0], bias_u.x);
        float h1 = silu(add_bias<HasBias>(ga[1], bias_g.y)) * add_bias<HasBias>(ua[1], bias_u.y);
        // chapter 03's store: no bias of its own (HasBias = false), bounds, one rounding
        store_output_pair<false, Paired>(h, float2{}, M, N, row + 8 * half, col, h0, h1);
      }
    }
  }
}

namespace {

template <class Tile, bool HasBias, bool Vector, bool Paired>
void v3_launch_instance(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg, const __nv_bfloat16* bg,
                        const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int M, int N, int K, cudaStream_t stream) {
  auto kernel = swiglu_v3_dual_gemm_kernel<Tile, HasBias, Vector, Paired>;
  // More than 48 KB of dynamic shared memory must be asked for, once per kernel.
  static const bool configured = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
    return true;
  }();
  (void)configured;
  dim3 grid((M + Tile::BM - 1) / Tile::BM, (N + Tile::BN - 1) / Tile::BN);
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(h, x, Wg, bg, Wu, bu, M, N, K);
  CUDA_CHECK_LAUNCH();
}

template <class Tile>
void v3_launch(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg, const __nv_bfloat16* bg,
               const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int M, int N, int K, cudaStream_t stream) {
  auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  bool vector = K % 8 == 0 && aligned(x, 16) && aligned(Wg, 16) && aligned(Wu, 16);
  bool paired = N % 2 == 0 && aligned(h, 4) && aligned(bg, 4) && aligned(bu, 4);
  swiglu_has_bias(bg, bu);
  with_bias_flag(bg, [&](auto has_bias) {
    constexpr bool kHasBias = decltype(has_bias)::value;
    if (vector && paired) {
      v3_launch_instance<Tile, kHasBias, true, true>(h, x, Wg, bg, Wu, bu, M, N, K, stream);
    } else if (vector) {
      v3_launch_instance<Tile, kHasBias, true, false>(h, x, Wg, bg, Wu, bu, M, N, K, stream);
    } else {
      v3_launch_instance<Tile, kHasBias, false, false>(h, x, Wg, bg, Wu, bu, M, N, K, stream);
    }
  });
}

struct V3Tile {
  const char* name;
  int rows, cols;     // BM x BN: tokens x features j per block (each of g and u)
  double efficiency;  // relative speed of an SM full of these tiles (for pick_tile_shape)
  void (*launch)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                 const __nv_bfloat16*, const __nv_bfloat16*, int, int, int, cudaStream_t);
};

using swiglu_gemm::Tile;
// Warp tiles (per weight): 64x32 reuses each fragment most; 32x16 wastes the least on a
// handful of tokens (T = 16 fills half of a 32-row tile, a quarter of a 64-row one).
// Efficiencies: each tile's TFLOP/s at T = 2048 (where wave quantization hardly
// matters) relative to the best, measured on the H200 (README.md). The big 128x128
// tile was expected to win and does not: at 218 registers per thread one 8-warp block
// fits per SM, too few warps to hide the ldmatrix and shared-memory latency of
// mma.sync, while the 64x64 tile (151 registers, 4 warps) runs 3 blocks per SM.
constexpr V3Tile kV3Tiles[] = {
    {"128x128 (8 warps of 64x32, x2)", 128, 128, 0.93, v3_launch<Tile<128, 128, 2, 4, 2>>},
    {"64x128 (8 warps of 32x32, x2)", 64, 128, 0.67, v3_launch<Tile<64, 128, 2, 4, 2>>},
    {"64x64 (4 warps of 32x32, x2)", 64, 64, 1.00, v3_launch<Tile<64, 64, 2, 2, 2>>},
    {"32x64 (4 warps of 32x16, x2)", 32, 64, 0.75, v3_launch<Tile<32, 64, 1, 4, 2>>},
};
constexpr int kV3TileCount = int(sizeof(kV3Tiles) / sizeof(kV3Tiles[0]));

}  // namespace

int swiglu_v3_tile_count() { return kV3TileCount; }
const char* swiglu_v3_tile_name(int tile) {
  swiglu_check_tile("swiglu_v3_tile_name", tile, kV3TileCount);
  return kV3Tiles[tile].name;
}
int swiglu_v3_pick_tile(int T, int F) { return pick_tile_shape(kV3Tiles, T, F); }

void swiglu_v3_dual_gemm_tile(int tile, __nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                              const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C,
                              int F, cudaStream_t stream) {
  swiglu_check_tile("swiglu_v3_dual_gemm_tile", tile, kV3TileCount);
  swiglu_check_shape("swiglu_v3_dual_gemm", T, C, F);
  swiglu_has_bias(bg, bu);
  if (T == 0) return;
  kV3Tiles[tile].launch(h, x, Wg, bg, Wu, bu, T, F, C, stream);
}

void swiglu_v3_dual_gemm(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg, const __nv_bfloat16* bg,
                         const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C, int F, cudaStream_t stream) {
  swiglu_check_shape("swiglu_v3_dual_gemm", T, C, F);
  swiglu_has_bias(bg, bu);
  if (T == 0) return;
  swiglu_v3_dual_gemm_tile(swiglu_v3_pick_tile(T, F), h, x, Wg, bg, Wu, bu, T, C, F, stream);
}

}  // namespace bielik
