// v2: shared-memory tiling, 32x32 outputs per block.
//
// What changed from v1: a block of 32x32 threads owns a 32x32 tile of y. For each
// 32-wide slice of C_in it first copies a 32x32 tile of x and a 32x32 tile of W into
// shared memory (each thread one value of each, neighbouring threads neighbouring k:
// coalesced 64-byte row segments instead of v1's 32 scattered lines), waits for the
// whole block, then every thread runs 32 multiply-adds out of shared memory. Each value
// loaded from global memory now feeds 32 outputs instead of one.
//
// The tiles are stored as fp32 (converted once on the way in, not 32 times in the loop)
// with one float of padding per row: thread tx reads ws[tx][k], and a row stride of 33
// words puts the 32 threads of a warp on 32 different banks. Without the pad all 32
// would hit the same bank, a 32-way conflict. xs[ty][k] is one address per warp (every
// thread of a warp has the same ty): a broadcast.
//
// Still slow: each multiply-add needs two shared-memory loads, and shared memory
// delivers far fewer bytes per clock than the FMA units consume. v3 keeps operands in
// registers. Edges: values outside x, W or C_in are loaded as 0 (they add nothing) and
// outputs outside y are not stored, so any size works.
#include "cuda_check.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"

namespace bielik {

constexpr int kV2Tile = 32;

template <bool HasBias>
__global__ void __launch_bounds__(kV2Tile * kV2Tile)
    matmul_v2_smem_tiling_kernel(__nv_bfloat16* y,           // (M, N)
                                 const __nv_bfloat16* x,     // (M, K)
                                 const __nv_bfloat16* W,     // (N, K)
                                 const __nv_bfloat16* bias,  // (N), unused when !HasBias
                                 int M, int N, int K) {
  __shared__ float xs[kV2Tile][kV2Tile + 1];  // (rows of x, k)
  __shared__ float ws[kV2Tile][kV2Tile + 1];  // (rows of W, k)
  int tx = threadIdx.x, ty = threadIdx.y;
  int m0 = blockIdx.y * kV2Tile, n0 = blockIdx.x * kV2Tile;

  float sum = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kV2Tile) {
    int k = k0 + tx;
    xs[ty][tx] = (m0 + ty < M && k < K) ? bf16_to_f32(x[size_t(m0 + ty) * K + k]) : 0.0f;
    ws[ty][tx] = (n0 + ty < N && k < K) ? bf16_to_f32(W[size_t(n0 + ty) * K + k]) : 0.0f;
    __syncthreads();  // the tiles are complete
#pragma unroll
    for (int kk = 0; kk < kV2Tile; ++kk) sum += xs[ty][kk] * ws[tx][kk];
    __syncthreads();  // everyone is done with them before they are overwritten
  }
  int m = m0 + ty, n = n0 + tx;
  if (m < M && n < N) {
    if constexpr (HasBias) sum += bf16_to_f32(bias[n]);
    y[size_t(m) * N + n] = __float2bfloat16(sum);
  }
}

void matmul_v2_smem_tiling(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                           const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("matmul_v2_smem_tiling", T, C_in, C_out);
  if (T == 0 || C_out == 0) return;
  dim3 threads(kV2Tile, kV2Tile);
  dim3 grid((C_out + kV2Tile - 1) / kV2Tile, (T + kV2Tile - 1) / kV2Tile);
  with_bias_flag(bias, [&](auto has_bias) {
    matmul_v2_smem_tiling_kernel<decltype(has_bias)::value><<<grid, threads, 0, stream>>>(y, x, W, bias, T, C_out,
                                                                                          C_in);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
