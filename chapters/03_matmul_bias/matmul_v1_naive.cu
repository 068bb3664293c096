// v1: one thread per output, the dot product straight from global memory.
//
// Thread (t, n) walks row x[t, :] and row W[n, :] together. Neighbouring threads of a
// warp take neighbouring n, so at each step k they read W[n..n+31, k]: 32 values
// C_in * 2 bytes apart, 32 different cache lines for 64 useful bytes. x[t, k] is the
// same address for the whole warp (a broadcast). Every value of W is fetched again for
// every t, from L1/L2 if we are lucky. The cost: about two global loads per multiply-add
// (the arithmetic intensity is ~0.5 FLOP per byte touched), so this runs far below both
// the memory and the compute ceiling. v2 makes each loaded value serve 32 outputs.
//
// Any size works as is: there are no tiles, only a bounds check on n.
#include "cuda_check.cuh"
#include "matmul.cuh"
#include "matmul_common.cuh"

namespace bielik {

template <bool HasBias>
__global__ void matmul_v1_naive_kernel(__nv_bfloat16* y,           // (M, N)
                                       const __nv_bfloat16* x,     // (M, K)
                                       const __nv_bfloat16* W,     // (N, K)
                                       const __nv_bfloat16* bias,  // (N), unused when !HasBias
                                       int M, int N, int K) {
  int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  const __nv_bfloat16* w_row = W + size_t(n) * K;
  for (int m = blockIdx.y; m < M; m += gridDim.y) {  // gridDim.y is capped at 65535
    const __nv_bfloat16* x_row = x + size_t(m) * K;
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += bf16_to_f32(x_row[k]) * bf16_to_f32(w_row[k]);
    if constexpr (HasBias) sum += bf16_to_f32(bias[n]);
    y[size_t(m) * N + n] = __float2bfloat16(sum);
  }
}

void matmul_v1_naive(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias,
                     int T, int C_in, int C_out, cudaStream_t stream) {
  matmul_check_sizes("matmul_v1_naive", T, C_in, C_out);
  if (T == 0 || C_out == 0) return;
  int threads = 256;
  dim3 grid((C_out + threads - 1) / threads, T < 65535 ? T : 65535);
  with_bias_flag(bias, [&](auto has_bias) {
    matmul_v1_naive_kernel<decltype(has_bias)::value><<<grid, threads, 0, stream>>>(y, x, W, bias, T, C_out, C_in);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
