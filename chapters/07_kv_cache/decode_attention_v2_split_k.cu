// v2: split-K "flash decoding": the keys are cut into chunks across blocks, each block
// serves a whole GQA group, and a second kernel merges the chunks.
//
// What changed from v1, and why it is faster:
//  * The grid is (splits, Hkv) instead of (H): block (s, g) streams chunk s of kv head
//    g's keys. With enough splits every SM pulls its share of HBM bandwidth, whatever
//    H is. The price is a second, tiny kernel: each block leaves a partial softmax state
//    (m, l, acc) per query head, and the combine kernel merges them (decode_attention_
//    device.cuh: states over disjoint key sets merge exactly).
//  * One block serves all G query heads of its kv head: each lane keeps G slices of q
//    and G accumulators, so a K or V vector loaded once feeds G dot products and G
//    accumulations. The cache is read exactly once per step (v1 read it G = 6 times).
//  * Each lane group loads kUnroll keys (K and V) before using any of them, so 4x more
//    bytes are in flight per thread (Little's law: bandwidth = bytes in flight / latency),
//    and the online-softmax rescale happens once per kUnroll keys instead of per key.
//
// The same kernel serves the host-length and the CUDA-graph form: kv_len comes either
// from an argument or from device memory; each block derives its chunk from kv_len, so
// a grid sized once keeps working as the cache grows, blocks past the end just mark
// their partial state empty.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "decode_attention_device.cuh"

namespace bielik {

namespace {

constexpr int kV2Warps = 4;
constexpr int kV2Unroll = 4;        // keys per lane group in flight
constexpr int kCombineThreads = 256;
constexpr int kCombineMaxSplits = 1024;  // the combine keeps one weight per split in shared memory

template <int D, int G>
__global__ void __launch_bounds__(kV2Warps * 32)
    decode_attention_v2_split_kernel(float* partial_acc,            // (splits, H, D)
                                     float* partial_ml,             // (splits, H, 2)
                                     const __nv_bfloat16* q,        // (H, D)
                                     const __nv_bfloat16* k_cache,  // (Hkv, max_context, D)
                                     const __nv_bfloat16* v_cache,  // (Hkv, max_context, D)
                                     const int* d_length,  // (1) or nullptr: kv_len = *d_length + kv_len_arg
                                     int kv_len_arg, int max_context, int num_splits, int H) {
  using Layout = decode::LaneLayout<D>;
  constexpr int kGroups = kV2Warps * Layout::kKeysPerWarp;  // lane groups in the block
  constexpr int kKeysPerIteration = kGroups * kV2Unroll;
  const int split = blockIdx.x, kv_head = blockIdx.y;
  const int lane = threadIdx.x % 32;
  const int group = threadIdx.x / 32 * Layout::kKeysPerWarp + lane / Layout::kLanesPerKey;
  const int sub = lane % Layout::kLanesPerKey;  // this lane's 8 dims: [sub*8, sub*8+8)

  // This block's keys. Every block computes the same chunk size from kv_len.
  int kv_len = d_length ? *d_length + kv_len_arg : kv_len_arg;
  kv_len = min(kv_len, max_context);  // never read past the cache, whatever *d_length says
  const int chunk = max((kv_len + num_splits - 1) / num_splits, kDecodeMinKeysPerSplit);
  const int begin = split * chunk, end = min(kv_len, begin + chunk);
  float* ml_out = partial_ml + (size_t(split) * H + kv_head * G) * 2;
  float* acc_out = partial_acc + (size_t(split) * H + kv_head * G) * D;
  if (begin >= end) {  // past the end
    decode::write_empty_partial<G>(ml_out);
    return;
  }

  // G query heads share this kv head: q_slice[i] is head (kv_head*G + i)'s slice.
  float q_slice[G][8];
  decode::load_q_slices<D, G>(q_slice, q, kv_head, sub);
  const __nv_bfloat16* keys = k_cache + size_t(kv_head) * max_context * D + sub * 8;
  const __nv_bfloat16* values = v_cache + size_t(kv_head) * max_context * D + sub * 8;
  float m[G], l[G], acc[G][8];
#pragma unroll
  for (int i = 0; i < G; ++i) {
    m[i] = -INFINITY;
    l[i] = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[i][e] = 0;
  }
  for (int base = begin; base < end; base += kKeysPerIteration) {  // uniform trip count
    // All kUnroll keys' loads first (each warp load instruction covers 512 contiguous
    // bytes), then the scores and one online-softmax update per head.
    int4 k_raw[kV2Unroll], v_raw[kV2Unroll];
    decode::load_keys<D, kV2Unroll>(k_raw, v_raw, keys, values, base, group, kGroups, end);
    decode::update_states<D, G, kV2Unroll>(m, l, acc, q_slice, k_raw, v_raw, base, group, kGroups, end);
  }
  decode::write_block_partial<D, G, kV2Warps>(acc_out, ml_out, m, l, acc);
}

// Block reduction over kCombineThreads threads (max or sum), result in every thread.
template <bool kMax>
__device__ float block_reduce(float x, float* scratch /* kCombineThreads / 32 */) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    float other = __shfl_xor_sync(0xffffffffu, x, offset);
    x = kMax ? fmaxf(x, other) : x + other;
  }
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = x;
  __syncthreads();
  x = scratch[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) x = kMax ? fmaxf(x, scratch[w]) : x + scratch[w];
  __syncthreads();  // scratch is reused by the next call
  return x;
}

// One block per query head: out[h] = sum_s w_s acc_s / sum_s w_s l_s, w_s = 2^(m_s - M).
// The partials sit in L2 (written just before), so the time goes into load latency:
// the weights are computed once into shared memory, then threads (r, c) read float4
// column c of every kRows-th split, kRows splits side by side and several in flight.
// An empty split (m = -inf) gets weight 0 and its acc, never written, is never read.
template <int D>
__global__ void __launch_bounds__(kCombineThreads)
    decode_attention_v2_combine_kernel(__nv_bfloat16* out,         // (H, D)
                                       const float* partial_acc,   // (splits, H, D)
                                       const float* partial_ml,    // (splits, H, 2)
                                       int num_splits, int H) {
  constexpr int kColumns = D / 4;  // float4 columns of one row
  constexpr int kRows = kCombineThreads / kColumns;
  __shared__ float scratch[kCombineThreads / 32];
  __shared__ float s_weight[kCombineMaxSplits];
  __shared__ float4 s_rows[kRows][kColumns];
  const int h = blockIdx.x;
  float m_max = -INFINITY;
  for (int s = threadIdx.x; s < num_splits; s += kCombineThreads) {
    m_max = fmaxf(m_max, partial_ml[(size_t(s) * H + h) * 2]);
  }
  m_max = block_reduce<true>(m_max, scratch);
  float l_part = 0;
  for (int s = threadIdx.x; s < num_splits; s += kCombineThreads) {
    const float m_s = partial_ml[(size_t(s) * H + h) * 2];
    const float weight = m_s == -INFINITY ? 0.0f : exp2f(m_s - m_max);
    s_weight[s] = weight;
    if (weight != 0) l_part += weight * partial_ml[(size_t(s) * H + h) * 2 + 1];
  }
  const float l_sum = block_reduce<false>(l_part, scratch);  // its barrier also publishes s_weight

  const int r = threadIdx.x / kColumns, c = threadIdx.x % kColumns;
  float4 a = make_float4(0, 0, 0, 0);
#pragma unroll 4
  for (int s = r; s < num_splits; s += kRows) {
    const float weight = s_weight[s];
    if (weight != 0) {
      const float4 part = *reinterpret_cast<const float4*>(partial_acc + (size_t(s) * H + h) * D + 4 * c);
      a.x += weight * part.x;
      a.y += weight * part.y;
      a.z += weight * part.z;
      a.w += weight * part.w;
    }
  }
  s_rows[r][c] = a;
  __syncthreads();
  if (r == 0) {
    for (int other = 1; other < kRows; ++other) {
      const float4 b = s_rows[other][c];
      a.x += b.x;
      a.y += b.y;
      a.z += b.z;
      a.w += b.w;
    }
    // l_sum > 0 whenever kv_len >= 1; a zero-length device cache gives zeros, not NaN.
    const float inverse = l_sum > 0 ? 1.0f / l_sum : 0.0f;
    __nv_bfloat162* destination = reinterpret_cast<__nv_bfloat162*>(out + size_t(h) * D + 4 * c);
    destination[0] = __floats2bfloat162_rn(a.x * inverse, a.y * inverse);
    destination[1] = __floats2bfloat162_rn(a.z * inverse, a.w * inverse);
  }
}

using SplitKernel = void (*)(float*, float*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                             const int*, int, int, int, int);

// The kernel instance for (D, G): the loops over heads and dims must be compile-time.
SplitKernel split_kernel(int D, int G) {
  return decode::kernel_for_group(G, "decode attention v2", [D](auto group) -> SplitKernel {
    constexpr int kG = decltype(group)::value;
    return D == 128 ? decode_attention_v2_split_kernel<128, kG> : decode_attention_v2_split_kernel<64, kG>;
  });
}

void check_workspace(const DecodeAttentionWorkspace* workspace, int H, int D, int num_splits) {
  if (!workspace || workspace->H < H || workspace->D != D || num_splits < 1 || num_splits > workspace->max_splits ||
      num_splits > kCombineMaxSplits) {
    throw std::invalid_argument("decode attention v2: workspace missing or too small for H=" + std::to_string(H) +
                                " D=" + std::to_string(D) + " splits=" + std::to_string(num_splits));
  }
}

void launch_v2(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
               const __nv_bfloat16* v_cache, const int* d_length, int kv_len_arg, int max_context, int H, int Hkv,
               int D, int num_splits, DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  check_workspace(workspace, H, D, num_splits);
  float* partial_acc = workspace->partial_acc.data();
  float* partial_ml = workspace->partial_ml.data();
  split_kernel(D, H / Hkv)<<<dim3(num_splits, Hkv), kV2Warps * 32, 0, stream>>>(
      partial_acc, partial_ml, q, k_cache, v_cache, d_length, kv_len_arg, max_context, num_splits, H);
  CUDA_CHECK_LAUNCH();
  if (D == 128) {
    decode_attention_v2_combine_kernel<128>
        <<<H, kCombineThreads, 0, stream>>>(out, partial_acc, partial_ml, num_splits, H);
  } else {
    decode_attention_v2_combine_kernel<64><<<H, kCombineThreads, 0, stream>>>(out, partial_acc, partial_ml,
                                                                               num_splits, H);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

int decode_attention_v2_default_splits(int kv_len, int H, int Hkv, int D, int max_splits) {
  decode_attention_check_shape(nullptr, nullptr, nullptr, std::max(kv_len, 1), H, Hkv, D);
  // One full wave: as many blocks as fit on all SMs at once (the split kernel's
  // occupancy is set by its registers: G accumulators of 8 floats per lane).
  int device = 0, sms = 0, blocks_per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, split_kernel(D, H / Hkv),
                                                           kV2Warps * 32, 0));
  int wave = (sms * std::max(blocks_per_sm, 1) + Hkv - 1) / Hkv;
  int by_length = (kv_len + kDecodeMinKeysPerSplit - 1) / kDecodeMinKeysPerSplit;
  return std::max(1, std::min({wave, by_length, max_splits, kCombineMaxSplits}));
}

void decode_attention_v2_split_k_with_splits(__nv_bfloat16* out, const __nv_bfloat16* q,
                                             const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                             int kv_len, int max_context, int H, int Hkv, int D, int num_splits,
                                             DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  decode_attention_check_length(kv_len, max_context);
  launch_v2(out, q, k_cache, v_cache, nullptr, kv_len, max_context, H, Hkv, D, num_splits, workspace, stream);
}

void decode_attention_v2_split_k(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                 const __nv_bfloat16* v_cache, int kv_len, int max_context, int H, int Hkv, int D,
                                 DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  decode_attention_check_length(kv_len, max_context);
  check_workspace(workspace, H, D, 1);
  int num_splits = decode_attention_v2_default_splits(kv_len, H, Hkv, D, workspace->max_splits);
  launch_v2(out, q, k_cache, v_cache, nullptr, kv_len, max_context, H, Hkv, D, num_splits, workspace, stream);
}

void decode_attention_v2_split_k_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                               const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                               const int* d_length, int new_tokens, int max_context, int H,
                                               int Hkv, int D, int num_splits,
                                               DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  if (!d_length) throw std::invalid_argument("decode attention v2: d_length is null");
  launch_v2(out, q, k_cache, v_cache, d_length, new_tokens, max_context, H, Hkv, D, num_splits, workspace,
            stream);
}

}  // namespace bielik
