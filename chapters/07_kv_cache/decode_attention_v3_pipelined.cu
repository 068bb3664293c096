// v3: v2 with the waiting taken off the critical path.
//
// v2 measured ~10 us per layer at 1k keys and ~16 us at 8k, where the bytes alone take
// 0.25 and 2 us. Its sweep over split counts says why: one block's round of 32 keys
// costs ~2.1 us, of which ~0.8 us is the trip to HBM and the rest is the block's own
// arithmetic, and the two happen one after the other. A decode step is not limited by
// bandwidth but by how many such dependent steps lie between its launch and its result.
// What changed:
//  * Software pipelining: the loads of the next round are issued before the current
//    round is computed, so the HBM trip overlaps the arithmetic instead of following it,
//    and the first round's loads are issued before q is even read.
//  * Rounds of 2 keys per lane group instead of 4 (16 keys per block for D=128): half
//    the arithmetic between two waits, the same registers (two rounds are in flight).
//  * Splits as short as 16 keys: at 1k keys 64 splits instead of 16, so a block's work
//    is one or two rounds long and four times as many SMs share it.
//  * A combine in one round of loads: each thread merges its splits' (m, l, acc) online
//    instead of first reading every max, so all its loads are independent; and it is
//    launched with programmatic dependent launch (Hopper): its blocks are scheduled while
//    the split kernel runs and wait on the GPU (griddepcontrol.wait) for its results,
//    instead of the launch starting only after the split kernel has drained. The split
//    kernel is launched the same way after whatever kernel precedes it.
//  * With the length on the GPU (the graph forms), the split kernel reads the length and
//    the first round of keys committed by earlier steps BEFORE its wait: only q and the
//    newest keys wait for the kernel before (the model's QKV projection, which writes
//    them). The HBM trip for the cache then overlaps that kernel's tail.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "decode_attention_device.cuh"
#include "pdl.cuh"

namespace bielik {

namespace {

constexpr int kV3Warps = 4;
constexpr int kV3Unroll = 2;  // keys per lane group per round
constexpr int kV3CombineThreads = 256;


template <int D, int G>
__global__ void __launch_bounds__(kV3Warps * 32)
    decode_attention_v3_split_kernel(float* partial_acc,            // (splits, H, D)
                                     float* partial_ml,             // (splits, H, 2)
                                     const __nv_bfloat16* q,        // (H, D)
                                     const __nv_bfloat16* k_cache,  // (Hkv, max_context, D)
                                     const __nv_bfloat16* v_cache,  // (Hkv, max_context, D)
                                     const int* d_length,  // (1) or nullptr: kv_len = *d_length + kv_len_arg
                                     int kv_len_arg, int max_context, int num_splits, int H, int min_keys) {
  // The next kernel (the combine, or chapter 08's O projection) only loads what no kernel
  // writes before its own wait: let it be scheduled now.
  pdl_allow_dependents();
  const int split = blockIdx.x, kv_head = blockIdx.y;
  // With the length on the GPU, the keys below *d_length were committed by earlier steps,
  // before the kernel that precedes this one started (it appends the new keys at
  // *d_length, and lets this kernel start only after its own wait): they, and the length
  // itself, are read BEFORE the wait, while that kernel still runs. q and the new keys
  // come from it and are read after. With a host-side length nothing is assumed.
  const int committed = d_length ? *d_length : 0;
  const int kv_len = min(committed + kv_len_arg, max_context);
  const int chunk = decode::split_chunk_keys(kv_len, num_splits, min_keys);
  const int begin = split * chunk, end = min(kv_len, begin + chunk);
  float* ml_out = partial_ml + (size_t(split) * H + kv_head * G) * 2;
  float* acc_out = partial_acc + (size_t(split) * H + kv_head * G) * D;
  if (begin >= end) {
    pdl_wait();  // the partials are written after the wait, like every output here
    decode::write_empty_partial<G>(ml_out);
    return;
  }

  // Rounds of 2 keys per lane group: 16 keys a round for D=128, 32 for D=64.
  decode::pipelined_split_partial<D, G, kV3Warps, kV3Unroll>(acc_out, ml_out, q, k_cache, v_cache, kv_head,
                                                            max_context, begin, end, committed,
                                                            decode::WaitForPreviousKernel{});
}

// One block per query head. Thread (r, c) merges float4 column c of splits r, r + kRows,
// ... into its own online state; its loads do not depend on each other, so they are all
// in flight at once. Then the kRows states of each column merge in shared memory.
template <int D>
__global__ void __launch_bounds__(kV3CombineThreads)
    decode_attention_v3_combine_kernel(__nv_bfloat16* out,        // (H, D)
                                       const float* partial_acc,  // (splits, H, D)
                                       const float* partial_ml,   // (splits, H, 2)
                                       int num_splits, int H) {
  constexpr int kColumns = D / 4;
  constexpr int kRows = kV3CombineThreads / kColumns;
  __shared__ float s_m[kRows], s_l[kRows];
  __shared__ float4 s_acc[kRows][kColumns];
  const int h = blockIdx.x, r = threadIdx.x / kColumns, c = threadIdx.x % kColumns;
  pdl_wait();  // the split kernel's partials are complete and visible

  float m = -INFINITY, l = 0;
  float a[4] = {0, 0, 0, 0};
#pragma unroll 8
  for (int s = r; s < num_splits; s += kRows) {
    const float2 ml = *reinterpret_cast<const float2*>(partial_ml + (size_t(s) * H + h) * 2);
    const float4 part = *reinterpret_cast<const float4*>(partial_acc + (size_t(s) * H + h) * D + 4 * c);
    if (ml.x == -INFINITY) continue;  // an empty split: its acc was never written
    const float part_acc[4] = {part.x, part.y, part.z, part.w};
    const float m_new = fmaxf(m, ml.x);
    const float old_weight = exp2f(m - m_new), new_weight = exp2f(ml.x - m_new);
    l = l * old_weight + ml.y * new_weight;
#pragma unroll
    for (int e = 0; e < 4; ++e) a[e] = a[e] * old_weight + part_acc[e] * new_weight;
    m = m_new;
  }
  if (c == 0) {
    s_m[r] = m;
    s_l[r] = l;
  }
  s_acc[r][c] = make_float4(a[0], a[1], a[2], a[3]);
  __syncthreads();
  if (r != 0) return;
  float m_max = -INFINITY;
  for (int row = 0; row < kRows; ++row) m_max = fmaxf(m_max, s_m[row]);
  float l_sum = 0, sum[4] = {0, 0, 0, 0};
  for (int row = 0; row < kRows; ++row) {
    if (s_m[row] == -INFINITY) continue;  // a row that saw only empty splits
    const float weight = exp2f(s_m[row] - m_max);
    const float4 part = s_acc[row][c];
    l_sum += s_l[row] * weight;
    sum[0] += part.x * weight;
    sum[1] += part.y * weight;
    sum[2] += part.z * weight;
    sum[3] += part.w * weight;
  }
  // l_sum > 0 whenever kv_len >= 1; a zero-length device cache gives zeros, not NaN.
  const float inverse = l_sum > 0 ? 1.0f / l_sum : 0.0f;
  __nv_bfloat162* destination = reinterpret_cast<__nv_bfloat162*>(out + size_t(h) * D + 4 * c);
  destination[0] = __floats2bfloat162_rn(sum[0] * inverse, sum[1] * inverse);
  destination[1] = __floats2bfloat162_rn(sum[2] * inverse, sum[3] * inverse);
}

using SplitKernel = void (*)(float*, float*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                             const int*, int, int, int, int, int);

SplitKernel split_kernel(int D, int G) {
  return decode::kernel_for_group(G, "decode attention v3", [D](auto group) -> SplitKernel {
    constexpr int kG = decltype(group)::value;
    return D == 128 ? decode_attention_v3_split_kernel<128, kG> : decode_attention_v3_split_kernel<64, kG>;
  });
}

void launch_v3_splits(const __nv_bfloat16* q, const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                      const int* d_length, int kv_len_arg, int max_context, int H, int Hkv, int D, int num_splits,
                      int min_keys, DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  if (!workspace || workspace->H < H || workspace->D != D || num_splits < 1 || num_splits > workspace->max_splits) {
    throw std::invalid_argument("decode attention v3: workspace missing or too small for H=" + std::to_string(H) +
                                " D=" + std::to_string(D) + " splits=" + std::to_string(num_splits));
  }
  if (min_keys < 1) {
    throw std::invalid_argument("decode attention v3: min_keys_per_split must be >= 1, got " +
                                std::to_string(min_keys));
  }
  // With PDL (a plain launch before Hopper): scheduled while the kernel before it (in the
  // model, the QKV GEMV) drains; it waits on the GPU for q and the new keys.
  launch_kernel(true, split_kernel(D, H / Hkv), dim3(num_splits, Hkv), dim3(kV3Warps * 32), 0, stream,
                workspace->partial_acc.data(), workspace->partial_ml.data(), q, k_cache, v_cache, d_length,
                kv_len_arg, max_context, num_splits, H, min_keys);
}

void launch_v3(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
               const __nv_bfloat16* v_cache, const int* d_length, int kv_len_arg, int max_context, int H, int Hkv,
               int D, int num_splits, DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  launch_v3_splits(q, k_cache, v_cache, d_length, kv_len_arg, max_context, H, Hkv, D, num_splits,
                   kDecodeV3MinKeysPerSplit, workspace, stream);
  float* partial_acc = workspace->partial_acc.data();
  float* partial_ml = workspace->partial_ml.data();
  // The combine with PDL too: scheduled while the splits run, it waits for their partials.

  auto combine = D == 128 ? decode_attention_v3_combine_kernel<128> : decode_attention_v3_combine_kernel<64>;
  launch_kernel(true, combine, dim3(H), dim3(kV3CombineThreads), 0, stream, out,
                static_cast<const float*>(partial_acc), static_cast<const float*>(partial_ml), num_splits, H);
}

}  // namespace

int decode_attention_v3_default_splits(int kv_len, int H, int Hkv, int D, int max_splits) {
  decode_attention_check_shape(nullptr, nullptr, nullptr, std::max(kv_len, 1), H, Hkv, D);
  int device = 0, sms = 0, blocks_per_sm = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, split_kernel(D, H / Hkv),
                                                           kV3Warps * 32, 0));
  int wave = (sms * std::max(blocks_per_sm, 1) + Hkv - 1) / Hkv;
  int by_length = (kv_len + kDecodeV3MinKeysPerSplit - 1) / kDecodeV3MinKeysPerSplit;
  return std::max(1, std::min({wave, by_length, max_splits}));
}

void decode_attention_v3_pipelined_with_splits(__nv_bfloat16* out, const __nv_bfloat16* q,
                                               const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                               int kv_len, int max_context, int H, int Hkv, int D, int num_splits,
                                               DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  decode_attention_check_length(kv_len, max_context);
  launch_v3(out, q, k_cache, v_cache, nullptr, kv_len, max_context, H, Hkv, D, num_splits, workspace, stream);
}

void decode_attention_v3_pipelined(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                   const __nv_bfloat16* v_cache, int kv_len, int max_context, int H, int Hkv, int D,
                                   DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  decode_attention_check_length(kv_len, max_context);
  if (!workspace) throw std::invalid_argument("decode attention v3: workspace is null");
  int num_splits = decode_attention_v3_default_splits(kv_len, H, Hkv, D, workspace->max_splits);
  launch_v3(out, q, k_cache, v_cache, nullptr, kv_len, max_context, H, Hkv, D, num_splits, workspace, stream);
}

void decode_attention_v3_splits_device_length(DecodeAttentionWorkspace* workspace, const __nv_bfloat16* q,
                                              const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                              const int* d_length, int new_tokens, int max_context, int H, int Hkv,
                                              int D, int num_splits, int min_keys_per_split, cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  if (!d_length) throw std::invalid_argument("decode attention v3 splits: d_length is null");
  launch_v3_splits(q, k_cache, v_cache, d_length, new_tokens, max_context, H, Hkv, D, num_splits, min_keys_per_split,
                   workspace, stream);
}

void decode_attention_v3_pipelined_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                 const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                 const int* d_length, int new_tokens, int max_context, int H,
                                                 int Hkv, int D, int num_splits,
                                                 DecodeAttentionWorkspace* workspace, cudaStream_t stream) {
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  if (!d_length) throw std::invalid_argument("decode attention v3: d_length is null");
  launch_v3(out, q, k_cache, v_cache, d_length, new_tokens, max_context, H, Hkv, D, num_splits, workspace, stream);
}

}  // namespace bielik
