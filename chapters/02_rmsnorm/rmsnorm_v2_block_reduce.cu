// v2: one block per row, shared-memory tree reduction.
//
// What changed from v1: row t belongs to block t. Its 256 threads stride through the
// row together (thread i reads c = i, i + 256, ...), so each warp-wide load reads 64
// contiguous bytes and coalesces, and T = 1 already keeps 256 threads busy instead of
// one. The price is that the sum of squares is now spread over 256 threads: each puts
// its partial sum in shared memory and the block adds them pairwise in log2(256) = 8
// rounds, halving the active threads each round, with a __syncthreads() between rounds
// so no thread reads a slot before its partner has written it.
//
// What is still slow: 2-byte loads (many instructions per byte), eight block-wide
// barriers per row, and x is read twice (the second pass mostly hits L1/L2, but it
// costs instructions and cache traffic). v3 attacks all three.
#include "cuda_check.cuh"
#include "rmsnorm.cuh"

namespace bielik {

namespace {
constexpr int kThreads = 256;  // a power of two: the tree halves it down to 1
}

__global__ void rmsnorm_v2_block_reduce_kernel(__nv_bfloat16* y,             // (T, C)
                                               const __nv_bfloat16* x,       // (T, C)
                                               const __nv_bfloat16* weight,  // (C)
                                               int C, float eps) {
  __shared__ float partial[kThreads];
  const __nv_bfloat16* x_row = x + size_t(blockIdx.x) * C;
  __nv_bfloat16* y_row = y + size_t(blockIdx.x) * C;

  float sum_squares = 0.0f;
  for (int c = threadIdx.x; c < C; c += kThreads) {
    float value = __bfloat162float(x_row[c]);
    sum_squares += value * value;
  }
  partial[threadIdx.x] = sum_squares;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  float inverse_rms = rsqrtf(partial[0] / float(C) + eps);

  for (int c = threadIdx.x; c < C; c += kThreads) {
    y_row[c] = __float2bfloat16(__bfloat162float(x_row[c]) * inverse_rms * __bfloat162float(weight[c]));
  }
}

void rmsnorm_v2_block_reduce(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* weight, int T, int C,
                             float eps, cudaStream_t stream) {
  rmsnorm_check_sizes("rmsnorm_v2_block_reduce", T, C);
  if (T == 0 || C == 0) return;
  rmsnorm_v2_block_reduce_kernel<<<T, kThreads, 0, stream>>>(y, x, weight, C, eps);
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
