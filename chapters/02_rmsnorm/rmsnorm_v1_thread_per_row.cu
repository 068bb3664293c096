// v1: one thread per row.
//
// The CPU loop moved to the GPU as is: thread t owns row t, sums its C squares, then
// writes its C outputs. It is correct and easy to check, and slow for two reasons.
// (1) Neighbouring threads read addresses C * 2 bytes apart, so every warp-wide load
// touches 32 different cache lines for 64 useful bytes: the loads do not coalesce.
// (2) There are only T threads: at T = 1 (decode) one thread walks 1536 values alone,
// at T = 4096 the whole GPU has 4096 threads, a fraction of what it needs to keep its
// memory system busy. v2 gives each row a whole block.
#include "cuda_check.cuh"
#include "rmsnorm.cuh"

namespace bielik {

__global__ void rmsnorm_v1_thread_per_row_kernel(__nv_bfloat16* y,              // (T, C)
                                                 const __nv_bfloat16* x,        // (T, C)
                                                 const __nv_bfloat16* weight,   // (C)
                                                 int T, int C, float eps) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const __nv_bfloat16* x_row = x + size_t(t) * C;
  __nv_bfloat16* y_row = y + size_t(t) * C;

  float sum_squares = 0.0f;  // fp32 accumulation: bf16 would lose the small terms
  for (int c = 0; c < C; ++c) {
    float value = __bfloat162float(x_row[c]);
    sum_squares += value * value;
  }
  float inverse_rms = rsqrtf(sum_squares / float(C) + eps);
  for (int c = 0; c < C; ++c) {
    y_row[c] = __float2bfloat16(__bfloat162float(x_row[c]) * inverse_rms * __bfloat162float(weight[c]));
  }
}

void rmsnorm_v1_thread_per_row(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* weight, int T, int C,
                               float eps, cudaStream_t stream) {
  rmsnorm_check_sizes("rmsnorm_v1_thread_per_row", T, C);
  if (T == 0 || C == 0) return;
  int threads = 128;
  int blocks = (T + threads - 1) / threads;
  rmsnorm_v1_thread_per_row_kernel<<<blocks, threads, 0, stream>>>(y, x, weight, T, C, eps);
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
