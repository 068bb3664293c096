// v2: the activation fused into the up GEMM's epilogue.
//
// What changed from v1: v1 writes g and u (two (T, F) bf16 tensors) to global memory
// and a third kernel reads both back to write h. Here the gate GEMM still writes g
// (chapter 03's matmul_forward, bias in its epilogue), but the up GEMM is our own
// tensor-core kernel whose epilogue, while u is still in fp32 registers, adds bu, reads
// g[t, j] from global memory and writes h = silu(g) * u. u never exists in memory, and
// a kernel launch disappears. At T = 2048, F = 8960 one (T, F) bf16 tensor is 37 MB:
// v2 saves writing u and reading it back (73 MB of traffic, ~17 us at 4.3 TB/s) and a
// launch.
//
// What it does not fix: g still makes a round trip through memory, and x is streamed
// through shared memory twice (once per GEMM). v3 removes both.
//
// The main loop is chapter 03's v4 loop (swiglu_gemm_tile.cuh with one weight); only
// the epilogue is new. g is read as a bf16 pair per thread (adjacent columns), the same
// positions the accumulators hold, right before the store of h at those positions.
#include "cuda_check.cuh"
#include "matmul_common.cuh"
#include "swiglu.cuh"
#include "swiglu_device.cuh"
#include "swiglu_gemm_tile.cuh"
#include "swiglu_scratch.cuh"

namespace bielik {

namespace {

/// g[row, col] and g[row, col + 1] as fp32 (zero outside the (M, N) tensor).
template <bool Paired>
__device__ __forceinline__ float2 load_gate_pair(const __nv_bfloat16* gate,  // (M, N)
                                                 int M, int N, int row, int col) {
  float2 v = make_float2(0.0f, 0.0f);
  if (row >= M || col >= N) return v;
  const __nv_bfloat16* p = gate + size_t(row) * N + col;
  if constexpr (Paired) {  // N even, col even: col + 1 < N
    v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
  } else {
    v.x = __bfloat162float(p[0]);
    if (col + 1 < N) v.y = __bfloat162float(p[1]);
  }
  return v;
}

}  // namespace

template <class Tile, bool HasBias, bool Vector, bool Paired>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kThreads == 256 ? 1 : 2)
    swiglu_v2_up_gemm_kernel(__nv_bfloat16* h,            // (M, N) = (T, F)
                             const __nv_bfloat16* gate,   // (M, N): x Wg^T + bg, bf16
                             const __nv_bfloat16* x,      // (M, K) = (T, C)
                             const __nv_bfloat16* Wu,     // (N, K)
                             const __nv_bfloat16* bu,     // (N), unused when !HasBias
                             int M, int N, int K) {
  extern __shared__ __align__(128) __nv_bfloat16 smem[];
  int m0 = blockIdx.x * Tile::BM, n0 = blockIdx.y * Tile::BN;
  float acc[1][Tile::kMmaM][Tile::kMmaN][4];
  swiglu_gemm::mainloop<Tile, Vector>(acc, smem, x, Wu, nullptr, M, N, K, m0, n0);

  int2 origin = swiglu_gemm::warp_origin<Tile>();
  int lane = threadIdx.x & 31, g = lane >> 2, c2 = (lane & 3) * 2;
#pragma unroll
  for (int nt = 0; nt < Tile::kMmaN; ++nt) {
    int col = n0 + origin.y + nt * 8 + c2;
    float2 bias_u = load_bias_pair<HasBias, Paired>(bu, N, col);
#pragma unroll
    for (int mt = 0; mt < Tile::kMmaM; ++mt) {
      int row = m0 + origin.x + mt * 16 + g;
#pragma unroll
      for (int half = 0; half < 2; ++half) {  // rows g and g + 8: accumulator entries {0, 1} and {2, 3}
        const float* ua = &acc[0][mt][nt][2 * half];
        float2 gv = load_gate_pair<Paired>(gate, M, N, row + 8 * half, col);
        float h0 = silu(gv.x) * add_bias<HasBias>(ua[0], bias_u.x);
        float h1 = silu(gv.y) * add_bias<HasBias>(ua[1], bias_u.y);
        store_output_pair<false, Paired>(h, float2{}, M, N, row + 8 * half, col, h0, h1);
      }
    }
  }
}

namespace {

using UpLaunch = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                          const __nv_bfloat16*, int, int, int, cudaStream_t);

template <class Tile, bool HasBias, bool Vector, bool Paired>
void v2_launch_instance(__nv_bfloat16* h, const __nv_bfloat16* gate, const __nv_bfloat16* x, const __nv_bfloat16* Wu,
                        const __nv_bfloat16* bu, int M, int N, int K, cudaStream_t stream) {
  auto kernel = swiglu_v2_up_gemm_kernel<Tile, HasBias, Vector, Paired>;
  static const bool configured = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
    return true;
  }();
  (void)configured;
  dim3 grid((M + Tile::BM - 1) / Tile::BM, (N + Tile::BN - 1) / Tile::BN);
  kernel<<<grid, Tile::kThreads, Tile::kSmemBytes, stream>>>(h, gate, x, Wu, bu, M, N, K);
  CUDA_CHECK_LAUNCH();
}

template <class Tile>
void v2_launch(__nv_bfloat16* h, const __nv_bfloat16* gate, const __nv_bfloat16* x, const __nv_bfloat16* Wu,
               const __nv_bfloat16* bu, int M, int N, int K, cudaStream_t stream) {
  auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  bool vector = K % 8 == 0 && aligned(x, 16) && aligned(Wu, 16);
  bool paired = N % 2 == 0 && aligned(h, 4) && aligned(gate, 4) && aligned(bu, 4);
  with_bias_flag(bu, [&](auto has_bias) {
    constexpr bool kHasBias = decltype(has_bias)::value;
    if (vector && paired) {
      v2_launch_instance<Tile, kHasBias, true, true>(h, gate, x, Wu, bu, M, N, K, stream);
    } else if (vector) {
      v2_launch_instance<Tile, kHasBias, true, false>(h, gate, x, Wu, bu, M, N, K, stream);
    } else {
      v2_launch_instance<Tile, kHasBias, false, false>(h, gate, x, Wu, bu, M, N, K, stream);
    }
  });
}

struct V2Tile {
  const char* name;
  int rows, cols;
  double efficiency;
  UpLaunch launch;
};

using swiglu_gemm::Tile;
// One weight: chapter 03's tile menu (64x64 warp tiles at the top), plus a 32-row tile
// for a handful of tokens. Efficiencies: TFLOP/s of the whole of v2 at T = 2048 with
// each tile, relative to the best, measured on the H200 (README.md): the small 64x64
// tile, with several blocks per SM, wins, as in v3.
constexpr V2Tile kV2Tiles[] = {
    {"128x256 (8 warps of 64x64)", 128, 256, 0.75, v2_launch<Tile<128, 256, 2, 4, 1>>},
    {"128x128 (4 warps of 64x64)", 128, 128, 0.81, v2_launch<Tile<128, 128, 2, 2, 1>>},
    {"64x128 (4 warps of 32x64)", 64, 128, 0.94, v2_launch<Tile<64, 128, 2, 2, 1>>},
    {"64x64 (4 warps of 32x32)", 64, 64, 1.00, v2_launch<Tile<64, 64, 2, 2, 1>>},
    {"32x64 (4 warps of 32x16)", 32, 64, 0.80, v2_launch<Tile<32, 64, 1, 4, 1>>},
};
constexpr int kV2TileCount = int(sizeof(kV2Tiles) / sizeof(kV2Tiles[0]));

}  // namespace

int swiglu_v2_tile_count() { return kV2TileCount; }
const char* swiglu_v2_tile_name(int tile) {
  swiglu_check_tile("swiglu_v2_tile_name", tile, kV2TileCount);
  return kV2Tiles[tile].name;
}
int swiglu_v2_pick_tile(int T, int F) { return pick_tile_shape(kV2Tiles, T, F); }

void swiglu_v2_epilogue_fused_tile(int tile, __nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                                   const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T,
                                   int C, int F, cudaStream_t stream) {
  swiglu_check_tile("swiglu_v2_epilogue_fused_tile", tile, kV2TileCount);
  swiglu_check_shape("swiglu_v2_epilogue_fused", T, C, F);
  swiglu_has_bias(bg, bu);
  if (T == 0) return;
  SwigluScratch& scratch = SwigluScratch::instance();
  std::lock_guard<std::mutex> lock(scratch.mutex());
  __nv_bfloat16* gate = scratch.buffer(0, size_t(T) * F);
  // The lock only orders the enqueueing: the GPU must also finish the previous call's
  // kernels (maybe on another stream) before this one overwrites g.
  scratch.wait_for_last_use(stream);
  matmul_forward(gate, x, Wg, bg, T, C, F, stream);
  kV2Tiles[tile].launch(h, gate, x, Wu, bu, T, F, C, stream);
  scratch.record_last_use(stream);
}

void swiglu_v2_epilogue_fused(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                              const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C,
                              int F, cudaStream_t stream) {
  swiglu_check_shape("swiglu_v2_epilogue_fused", T, C, F);
  swiglu_has_bias(bg, bu);
  if (T == 0) return;
  swiglu_v2_epilogue_fused_tile(swiglu_v2_pick_tile(T, F), h, x, Wg, bg, Wu, bu, T, C, F, stream);
}

}  // namespace bielik
