// v4: v3 in ONE kernel: the last block of each kv head's splits does the combine.
//
// In the model's decode step, v3's two kernels (splits, then combine) are two of the
// seven launches of a layer, and at chat lengths each costs more in launch and drain
// (~3 us measured alone) than in work. What changed from v3:
//  * No combine kernel. Every split block writes its partial state, makes it visible
//    GPU-wide (__threadfence), and takes a ticket from a per-kv-head counter. The block
//    that draws the last ticket knows every other split of its kv head has written, and
//    merges the splits of its G query heads itself (the "last block" reduction); it then
//    resets the counter for the next call, so the kernel can sit in a CUDA graph.
//  * The launch is programmatic (PDL): the blocks are scheduled while the QKV kernel
//    still runs and wait on the GPU (griddepcontrol.wait) before reading the length, q
//    and the cache.
// The partial states are the same as v3's (same split body), so v4's output equals v3's
// up to the order of the final merge.
//
// Measured on the H200 (bench_kv_cache, 2026-11-29): SLOWER than v3, 26.5 vs 11.6 us a
// layer at 1k keys, 72 vs 20 us at 4k (198 splits). The launch it saves costs less than
// what the last block adds: the fence, the ticket, and a merge that one block of 128
// threads does alone, after every other block, where v3's combine spreads it over H
// blocks of 256 threads that PDL has already made resident. In the model's step it cost
// ~5 us a layer (667 vs 743 tokens/s), so the model keeps v3. Kept as the measured
// counter-example: fewer launches is not automatically faster.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "decode_attention_device.cuh"
#include "pdl.cuh"

namespace bielik {

namespace {

constexpr int kV4Warps = 4;
constexpr int kV4Unroll = 2;
constexpr int kV4MaxSplits = 256;  // the merge keeps a weight per (split, head) in shared memory

template <int D, int G>
__global__ void __launch_bounds__(kV4Warps * 32)
    decode_attention_v4_kernel(__nv_bfloat16* out,            // (H, D)
                               float* partial_acc,            // (splits, H, D)
                               float* partial_ml,             // (splits, H, 2)
                               int* counters,                 // (Hkv) zero between calls
                               const __nv_bfloat16* q,        // (H, D)
                               const __nv_bfloat16* k_cache,  // (Hkv, max_context, D)
                               const __nv_bfloat16* v_cache,  // (Hkv, max_context, D)
                               const int* d_length,  // (1) or nullptr: kv_len = *d_length + kv_len_arg
                               int kv_len_arg, int max_context, int num_splits, int H) {
  __shared__ bool is_last;
  __shared__ float s_weight[kV4MaxSplits][G], s_sum[kV4MaxSplits][G];
  __shared__ float s_inverse[G];
  const int split = blockIdx.x, kv_head = blockIdx.y;
  pdl_wait();  // q and the cache come from the kernel before
  pdl_allow_dependents();

  int kv_len = d_length ? *d_length + kv_len_arg : kv_len_arg;
  kv_len = min(kv_len, max_context);
  const int chunk = max((kv_len + num_splits - 1) / num_splits, kDecodeV3MinKeysPerSplit);
  const int begin = split * chunk, end = min(kv_len, begin + chunk);
  float* ml_out = partial_ml + (size_t(split) * H + kv_head * G) * 2;
  float* acc_out = partial_acc + (size_t(split) * H + kv_head * G) * D;
  if (begin >= end) {
    decode::write_empty_partial<G>(ml_out);
  } else {
    decode::pipelined_split_partial<D, G, kV4Warps, kV4Unroll>(acc_out, ml_out, q, k_cache, v_cache, kv_head,
                                                                max_context, begin, end);
  }

  // The ticket: this block's writes are visible GPU-wide before it counts itself in.
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) is_last = atomicAdd(&counters[kv_head], 1) == num_splits - 1;
  __syncthreads();
  if (!is_last) return;
  __threadfence();  // see the other blocks' partials (read through L2 below, not L1)

  // Merge, in three passes so that no load waits for another:
  //  1. every (split, head) max and sum into shared memory, all loads independent;
  //  2. per head: the global max M, each split's weight 2^(m_s - M), 1 / sum_s w_s l_s;
  //  3. thread t owns (head i, column d) pairs t, t + blockDim, ...: sum_s w_s acc_s[d],
  //     unrolled so that several splits' loads are in flight (empty splits, weight 0,
  //     are never read: their acc was never written).
  // (A first version merged online, split after split: each load waited for the
  // previous merge, 300 us per layer at 198 splits.)
  for (int index = threadIdx.x; index < G * num_splits; index += blockDim.x) {
    const int s = index / G, i = index % G;
    const float2 ml = __ldcg(reinterpret_cast<const float2*>(partial_ml + (size_t(s) * H + kv_head * G + i) * 2));
    s_weight[s][i] = ml.x;  // the max for now, the weight after pass 2
    s_sum[s][i] = ml.y;
  }
  __syncthreads();
  if (threadIdx.x < G) {
    const int i = threadIdx.x;
    float m_max = -INFINITY;
    for (int s = 0; s < num_splits; ++s) m_max = fmaxf(m_max, s_weight[s][i]);
    float l_total = 0.0f;
    for (int s = 0; s < num_splits; ++s) {
      const float m = s_weight[s][i];
      const float weight = m == -INFINITY ? 0.0f : exp2f(m - m_max);
      s_weight[s][i] = weight;
      l_total += weight * s_sum[s][i];
    }
    // l_total > 0 whenever kv_len >= 1; a zero-length device cache gives zeros, not NaN.
    s_inverse[i] = l_total > 0 ? 1.0f / l_total : 0.0f;
  }
  __syncthreads();
  for (int index = threadIdx.x; index < G * D; index += blockDim.x) {
    const int i = index / D, d = index % D;
    const float* column = partial_acc + size_t(kv_head * G + i) * D + d;
    float a = 0.0f;
#pragma unroll 8
    for (int s = 0; s < num_splits; ++s) {
      const float weight = s_weight[s][i];
      const float part = weight != 0.0f ? __ldcg(column + size_t(s) * H * D) : 0.0f;
      a += weight * part;
    }
    out[size_t(kv_head * G + i) * D + d] = __float2bfloat16(a * s_inverse[i]);
  }
  if (threadIdx.x == 0) counters[kv_head] = 0;  // ready for the next call (graph replays)
}

using Kernel = void (*)(__nv_bfloat16*, float*, float*, int*, const __nv_bfloat16*, const __nv_bfloat16*,
                        const __nv_bfloat16*, const int*, int, int, int, int);

void launch_v4(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
               const __nv_bfloat16* v_cache, const int* d_length, int kv_len_arg, int max_context, int H, int Hkv,
               int D, int num_splits, DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  if (!workspace || workspace->H < H || workspace->D != D || num_splits < 1 || num_splits > workspace->max_splits ||
      num_splits > kV4MaxSplits) {
    throw std::invalid_argument("decode attention v4: workspace missing or too small for H=" + std::to_string(H) +
                                " D=" + std::to_string(D) + " splits=" + std::to_string(num_splits));
  }
  const Kernel kernel = decode::kernel_for_group(H / Hkv, "decode attention v4", [D](auto group) -> Kernel {
    constexpr int kG = decltype(group)::value;
    return D == 128 ? decode_attention_v4_kernel<128, kG> : decode_attention_v4_kernel<64, kG>;
  });
  launch_kernel(true, kernel, dim3(num_splits, Hkv), dim3(kV4Warps * 32), 0, stream, out,
                workspace->partial_acc.data(), workspace->partial_ml.data(), workspace->split_counters.data(), q,
                k_cache, v_cache, d_length, kv_len_arg, max_context, num_splits, H);
}

}  // namespace

int decode_attention_v4_default_splits(int kv_len, int H, int Hkv, int D, int max_splits) {
  return std::min(decode_attention_v3_default_splits(kv_len, H, Hkv, D, max_splits), kV4MaxSplits);
}

void decode_attention_v4_fused_combine(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                       const __nv_bfloat16* v_cache, int kv_len, int max_context, int H, int Hkv,
                                       int D, DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  decode_attention_check_length(kv_len, max_context);
  if (!workspace) throw std::invalid_argument("decode attention v4: workspace is null");
  const int num_splits = decode_attention_v4_default_splits(kv_len, H, Hkv, D, workspace->max_splits);
  launch_v4(out, q, k_cache, v_cache, nullptr, kv_len, max_context, H, Hkv, D, num_splits, workspace, stream);
}

void decode_attention_v4_fused_combine_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                     const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                     const int* d_length, int new_tokens, int max_context, int H,
                                                     int Hkv, int D, int num_splits,
                                                     DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  if (!d_length) throw std::invalid_argument("decode attention v4: d_length is null");
  launch_v4(out, q, k_cache, v_cache, d_length, new_tokens, max_context, H, Hkv, D, num_splits, workspace, stream);
}

}  // namespace bielik
