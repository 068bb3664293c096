// v2: fused attention with an online softmax, one warp per (query, head).
//
// What changed from v1: the scores never touch global memory. A warp owns one query
// row of one head and walks its visible keys in chunks of 32, one key per lane:
//   * lane l computes the score of key j0 + l (a full dot product with 16-byte loads of
//     the k row; the query row sits in shared memory and is broadcast to all lanes);
//   * the warp updates the running max m and running sum l of the softmax ("online
//     softmax"): when a chunk raises the max from m to m', everything accumulated so far
//     is rescaled by exp(m - m'), so one pass suffices and no score is ever stored;
//   * the output accumulator is spread over the lanes (D/32 dimensions each) and gets
//     p_j * v[j] for the 32 keys of the chunk, p_j broadcast by a shuffle.
// One kernel instead of three, no workspace, and memory traffic of k and v only.
//
// What is still slow: every (query, head) warp re-reads all of its keys and values
// (from L2, mostly), so the K/V traffic grows as Tq * Tkv; and the math runs on CUDA
// cores in fp32. v3 shares each K/V tile among 64 queries and moves the two matrix
// products onto tensor cores.
#include <cmath>

#include "attention.cuh"
#include "cuda_check.cuh"

namespace bielik {

namespace {
constexpr int kWarpsPerBlock = 4;

__device__ float warp_max(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}
__device__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
}  // namespace

template <int D>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    attention_v2_online_softmax_kernel(__nv_bfloat16* out,        // (Tq, H, D)
                                       const __nv_bfloat16* q,    // (Tq, H, D)
                                       const __nv_bfloat16* k,    // (Tkv, Hkv, D)
                                       const __nv_bfloat16* v,    // (Tkv, Hkv, D)
                                       int Tq, int Tkv, int H, int Hkv, float scale_log2) {
  constexpr int kDimsPerLane = D / 32;  // output dimensions owned by one lane: 4 (D=128) or 2 (D=64)
  __shared__ float q_shared[kWarpsPerBlock][D];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row = blockIdx.x * kWarpsPerBlock + warp;  // (i, h) flattened, h fastest
  if (row >= Tq * H) return;                           // whole warp leaves together
  const int i = row / H, h = row % H, g = h / (H / Hkv);

  // The query row, pre-multiplied by scale * log2(e): scores come out in log2 units so
  // the kernel can use exp2f, which is one hardware instruction.
  const __nv_bfloat16* q_row = q + (size_t(i) * H + h) * D;
  for (int d = lane; d < D; d += 32) q_shared[warp][d] = __bfloat162float(q_row[d]) * scale_log2;
  __syncwarp();

  float acc[kDimsPerLane] = {};
  float running_max = -INFINITY, running_sum = 0;
  const int visible = Tkv - Tq + i + 1;  // keys 0 .. Tkv - Tq + i
  const size_t kv_stride = size_t(Hkv) * D;
  for (int j0 = 0; j0 < visible; j0 += 32) {
    const int j = j0 + lane;
    float score = -INFINITY;
    if (j < visible) {
      const int4* k_row = reinterpret_cast<const int4*>(k + j * kv_stride + g * D);
      score = 0;
#pragma unroll
      for (int c = 0; c < D / 8; ++c) {
        int4 packed = __ldg(k_row + c);
        const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&packed);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float2 kv = __bfloat1622float2(pairs[e]);
          score += q_shared[warp][8 * c + 2 * e] * kv.x + q_shared[warp][8 * c + 2 * e + 1] * kv.y;
        }
      }
    }
    // Online softmax update. The first chunk always contains key 0, so new_max is finite.
    const float new_max = fmaxf(running_max, warp_max(score));
    const float correction = exp2f(running_max - new_max);  // 0 on the first chunk
    const float p = exp2f(score - new_max);                 // 0 for keys past `visible`
    running_sum = running_sum * correction + warp_sum(p);
    running_max = new_max;
#pragma unroll
    for (int e = 0; e < kDimsPerLane; ++e) acc[e] *= correction;

    const int chunk = min(32, visible - j0);
    for (int jj = 0; jj < chunk; ++jj) {
      const float p_j = __shfl_sync(0xffffffffu, p, jj);
      const __nv_bfloat16* v_row = v + (j0 + jj) * kv_stride + g * D + lane * kDimsPerLane;
#pragma unroll
      for (int e = 0; e < kDimsPerLane; e += 2) {
        float2 value = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(v_row + e));
        acc[e] += p_j * value.x;
        acc[e + 1] += p_j * value.y;
      }
    }
  }

  const float inv_sum = 1.0f / running_sum;
  __nv_bfloat16* out_row = out + (size_t(i) * H + h) * D + lane * kDimsPerLane;
#pragma unroll
  for (int e = 0; e < kDimsPerLane; e += 2) {
    *reinterpret_cast<__nv_bfloat162*>(out_row + e) = __floats2bfloat162_rn(acc[e] * inv_sum, acc[e + 1] * inv_sum);
  }
}

void attention_v2_online_softmax(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                 const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D, float* /*workspace*/,
                                 cudaStream_t stream) {
  attention_check_shapes("attention_v2_online_softmax", Tq, Tkv, H, Hkv, D);
  if (Tq == 0) return;
  // k is read in 16-byte chunks, v and out as bf16 pairs (4 bytes): a misaligned
  // pointer would fault on the GPU and take the whole context down with it.
  if (reinterpret_cast<uintptr_t>(k) % 16 != 0) throw std::invalid_argument("attention_v2: k must be 16-byte aligned");
  if (reinterpret_cast<uintptr_t>(v) % 4 != 0 || reinterpret_cast<uintptr_t>(out) % 4 != 0) {
    throw std::invalid_argument("attention_v2: v and out must be 4-byte aligned");
  }
  const float scale_log2 = 1.4426950408889634f / std::sqrt(float(D));  // log2(e) / sqrt(D)
  const unsigned blocks = unsigned((size_t(Tq) * H + kWarpsPerBlock - 1) / kWarpsPerBlock);
  if (D == 128) {
    attention_v2_online_softmax_kernel<128><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(out, q, k, v, Tq, Tkv, H,
                                                                                        Hkv, scale_log2);
  } else {
    attention_v2_online_softmax_kernel<64><<<blocks, kWarpsPerBlock * 32, 0, stream>>>(out, q, k, v, Tq, Tkv, H,
                                                                                       Hkv, scale_log2);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace bielik
