// v3: register blocking, each thread computes an 8x8 block of outputs.
//
// What changed from v2: in v2 every multiply-add cost two shared-memory loads. Here a
// block of 256 threads owns a 128x128 tile of y, and each thread an 8x8 block of it.
// Per step k a thread loads 8 values of x and 8 of W into registers and does 8*8 = 64
// multiply-adds with them: 16 loads for 64 FMAs instead of 2 per FMA, an 8x better
// ratio, so the FMA units, not shared memory, set the pace.
//
// The tiles are stored transposed, k-major (xs[k][m], ws[k][n]), so the 8 values a thread
// needs at step k are contiguous and come as two 16-byte float4 loads. A thread's 8 rows
// are not one block of 8 but two blocks of 4, 64 apart (ty*4 and 64 + ty*4): then the 8
// threads that share a float4 load phase read 8 consecutive float4 = 128 contiguous
// bytes, conflict-free. Global loads are 16 bytes (8 bf16 along C_in) when the vector
// path is possible, else element by element; both zero-fill outside x, W and C_in.
//
// Still CUDA cores: fp32 FMAs peak at ~67 TFLOP/s on an H200, the bf16 tensor cores at
// ~990. v4 moves the multiply-adds to the tensor cores.
#include "cuda_check.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"

namespace bielik {

namespace {
constexpr int kV3Tile = 128;    // BM = BN
constexpr int kV3K = 16;        // k slice per shared-memory tile
constexpr int kV3Threads = 256; // 16 x 16 threads, 8 x 8 outputs each

// Loads one row of 8 consecutive bf16 (k0 .. k0+7 of `row`) of a (rows, K) matrix,
// zeros outside, as fp32. Vector: one 16-byte load (K % 8 == 0, aligned rows).
template <bool Vector>
__device__ __forceinline__ void load_8(float (&v)[8], const __nv_bfloat16* matrix, int row, int rows, int k0, int K) {
  const __nv_bfloat16* p = matrix + size_t(row) * K + k0;
  if constexpr (Vector) {
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (row < rows && k0 < K) raw = __ldg(reinterpret_cast<const uint4*>(p));
    const __nv_bfloat16* e = reinterpret_cast<const __nv_bfloat16*>(&raw);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = bf16_to_f32(e[j]);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = (row < rows && k0 + j < K) ? bf16_to_f32(p[j]) : 0.0f;
  }
}
}  // namespace

template <bool HasBias, bool Vector>
__global__ void __launch_bounds__(kV3Threads, 2)
    matmul_v3_register_blocking_kernel(__nv_bfloat16* y,           // (M, N)
                                       const __nv_bfloat16* x,     // (M, K)
                                       const __nv_bfloat16* W,     // (N, K)
                                       const __nv_bfloat16* bias,  // (N), unused when !HasBias
                                       int M, int N, int K) {
  __shared__ __align__(16) float xs[kV3K][kV3Tile];  // x tile, transposed: (k, m)
  __shared__ __align__(16) float ws[kV3K][kV3Tile];  // W tile, transposed: (k, n)
  int tid = threadIdx.x;
  int tx = tid % 16, ty = tid / 16;
  int m0 = blockIdx.y * kV3Tile, n0 = blockIdx.x * kV3Tile;
  // Loading: 128 rows x 16 k = 256 runs of 8, one per thread for x and one for W.
  int load_row = tid / 2, load_k = (tid % 2) * 8;

  float acc[8][8] = {};
  for (int k0 = 0; k0 < K; k0 += kV3K) {
    float v[8];
    load_8<Vector>(v, x, m0 + load_row, M, k0 + load_k, K);
#pragma unroll
    for (int j = 0; j < 8; ++j) xs[load_k + j][load_row] = v[j];
    load_8<Vector>(v, W, n0 + load_row, N, k0 + load_k, K);
#pragma unroll
    for (int j = 0; j < 8; ++j) ws[load_k + j][load_row] = v[j];
    __syncthreads();

#pragma unroll
    for (int kk = 0; kk < kV3K; ++kk) {
      float a[8], b[8];
      *reinterpret_cast<float4*>(&a[0]) = *reinterpret_cast<const float4*>(&xs[kk][ty * 4]);
      *reinterpret_cast<float4*>(&a[4]) = *reinterpret_cast<const float4*>(&xs[kk][64 + ty * 4]);
      *reinterpret_cast<float4*>(&b[0]) = *reinterpret_cast<const float4*>(&ws[kk][tx * 4]);
      *reinterpret_cast<float4*>(&b[4]) = *reinterpret_cast<const float4*>(&ws[kk][64 + tx * 4]);
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] += a[i] * b[j];
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    int m = m0 + (i < 4 ? ty * 4 + i : 64 + ty * 4 + i - 4);
    if (m >= M) continue;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int n = n0 + (j < 4 ? tx * 4 + j : 64 + tx * 4 + j - 4);
      if (n >= N) continue;
      float out = acc[i][j];
      if constexpr (HasBias) out += bf16_to_f32(bias[n]);
      y[size_t(m) * N + n] = __float2bfloat16(out);
    }
  }
}

void matmul_v3_register_blocking(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                                 const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("matmul_v3_register_blocking", T, C_in, C_out);
  if (T == 0 || C_out == 0) return;
  dim3 grid((C_out + kV3Tile - 1) / kV3Tile, (T + kV3Tile - 1) / kV3Tile);
  bool vector = matmul_vector_path_ok(y, x, W, bias, C_in, C_out);
  with_bias_flag(bias, [&](auto has_bias) {
    constexpr bool kHasBias = decltype(has_bias)::value;
    if (vector) {
      matmul_v3_register_blocking_kernel<kHasBias, true><<<grid, kV3Threads, 0, stream>>>(y, x, W, bias, T, C_out, C_in);
    } else {
      matmul_v3_register_blocking_kernel<kHasBias, false><<<grid, kV3Threads, 0, stream>>>(y, x, W, bias, T, C_out, C_in);
    }
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
