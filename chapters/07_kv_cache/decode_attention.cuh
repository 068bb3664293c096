/// @file decode_attention.cuh
/// @brief Chapter 07: attention of ONE new token over the KV cache (the decode step).
///
/// For each query head h (kv head g = h / G, G = H / Hkv query heads per kv head):
///
///     out[h] = softmax(q[h] . K[g, 0..kv_len)^T / sqrt(D)) V[g, 0..kv_len)
///
/// The cache holds kv_len keys, the newest being this token's own (appended before the
/// attention), so this is exactly the last row of causal attention over kv_len tokens.
///
/// One token means almost no arithmetic per byte: every key and value (2 * D bf16 per
/// kv head and position) is read once and used for G dot products. The step is bound by
/// how fast the cache streams from memory; the versions differ in how much of the GPU
/// they put to work on that stream.
///
/// Pointers are device pointers, bf16 is `__nv_bfloat16`; math is fp32. The scale
/// 1/sqrt(D) is applied inside. D must be 64 or 128 (compile-time: the loops over the
/// head dimension unroll into registers), G at most 8 (std::invalid_argument otherwise).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "device_buffer.cuh"

namespace bielik {

/// Plain C++ reference: fp32, two-pass softmax (max, then exp and sum).
/// @param out     (H, D) written
/// @param q       (H, D) the new token's queries (after RoPE)
/// @param k_cache (Hkv, max_context, D) one layer's keys; positions 0..kv_len-1 are read
/// @param v_cache (Hkv, max_context, D)
/// Throws std::invalid_argument unless 1 <= kv_len <= max_context and H % Hkv == 0.
void decode_attention_cpu(float* out, const float* q, const float* k_cache, const float* v_cache, int kv_len,
                          int max_context, int H, int Hkv, int D);

/// The checks every GPU launcher makes before launching; throws std::invalid_argument
/// naming the problem: D not 64 or 128, H not a multiple of Hkv, G = H / Hkv above 8,
/// max_context < 1, or q / k_cache / v_cache not 16-byte aligned.
void decode_attention_check_shape(const void* q, const void* k_cache, const void* v_cache, int max_context, int H,
                                  int Hkv, int D);
/// ... and for a length given on the host: 1 <= kv_len <= max_context.
void decode_attention_check_length(int kv_len, int max_context);

/// Scratch for split-K versions: each split's partial softmax state for every head.
struct DecodeAttentionWorkspace {
  /// Room for up to `max_splits` splits of H heads of D values.
  DecodeAttentionWorkspace(int H, int D, int max_splits)
      : H(H), D(D), max_splits(max_splits), partial_acc(size_t(max_splits) * H * D),
        partial_ml(size_t(max_splits) * H * 2), split_counters(size_t(H)) {
    split_counters.fill_bytes(0);
  }
  int H, D, max_splits;
  DeviceBuffer<float> partial_acc;  ///< (max_splits, H, D) sum_j p_j v_j, unnormalized
  DeviceBuffer<float> partial_ml;   ///< (max_splits, H, 2) running max m (log2 units) and sum l
  DeviceBuffer<int> split_counters; ///< (Hkv <= H) v4: splits done per kv head, 0 between calls
};

/// Splits v2 uses when called with a host-side length: one full wave of blocks
/// (Hkv * splits = SMs * resident blocks per SM, from the kernel's occupancy), but no
/// split shorter than kDecodeMinKeysPerSplit keys, and at most min(max_splits, 1024).
int decode_attention_v2_default_splits(int kv_len, int H, int Hkv, int D, int max_splits);

/// Keys a v2 block handles at least: below this the per-block fixed costs (the
/// in-block merge, writing a partial) outweigh the keys it streams.
constexpr int kDecodeMinKeysPerSplit = 64;
/// The same for v3, whose blocks stream a short chunk faster (one or two rounds).
constexpr int kDecodeV3MinKeysPerSplit = 16;

/// Splits v3 uses for a host-side length: as v2, with kDecodeV3MinKeysPerSplit.
int decode_attention_v3_default_splits(int kv_len, int H, int Hkv, int D, int max_splits);

/// v1: one block per query head, looping over every key with an online softmax.
/// Simple and correct; it uses only H blocks (12 of 132 SMs for Bielik) and reads each
/// key G times (once per query head of the group). `workspace` is unused (may be null).
/// @param out     (H, D) device, written
/// @param q       (H, D) device
/// @param k_cache (Hkv, max_context, D) device, one layer
/// @param v_cache (Hkv, max_context, D) device
void decode_attention_v1_block_per_head(__nv_bfloat16* out, const __nv_bfloat16* q,
                                        const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, int kv_len,
                                        int max_context, int H, int Hkv, int D,
                                        DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);

/// v2: split-K "flash decoding". Grid (splits, Hkv): each block streams one chunk of one
/// kv head's keys ONCE and keeps partial softmax states for all G query heads of the
/// group; a combine kernel merges the splits. Splits from
/// decode_attention_v2_default_splits(kv_len, H, Hkv, D, workspace->max_splits). Same parameters
/// as v1; `workspace` must be sized for (H, D).
void decode_attention_v2_split_k(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                 const __nv_bfloat16* v_cache, int kv_len, int max_context, int H, int Hkv, int D,
                                 DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);

/// v2 with the number of splits given (the benchmark sweeps it). 1 <= num_splits <=
/// min(workspace->max_splits, 1024) (the combine keeps a weight per split in shared memory).
void decode_attention_v2_split_k_with_splits(__nv_bfloat16* out, const __nv_bfloat16* q,
                                             const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                             int kv_len, int max_context, int H, int Hkv, int D, int num_splits,
                                             DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);

/// v2 for CUDA graphs: the number of keys is read on the GPU, kv_len = *d_length +
/// new_tokens (the committed length plus the tokens appended this step, 1 when
/// decoding), clamped to max_context. The grid is fixed at (num_splits, Hkv) whatever
/// the length, so one captured launch serves every step; each block derives its chunk
/// from kv_len and blocks past the end only mark their partial empty and exit.
/// A good num_splits: decode_attention_v2_default_splits(max_context, H, Hkv, D, max_splits).
/// @param d_length (1) device, e.g. KvCache::device_length()
void decode_attention_v2_split_k_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                               const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                               const int* d_length, int new_tokens, int max_context, int H,
                                               int Hkv, int D, int num_splits,
                                               DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);

/// v3: v2 with software-pipelined loads (the next round's K/V in flight while the
/// current one is computed), splits down to 16 keys, a one-round combine launched with
/// programmatic dependent launch on Hopper. Splits from
/// decode_attention_v3_default_splits. Same parameters as v1.
void decode_attention_v3_pipelined(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                   const __nv_bfloat16* v_cache, int kv_len, int max_context, int H, int Hkv, int D,
                                   DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);
/// v3 with the number of splits given. 1 <= num_splits <= workspace->max_splits.
void decode_attention_v3_pipelined_with_splits(__nv_bfloat16* out, const __nv_bfloat16* q,
                                               const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                               int kv_len, int max_context, int H, int Hkv, int D, int num_splits,
                                               DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);
/// v3 for CUDA graphs, as decode_attention_v2_split_k_device_length. Its split kernel
/// reads *d_length and the keys below it before waiting on the kernel launched just
/// before it (see decode_attention_v3_splits_device_length for what that kernel may write).
void decode_attention_v3_pipelined_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                 const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                 const int* d_length, int new_tokens, int max_context, int H,
                                                 int Hkv, int D, int num_splits,
                                                 DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);

/// v3's split kernel alone, for a caller that merges the partials itself (chapter 08
/// merges them while its O projection stages its input, which saves the combine's
/// launch). Writes workspace->partial_acc / partial_ml for splits 0 .. num_splits - 1:
/// kv_len = min(*d_length + new_tokens, max_context) keys cut into chunks of at least
/// min_keys_per_split keys (decode::split_chunk_keys); the first
/// decode::splits_with_keys(kv_len, num_splits, min_keys_per_split) splits hold keys,
/// the others are marked empty. Merge with decode::merge_split_partials_8
/// (decode_attention_device.cuh).
/// Like the v3 device-length form, the split kernel reads *d_length and the keys below
/// it BEFORE waiting on the kernel launched just before it (PDL). That is safe only if
/// no kernel that can still run when it starts writes the length or those keys. The
/// kernel just before may write q and the keys from *d_length on (chapter 08's QKV
/// projection appends them), not the length or older keys. If that kernel lets its
/// dependents start only after its own griddepcontrol.wait, everything before it is
/// done by then (the append and length kernels, launched without PDL, let them start
/// only at their end; a kernel launched without PDL is always safe).
/// Not every kernel does, on purpose: v3's split kernel, v5 and v6 (unless
/// allow_dependents_after_inputs) call pdl_allow_dependents() at their very start,
/// before their own wait, so that the next kernel's weight loads overlap the attention;
/// chapter 08 has options that do the same for its GEMVs (qkv_allows_attention_early,
/// o_allows_gate_up_early). The kernel after such a kernel may run beside the one before
/// it. Here that is safe because none of those neighbours writes the length or committed
/// keys: after an attention comes its combine or chapter 08's O projection, which read
/// only weights before their wait; with qkv_allows_attention_early the attention runs
/// beside the previous layer's down projection, which writes the residual stream only;
/// and the benchmark's chains of back-to-back attention launches read only what was
/// written before the chain. Putting a kernel that writes the length or old keys right
/// before one of these early-trigger kernels, with an early reader right after, would
/// break it.
void decode_attention_v3_splits_device_length(DecodeAttentionWorkspace* workspace, const __nv_bfloat16* q,
                                              const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                              const int* d_length, int new_tokens, int max_context, int H, int Hkv,
                                              int D, int num_splits, int min_keys_per_split,
                                              cudaStream_t stream = 0);

/// v4: v3 in one kernel: the last split block of each kv head merges the splits (a
/// counter per kv head in the workspace), launched with PDL. Splits from
/// decode_attention_v4_default_splits. Same parameters as v1. One workspace must not
/// serve two v4 calls at the same time.
void decode_attention_v4_fused_combine(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                       const __nv_bfloat16* v_cache, int kv_len, int max_context, int H, int Hkv,
                                       int D, DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);
/// v3's splits, at most 256 (v4's merge keeps a weight per split in shared memory).
int decode_attention_v4_default_splits(int kv_len, int H, int Hkv, int D, int max_splits);
/// v4 for CUDA graphs, as decode_attention_v2_split_k_device_length; num_splits <= 256.
void decode_attention_v4_fused_combine_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                     const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                     const int* d_length, int new_tokens, int max_context, int H,
                                                     int Hkv, int D, int num_splits,
                                                     DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);

/// v5 (sm_90+): v3's splits and combine in one kernel. The splits of each kv head form a
/// thread block cluster (16 blocks where the GPU allows it, else 8); each block leaves
/// its partial state in its own shared memory, and after the cluster's barrier the
/// blocks merge them by reading each other's shared memory (DSMEM): no partial goes
/// through global memory and there is no second kernel. Launched with PDL; reads the
/// length and the committed keys before its wait, like v3. Same parameters as v1;
/// `workspace` is unused (may be null). Before sm_90 it runs v3 (which needs the workspace).
void decode_attention_v5_cluster(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                 const __nv_bfloat16* v_cache, int kv_len, int max_context, int H, int Hkv, int D,
                                 DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0);
/// The cluster size v5 uses (16 or 8; before sm_90, v3's default splits).
int decode_attention_v5_default_splits(int kv_len, int H, int Hkv, int D, int max_splits);
/// v5 for CUDA graphs, as decode_attention_v3_pipelined_device_length; num_splits is the
/// cluster size, clamped to the largest the GPU allows (so any count >= 1 is accepted).
void decode_attention_v5_cluster_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                               const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                               const int* d_length, int new_tokens, int max_context, int H, int Hkv,
                                               int D, int num_splits, DecodeAttentionWorkspace* workspace,
                                               cudaStream_t stream = 0);

/// v6: v5 with one cluster per query head (H clusters of num_splits blocks), each block
/// running v5's device code for a single head over the keys of kv head h / (H / Hkv):
/// every key is read H / Hkv times (from L2 after the first), for a sixth of the serial
/// work per block at Bielik's G = 6. Same arguments and same outputs as v5's
/// device-length form; before sm_90 it runs v3. Chapter 08's decode step uses it (the
/// fastest measured there and alone, at every length; see the file).
void decode_attention_v6_per_head_device_length(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                const int* d_length, int new_tokens, int max_context, int H, int Hkv,
                                                int D, int num_splits, DecodeAttentionWorkspace* workspace,
                                                cudaStream_t stream = 0);
/// The cluster size v6 uses (16 or 8; before sm_90, v3's default splits).
int decode_attention_v6_default_splits(int kv_len, int H, int Hkv, int D, int max_splits);

/// How v6's splits hand their partial states over (see decode_attention_v6_per_head.cu):
enum class V6Handover {
  kPull,          ///< v5's way: a cluster barrier, every block reads every partial, a second barrier
  kPushBarrier,   ///< each split stores its partial into block 0, then the cluster barrier
  kPushMbarrier,  ///< each split stores with st.async, counted on an mbarrier of block 0
};
inline constexpr V6Handover kV6DefaultHandover = V6Handover::kPushMbarrier;
namespace decode {
/// Where a v5 or v6 block records its timeline (decode_attention_v5_cluster_device_length_timed,
/// decode_attention_v6_per_head_device_length_timed):
/// min / max pairs of %globaltimer over the blocks, 2 * kAttentionTimelineEvents values.
enum AttentionTimelineEvent {
  kAttentionStart = 0,          ///< the block starts
  kAttentionWaitReturned = 1,   ///< its PDL wait returned (q and the newest keys are ready)
  kAttentionInputsArrived = 2,  ///< q and its first round of keys are in registers (blocks with keys)
  kAttentionStatesUpdated = 3,  ///< its keys are in its lanes' softmax states (blocks with keys)
  kAttentionWarpsMerged = 4,    ///< its warps' states are in shared memory, past the barrier (blocks with keys)
  kAttentionPartialDone = 5,    ///< its split's partial is in shared memory (before the cluster barrier)
  kAttentionStored = 6,         ///< its share of the merged outputs is stored
  kAttentionEnd = 7,            ///< past the last cluster barrier
  kAttentionTimelineEvents = 8
};
}  // namespace decode

/// The same with a timeline (measurement only; chapter 08's bench_model --timeline):
/// `timeline` holds 2 * kAttentionTimelineEvents values, min / max pairs of %globaltimer
/// (ns) over the blocks at each decode::AttentionTimelineEvent (start, wait returned,
/// inputs arrived, states updated, warps merged, partial done, outputs stored, end), the
/// min slots preset to ULLONG_MAX and the max slots to 0; nullptr: none. The three events
/// inside a split are stamped only by blocks whose split holds keys.
/// Before sm_90 (v3 runs instead) nothing is recorded.
void decode_attention_v5_cluster_device_length_timed(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                     const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                     const int* d_length, int new_tokens, int max_context, int H,
                                                     int Hkv, int D, int num_splits,
                                                     DecodeAttentionWorkspace* workspace, cudaStream_t stream,
                                                     unsigned long long* timeline);
/// v6 with the same timeline (one block per split and query head records), and any of
/// its hand-overs. allow_dependents_after_inputs (the push hand-overs only): the next
/// kernel may be scheduled once every block's q and first keys have arrived, not at once.
/// inputs_signal (the push hand-overs only; two zeroed words, one pair per layer): once
/// every block has its inputs, the count is reset and the tag set to *d_length + 1, a hint
/// for the kernels after it (decode::WaitForPreviousKernel, chapter 08's
/// DecodeGemvParams::hold). Never read by the attention itself. signal_at_end: each block
/// counts itself in at its end instead (its partial handed on, or the outputs stored).
void decode_attention_v6_per_head_device_length_timed(__nv_bfloat16* out, const __nv_bfloat16* q,
                                                      const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                      const int* d_length, int new_tokens, int max_context, int H,
                                                      int Hkv, int D, int num_splits,
                                                      DecodeAttentionWorkspace* workspace, cudaStream_t stream,
                                                      unsigned long long* timeline,
                                                      V6Handover handover = kV6DefaultHandover,
                                                      bool allow_dependents_after_inputs = false,
                                                      unsigned* inputs_signal = nullptr,
                                                      bool signal_at_end = false);
/// v6 with one of its hand-overs (the same outputs, bit for bit, whichever), in the
/// device-length launcher's signature, for the tests and the benchmark.
template <V6Handover kHandover>
void decode_attention_v6_device_length_with(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                            const __nv_bfloat16* v_cache, const int* d_length, int new_tokens,
                                            int max_context, int H, int Hkv, int D, int num_splits,
                                            DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0) {
  decode_attention_v6_per_head_device_length_timed(out, q, k_cache, v_cache, d_length, new_tokens, max_context, H,
                                                   Hkv, D, num_splits, workspace, stream, nullptr, kHandover);
}

/// Every GPU version, in order, so tests and the benchmark loop over the same list.
using DecodeAttentionLauncher = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                         const __nv_bfloat16*, int, int, int, int, int,
                                         DecodeAttentionWorkspace*, cudaStream_t);
struct DecodeAttentionVersion {
  const char* name;
  DecodeAttentionLauncher launch;
};
inline constexpr DecodeAttentionVersion kDecodeAttentionVersions[] = {
    {"v1_block_per_head", decode_attention_v1_block_per_head},
    {"v2_split_k", decode_attention_v2_split_k},
    {"v3_pipelined", decode_attention_v3_pipelined},
    {"v4_fused_combine", decode_attention_v4_fused_combine},
    {"v5_cluster", decode_attention_v5_cluster},
};

/// The graph forms (length read on the GPU), with the split count each would pick.
using DecodeAttentionDeviceLengthLauncher = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                                     const __nv_bfloat16*, const int*, int, int, int, int, int, int,
                                                     DecodeAttentionWorkspace*, cudaStream_t);
struct DecodeAttentionDeviceLengthVersion {
  const char* name;
  DecodeAttentionDeviceLengthLauncher launch;
  int (*default_splits)(int kv_len, int H, int Hkv, int D, int max_splits);
};
inline constexpr DecodeAttentionDeviceLengthVersion kDecodeAttentionDeviceLengthVersions[] = {
    {"v2_split_k_device_length", decode_attention_v2_split_k_device_length, decode_attention_v2_default_splits},
    {"v3_pipelined_device_length", decode_attention_v3_pipelined_device_length,
     decode_attention_v3_default_splits},
    {"v4_fused_combine_device_length", decode_attention_v4_fused_combine_device_length,
     decode_attention_v4_default_splits},
    {"v5_cluster_device_length", decode_attention_v5_cluster_device_length, decode_attention_v5_default_splits},
    {"v6_per_head_device_length", decode_attention_v6_per_head_device_length, decode_attention_v6_default_splits},
    {"v6_push_barrier_device_length", decode_attention_v6_device_length_with<V6Handover::kPushBarrier>,
     decode_attention_v6_default_splits},
    {"v6_pull_device_length", decode_attention_v6_device_length_with<V6Handover::kPull>,
     decode_attention_v6_default_splits},
};

/// This chapter's default for a host-side length: v2, the fastest measured with its
/// default splits at 4k and 8k keys (v3 and v5 win at 1k; see the README). Chapter 08's
/// decode graph calls decode_attention_v6_per_head_device_length (device-side length,
/// measured fastest in the model's step).
inline void decode_attention_forward(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k_cache,
                                     const __nv_bfloat16* v_cache, int kv_len, int max_context, int H, int Hkv,
                                     int D, DecodeAttentionWorkspace* workspace, cudaStream_t stream = 0) {
  decode_attention_v2_split_k(out, q, k_cache, v_cache, kv_len, max_context, H, Hkv, D, workspace, stream);
}

}  // namespace bielik
