// v1: naive attention, the scores materialized in global memory.
//
// The formula as three kernels, one per step:
//   1. scores[h, i, j] = q[i, h] . k[j, g] / sqrt(D), or -inf where j is in i's future;
//      one thread per score, reading its q row and k row straight from global memory.
//   2. softmax of each row of scores, in place (one block per row: max, sum, divide).
//   3. out[i, h, d] = sum_j p[h, i, j] * v[j, g, d]; one thread per output element.
// Everything is fp32 until the final bf16 store, which makes this the accuracy yardstick
// of the chapter: the tests allow every other version twice v1's error (plus 1e-3).
//
// Why it is slow: the (H, Tq, Tkv) score matrix is written, read, written and read again
// (Bielik at T = 2048: 201 MB each way; at T = 8192 it would be 3.2 GB), every score
// re-reads a whole k row, every output element re-reads a whole column of p, and no
// tensor core is involved. v2 keeps the scores in registers; v3 adds tiling and tensor cores.
#include <cmath>

#include "attention.cuh"
#include "cuda_check.cuh"

namespace bielik {

__global__ void attention_v1_scores_kernel(float* scores,               // (H, Tq, Tkv)
                                           const __nv_bfloat16* q,      // (Tq, H, D)
                                           const __nv_bfloat16* k,      // (Tkv, Hkv, D)
                                           int Tq, int Tkv, int H, int Hkv, int D, float scale) {
  size_t index = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  if (index >= size_t(H) * Tq * Tkv) return;
  int j = int(index % Tkv);
  int i = int((index / Tkv) % Tq);
  int h = int(index / (size_t(Tkv) * Tq));
  int g = h / (H / Hkv);
  if (j > Tkv - Tq + i) {  // a key in query i's future
    scores[index] = -INFINITY;
    return;
  }
  const __nv_bfloat16* q_row = q + (size_t(i) * H + h) * D;
  const __nv_bfloat16* k_row = k + (size_t(j) * Hkv + g) * D;
  float dot = 0;
  for (int d = 0; d < D; ++d) dot += __bfloat162float(q_row[d]) * __bfloat162float(k_row[d]);
  scores[index] = dot * scale;
}

// One block per row of scores; turns it into probabilities in place.
__global__ void attention_v1_softmax_kernel(float* scores,  // (H * Tq rows, Tkv)
                                            int Tkv) {
  __shared__ float partial[32];
  float* row = scores + size_t(blockIdx.x) * Tkv;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;

  // Block-wide reduction: each warp reduces with shuffles, warp 0 combines the warps.
  auto block_reduce = [&](float value, bool is_max) {
    for (int offset = 16; offset > 0; offset /= 2) {
      float other = __shfl_xor_sync(0xffffffffu, value, offset);
      value = is_max ? fmaxf(value, other) : value + other;
    }
    __syncthreads();  // `partial` may still be read from the previous reduction
    if (lane == 0) partial[warp] = value;
    __syncthreads();
    value = is_max ? -INFINITY : 0.0f;
    for (int w = 0; w < warps; ++w) value = is_max ? fmaxf(value, partial[w]) : value + partial[w];
    return value;
  };

  float max_score = -INFINITY;
  for (int j = threadIdx.x; j < Tkv; j += blockDim.x) max_score = fmaxf(max_score, row[j]);
  max_score = block_reduce(max_score, true);  // finite: key 0 is visible to every query
  float sum = 0;
  for (int j = threadIdx.x; j < Tkv; j += blockDim.x) {
    float p = expf(row[j] - max_score);  // exp(-inf) = 0 for masked keys
    row[j] = p;
    sum += p;
  }
  float inv_sum = 1.0f / block_reduce(sum, false);
  for (int j = threadIdx.x; j < Tkv; j += blockDim.x) row[j] *= inv_sum;
}

__global__ void attention_v1_pv_kernel(__nv_bfloat16* out,          // (Tq, H, D)
                                       const float* probabilities,  // (H, Tq, Tkv)
                                       const __nv_bfloat16* v,      // (Tkv, Hkv, D)
                                       int Tq, int Tkv, int H, int Hkv, int D) {
  size_t index = blockIdx.x * size_t(blockDim.x) + threadIdx.x;  // over (i, h, d), d fastest
  if (index >= size_t(Tq) * H * D) return;
  int d = int(index % D);
  int h = int((index / D) % H);
  int i = int(index / (size_t(D) * H));
  int g = h / (H / Hkv);
  const float* p_row = probabilities + (size_t(h) * Tq + i) * Tkv;
  int visible = Tkv - Tq + i + 1;
  float acc = 0;
  for (int j = 0; j < visible; ++j) acc += p_row[j] * __bfloat162float(v[(size_t(j) * Hkv + g) * D + d]);
  out[index] = __float2bfloat16(acc);
}

size_t attention_v1_workspace_floats(int Tq, int Tkv, int H) { return size_t(H) * Tq * Tkv; }

void attention_v1_naive(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                        int Tq, int Tkv, int H, int Hkv, int D, float* workspace, cudaStream_t stream) {
  attention_check_shapes("attention_v1_naive", Tq, Tkv, H, Hkv, D);
  if (Tq == 0) return;
  if (workspace == nullptr) throw std::invalid_argument("attention_v1_naive: needs a workspace");
  const int threads = 256;
  size_t score_count = attention_v1_workspace_floats(Tq, Tkv, H);
  attention_v1_scores_kernel<<<unsigned((score_count + threads - 1) / threads), threads, 0, stream>>>(
      workspace, q, k, Tq, Tkv, H, Hkv, D, 1.0f / std::sqrt(float(D)));
  CUDA_CHECK_LAUNCH();
  attention_v1_softmax_kernel<<<H * Tq, threads, 0, stream>>>(workspace, Tkv);
  CUDA_CHECK_LAUNCH();
  size_t out_count = size_t(Tq) * H * D;
  attention_v1_pv_kernel<<<unsigned((out_count + threads - 1) / threads), threads, 0, stream>>>(
      out, workspace, v, Tq, Tkv, H, Hkv, D);
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
