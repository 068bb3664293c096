// v6: v5 with one cluster per QUERY head instead of one per kv head.
//
// v5's block holds the G query heads of its kv head in registers and runs every step
// for all of them: the scores, the online softmax, the merge of its warps. With Bielik's
// G = 6 that is six times the instructions of one head, done one after the other by a
// block's 8 warps, and at chat lengths a block has only 16 keys to share between them.
// So the block is latency-bound, not memory-bound. Chapter 08's timeline (2026-12-01,
// ~85 keys, clusters of 8) shows v5's splits taking 3-3.5 us from their PDL wait to their
// partial, about 1 us of it in the softmax update of 16 keys, and running the same code
// once before the wait (to have it in the instruction cache) did not shorten that.
//
// v6 spends memory to cut that path: grid.y runs over the H query heads, and the block
// for head h reads the keys and values of kv head h / G. Every key is then read G times,
// from L2 after the first, G x 2 x D x 2 bytes per key (6 x 512 B for Bielik: 43 KB per
// layer at 85 keys, 3 MB at 1k keys, per read through L2). Each block runs v5's split
// code with G = 1: a sixth of the work, and a smaller kernel (less code to fetch).
//
// The splits then meet differently: each pushes its partial into block 0's shared
// memory and leaves, and block 0 alone merges (decode::cluster_attention_push), instead
// of every block pulling every partial and the cluster meeting twice. By default the
// pushes are st.async stores that count their bytes on an mbarrier in block 0, so block
// 0 waits for the data itself rather than for a barrier of every thread. The arithmetic
// is v5's, step for step and in the same order, so the outputs are the same.
//
// The grid is H clusters of `splits` blocks (Bielik, clusters of 8: 96 blocks, against
// v5's 16). Measured on the H200 (bench_kv_cache, one layer alone at 1k / 4k / 8k keys,
// the default clusters of 16; docs/gpu_runs.md): the first v6, pulled merge, 8.3 / 12.4 /
// 17.4 us against v5's 10.5 / 17.1 / 25.5 (2026-12-01 20:37 UTC); with the mbarrier push
// 7.9 / 11.8 / 16.9 against the same v5 numbers (22:14 UTC, the README's table). The
// extra reads of the same keys come from L2 and cost less than the serial work they
// split up. Chapter 08's decode step uses v6: 908 against 891 tokens/s, 802 against 715
// after a 2048-token prompt (pulled merge, twelfth session); with the mbarrier push, 938
// (below).
#include <algorithm>
#include <stdexcept>

#include "cuda_check.cuh"
#include "decode_attention.cuh"
#include "decode_attention_cluster.cuh"
#include "decode_attention_device.cuh"
#include "pdl.cuh"

#include <cooperative_groups.h>

namespace bielik {

namespace {

namespace cg = cooperative_groups;

// Warps per block. v5's 8 (kClusterWarps) are 16 lane groups of one key each for
// D = 128, two rounds in flight: 32 key slots, while a split at chat lengths holds 16
// keys (kDecodeV3MinKeysPerSplit). So each group updates its state with one key, and
// the merge of the warps' states then waits on all 8. With 4, each group takes two keys
// in one update and the merge has half the states, but long splits take twice the
// rounds. Measured in chapter 08's step (H200, 2026-12-01): 4 warps 893 against 900
// tokens/s, and 711 against 794 after a 2048-token prompt. So 8.
constexpr int kV6Warps = decode::kClusterWarps;

// How the splits' partials meet (V6Handover, decode_attention.cuh): pulled by every block
// from every other after a cluster barrier, as v5 does; or pushed into block 0, which
// merges, signalled by the cluster barrier or by an mbarrier counting the pushed bytes
// (decode::cluster_attention_push). Measured on the H200 (2026-12-01 21:56 UTC):
// * chapter 08's decode step: mbarrier 938 / 938, barrier 927 / 927, pull 898 / 899
//   tokens/s (two rounds); 813 against 806 after a 2048-token prompt. On its timeline the
//   last partial -> block 0's stores went from 1.37 to 0.82 us, and O passed its wait
//   0.54 us sooner.
// * bench_kv_cache, one layer alone at 1k / 4k / 8k keys: mbarrier 7.8 / 11.7 / 16.6 us,
//   barrier 8.3 / 12.0 / 16.9, pull 8.6 / 12.6 / 17.5. In its chain of 32 launches the
//   pull still wins from 4k keys (271.8 against 281.6 us at 4k, 415.0 against 446.8 at
//   8k; at 1k the mbarrier, 150.5 against 161.7): the README's exercise 7 asks why.
// The default (kV6DefaultHandover) is the mbarrier.
//
// kTimed: the timeline stamps are compiled in (the launcher picks this instance when a
// timeline is given). Tested at run time in every instance instead, they cost chapter
// 08's default decode step a measurable share (its DECODE_LOG.md, twenty-ninth session).
template <int D, V6Handover kHandover, bool kTimed>
__global__ void __launch_bounds__(kV6Warps * 32)
    decode_attention_v6_kernel(__nv_bfloat16* out,            // (H, D)
                               const __nv_bfloat16* q,        // (H, D)
                               const __nv_bfloat16* k_cache,  // (Hkv, max_context, D)
                               const __nv_bfloat16* v_cache,  // (Hkv, max_context, D)
                               const int* d_length,  // (1): kv_len = *d_length + kv_len_arg
                               int kv_len_arg, int max_context,
                               int group,  // G = H / Hkv: query heads per kv head
                               unsigned long long* timeline,  // (2 * kAttentionTimelineEvents) or nullptr
                               bool allow_dependents_after_inputs,
                               unsigned* inputs_signal,  // (2): count, tag (pushed hand-overs), or nullptr
                               bool signal_at_end) {     // inputs_signal counts blocks at their end instead
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (!kTimed) timeline = nullptr;  // a compile-time null: every stamp folds away
  timeline_fold(timeline, decode::kAttentionStart);
  cg::cluster_group cluster = cg::this_cluster();
  const int head = blockIdx.y, kv_head = head / group;
  // As v5: the next kernel only preloads weights, so it may be scheduled now (or, with
  // the push and allow_dependents_after_inputs, once this block's inputs are in).
  if (!allow_dependents_after_inputs || kHandover == V6Handover::kPull) pdl_allow_dependents();
  // The cluster code serves "the one query head of kv head k" and reads it at q + k * D.
  // This block's head is `head`, so it is given q shifted by head - k rows (never before
  // q: k <= head).
  const __nv_bfloat16* q_of_head = q + size_t(head - kv_head) * D;
  __nv_bfloat16* head_out = out + size_t(head) * D;
  auto store = [&](int output, float value) { head_out[output] = __float2bfloat16(value); };
  if constexpr (kHandover != V6Handover::kPull) {
    constexpr decode::PushSignal kSignal = kHandover == V6Handover::kPushMbarrier
                                               ? decode::PushSignal::kMbarrierBytes
                                               : decode::PushSignal::kClusterBarrier;
    __shared__ decode::ClusterPartial<D, 1> inbox[decode::kClusterMaxSize];  // block 0's: every split's partial
    __shared__ uint64_t inbox_full;  // block 0's, with kMbarrierBytes: counts the pushed bytes in
    decode::cluster_attention_push<D, kV6Warps, kSignal>(cluster, inbox, &inbox_full, q_of_head, k_cache, v_cache,
                                                         kv_head, d_length, kv_len_arg, max_context, store, timeline,
                                                         allow_dependents_after_inputs,
                                                         signal_at_end ? nullptr : inputs_signal);
  } else {
    __shared__ decode::ClusterPartial<D, 1> partial;  // this block's split of its head
    decode::cluster_attention<D, 1, kV6Warps>(cluster, partial, q_of_head, k_cache, v_cache, kv_head, d_length,
                                              kv_len_arg, max_context, store, timeline);
    cluster.sync();  // no block leaves while another may still read its shared memory
  }
  if (signal_at_end) {  // this block's share is handed on (pushers) or stored (block 0)
    const int committed = d_length ? *d_length : 0;
    decode::count_block_in(inputs_signal, committed);
  }
  timeline_fold(timeline, decode::kAttentionEnd);
#else
  __trap();  // never launched before sm_90 (the launcher runs v3 there)
#endif
}

using V6Kernel = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                          const int*, int, int, int, unsigned long long*, bool, unsigned*, bool);

template <V6Handover kHandover, bool kTimed>
V6Kernel v6_kernel_with(int D) {
  return D == 128 ? decode_attention_v6_kernel<128, kHandover, kTimed>
                  : decode_attention_v6_kernel<64, kHandover, kTimed>;
}

template <V6Handover kHandover>
V6Kernel v6_kernel_with(int D, bool timed) {
  return timed ? v6_kernel_with<kHandover, true>(D) : v6_kernel_with<kHandover, false>(D);
}

V6Kernel v6_kernel(int D, V6Handover handover = kV6DefaultHandover, bool timed = false) {
  switch (handover) {
    case V6Handover::kPull: return v6_kernel_with<V6Handover::kPull>(D, timed);
    case V6Handover::kPushBarrier: return v6_kernel_with<V6Handover::kPushBarrier>(D, timed);
    case V6Handover::kPushMbarrier: break;
  }
  return v6_kernel_with<V6Handover::kPushMbarrier>(D, timed);
}

}  // namespace

int decode_attention_v6_default_splits(int kv_len, int H, int Hkv, int D, int max_splits) {
  decode_attention_check_shape(nullptr, nullptr, nullptr, std::max(kv_len, 1), H, Hkv, D);
  if (!device_is_sm90_or_newer()) return decode_attention_v3_default_splits(kv_len, H, Hkv, D, max_splits);
  return decode::largest_cluster_size(v6_kernel(D), H, kV6Warps);
}

void decode_attention_v6_per_head_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                const int* d_length, int new_tokens, int max_context, int H, int Hkv,
                                                int D, int num_splits, DecodeAttentionWorkspace* workspace,
                                                cudaStream_t stream) {
  decode_attention_v6_per_head_device_length_timed(out, q, k_cache, v_cache, d_length, new_tokens, max_context, H,
                                                   Hkv, D, num_splits, workspace, stream, nullptr);
}

void decode_attention_v6_per_head_device_length_timed(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                      const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                      const int* d_length, int new_tokens, int max_context, int H,
                                                      int Hkv, int D, int num_splits,
                                                      DecodeAttentionWorkspace* workspace, cudaStream_t stream,
                                                      unsigned long long* timeline, V6Handover handover,
                                                      bool allow_dependents_after_inputs, unsigned* inputs_signal,
                                                      bool signal_at_end) {
  if (!device_is_sm90_or_newer()) {
    decode_attention_v3_pipelined_device_length(out, q, k_cache, v_cache, d_length, new_tokens, max_context, H, Hkv,
                                                D, num_splits, workspace, stream);
    return;
  }
  decode_attention_check_shape(q, k_cache, v_cache, max_context, H, Hkv, D);
  if (!d_length) throw std::invalid_argument("decode attention v6: d_length is null");
  if (num_splits < 1) throw std::invalid_argument("decode attention v6: num_splits must be >= 1");
  if (inputs_signal && handover == V6Handover::kPull && !signal_at_end) {
    throw std::invalid_argument("decode attention v6: the pulled hand-over signals only at its end (signal_at_end)");
  }
  const V6Kernel kernel = v6_kernel(D, handover, timeline != nullptr);
  const int cluster = std::clamp(num_splits, 1, decode::largest_cluster_size(kernel, H, kV6Warps));
  // With PDL: the kernel reads the length and the committed keys before its wait.
  const ClusterLaunch launch(dim3(cluster, H), kV6Warps * 32, cluster, 0, stream, true);
  CUDA_CHECK(cudaLaunchKernelEx(&launch.config, kernel, out, q, k_cache, v_cache, d_length, new_tokens, max_context,
                                H / Hkv, timeline, allow_dependents_after_inputs, inputs_signal,
                                inputs_signal != nullptr && signal_at_end));
}

}  // namespace bielik
