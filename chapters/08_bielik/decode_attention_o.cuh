/// @file decode_attention_o.cuh
/// @brief Chapter 08: the decode step's attention AND its O projection in one kernel of
/// thread block clusters (sm_90).
///
/// Why. In the decode step the attention and the O projection are two short kernels in
/// a chain (QKV -> attention -> O -> gate/up) that no weight stream overlaps. Leaving
/// the O kernel out of every layer saved 7.7 us a layer on the H200 (bench_model's
/// marginal-cost table) for a projection whose 4.7 MB need ~1.1 us of bandwidth: its
/// cost is the kernel boundary and the gate/up kernel it keeps from starting, not its
/// bytes.
///
/// How. Chapter 07's v5 runs the attention of kv head g as a cluster of S blocks, and
/// the cluster ends up holding the G x D attention output of g's query heads. That is
/// everything the O projection needs from g: W_o's columns [g G D, (g + 1) G D) times
/// that vector is g's share of every O output. So:
///  * before its PDL wait, while the QKV projection still runs, block r of g's cluster
///    asks the bulk-copy engine for its rows of that column band, rows
///    [r C / S, (r + 1) C / S) (147 KB of shared memory for Bielik with S = 16);
///  * it runs v5's attention (decode_attention_cluster.cuh), and each merged output
///    value is written straight into the shared memory of EVERY block of the cluster
///    (distributed shared memory), so that after one cluster barrier each block holds
///    the group's whole attention output, and no block reads another's memory again;
///  * it multiplies its W_o rows by that vector and writes g's partial sums.
/// The partials of the Hkv groups, partials[g][n], add up to the O projection (+ its bias,
/// added to group 0's). The gate/up GEMV adds them into its input as it stages it
/// (GemvInput::kRmsNormAddPartials), the down GEMV into the residual stream: no O kernel,
/// and gate/up is scheduled as soon as this kernel starts, so its weights stream during
/// the attention.
///
/// Measured on the H200 (bench_attention_o, bench_model; chapter 08's DECODE_LOG.md, seventh
/// session): the fusion's own mechanics cost ~0.6 us, but W_o's 4.7 MB through the 32
/// SMs of two clusters of 16 add ~3.4 us (one SM's path from memory is the limit). With
/// 4 replicas of clusters of 8 (64 blocks, 74 KB of W_o rows each) the pair beats v5 + the
/// O GEMV by 0.4 us alone and ties it behind a QKV GEMV, yet the model decodes at 774
/// tokens/s against 859: it is kept as an option, off by default.
///
/// Numerics: the attention output is rounded to bf16 (as chapter 07 stores it), each
/// partial is an fp32 sum, the O output bf16(sum_g partials[g][n]) is rounded by its
/// consumer. Only the summation order differs from the unfused GEMV.
#pragma once

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace bielik {

/// What both fused forms below read: this token's queries, one layer's cache, W_o and
/// b_o, and the shapes. All pointers are device pointers.
struct AttentionOInputs {
  const __nv_bfloat16* q = nullptr;       ///< (H, D) this token's rotated queries
  const __nv_bfloat16* k_cache = nullptr; ///< (Hkv, max_context, D) one layer
  const __nv_bfloat16* v_cache = nullptr; ///< (Hkv, max_context, D) one layer
  const int* d_length = nullptr;          ///< (1) committed tokens: kv_len = *d_length + new_tokens
  int new_tokens = 1;
  int max_context = 0;
  const __nv_bfloat16* w_o = nullptr;     ///< (C, H D), HuggingFace's o_proj.weight
  const __nv_bfloat16* b_o = nullptr;     ///< (C) or nullptr
  int C = 0, H = 0, Hkv = 0, D = 0;

  /// Every pointer the kernels need is set (b_o may be null), W_o is 16-byte aligned,
  /// max_context >= 1 and new_tokens >= 0.
  bool complete() const {
    return q && k_cache && v_cache && d_length && w_o && max_context >= 1 && new_tokens >= 0 &&
           reinterpret_cast<uintptr_t>(w_o) % 16 == 0;
  }
};

/// The fused kernel's arguments: the inputs, and where its partial sums go.
struct AttentionOParams : AttentionOInputs {
  float* partials = nullptr;  ///< (Hkv, C) written: kv group g's share of the O projection
};

/// The cluster size (attention splits per kv head) decode_attention_o would use for this
/// shape on this GPU when asked for `requested` (0: the largest, 16 where the GPU allows
/// that non-portable size) with `replicas` clusters per kv head: the largest size <=
/// requested whose blocks' shared memory (their W_o rows, C / (size x replicas) of them,
/// plus the attention's) fits and whose cluster the GPU can schedule. 0 when there is
/// none, or before sm_90: the caller then runs the attention and the O projection as
/// separate kernels.
int decode_attention_o_cluster_size(int C, int H, int Hkv, int D, int requested = 0, int replicas = 1);

/// The attention of one new token over the cache and the O projection of its output, as
/// Hkv partial sums (see the file comment). `cluster`: blocks per cluster, as returned by
/// decode_attention_o_cluster_size. `replicas`: clusters per kv head, each computing the
/// same attention and projecting 1 / replicas of the O rows: W_o's 4.7 MB are then
/// loaded by replicas x 32 SMs instead of 32 (one SM's port is the limit:
/// bench_attention_o). Throws std::invalid_argument for a missing pointer, a shape the
/// kernel lacks (D = 64 or 128, H / Hkv in 1..8) or a cluster that cannot run. `pdl`:
/// launched with programmatic dependent launch; the kernel then lets its dependents start
/// at once (they may read only constants before their own wait).
void decode_attention_o(const AttentionOParams& params, int cluster, bool pdl, cudaStream_t stream = 0,
                        int replicas = 1);

/// The per-query-head form (decode_attention_o_per_head.cu): chapter 07's v6 (a cluster of
/// S blocks per QUERY head, the splits pushing their partials into block 0, which merges)
/// with the O projection and its residual add inside, so the layer has no O kernel.
///
/// Why another form. The form above holds its O projection as Hkv partial sums that the
/// next two kernels add in; per query head that would be H = 12 partials for every
/// gate/up block to read. So here the H heads' shares meet inside the kernel: block r of
/// head h's cluster owns O rows [r R, (r + 1) R) (R = ceil(C / S)), copies their D
/// columns of head h from W_o into shared memory before its wait (96 KB for Bielik at
/// S = 4), gets the head's merged output from block 0 (st.async into every block,
/// counted on an mbarrier there), multiplies, and writes head h's share of its rows to
/// `partials` (fp32). It then counts itself in on arrivals[r]; the H-th block to arrive
/// for rows r sums the H shares in head order, adds the bias and adds the result into the
/// residual stream, rounded as the O GEMV's epilogue rounds (x = bf16(x + bf16(o + b))),
/// and sets arrivals[r] back to 0 for the next launch.
///
/// What it removes: the O kernel, one kernel boundary, and O's 192 blocks, whose SM room
/// gate/up's blocks then take early (they are scheduled as this kernel starts and load
/// their first weights during the attention).
///
/// Measured on the H200 (2026-12-02, chapter 08's DECODE_LOG.md, eighteenth session): it
/// is correct (the tests) and slower. Decode 703 tokens/s with clusters of 4 (96 KB of
/// W_o a block), 868 with clusters of 16 (24 KB), 880 with 16 and gate/up scheduled
/// after the attention's inputs, against 956 for v6 + the O GEMV in the same calls.
/// W_o's rows requested before the wait delay the attention's own loads (its wait
/// returned at 7.2-8.8 us instead of 3.9 with clusters of 4); requested after the
/// attention they arrive behind gate/up's early weights (848). And the H heads' shares
/// meet through L2 (fence, count, sum): the kernel ends 4-6 us after its outputs are
/// merged, where the O GEMV ends 2.5 us after the attention's stores.
struct AttentionOPerHeadParams : AttentionOInputs {
  __nv_bfloat16* x = nullptr;            ///< (C) the residual stream, updated in place: x += o + b_o
  float* partials = nullptr;             ///< (H, C) workspace: head h's share of each O output
  unsigned* arrivals = nullptr;          ///< (kAttentionOMaxClusterSize) zero before the first launch; left zero
  /// No kernel that may still run writes x or b_o: every block loads its rows' residual
  /// and bias before its PDL wait (in the model, x was last written by the previous
  /// layer's down projection, finished before QKV let this kernel start).
  bool residual_settled = false;
  /// Let the next kernel be scheduled once this block's q and first keys are in, instead
  /// of as it starts (v6's option of the same name).
  bool allow_dependents_after_inputs = false;
  /// Request the W_o rows after the attention's partial instead of before the wait, so
  /// that they do not queue in front of q and the keys.
  bool w_o_after_attention = false;
  unsigned long long* timeline = nullptr;  ///< (2 kAttentionTimelineEvents) v6's stamps, or nullptr
};

/// The largest cluster (attention splits per query head) the per-head form supports.
constexpr int kAttentionOMaxClusterSize = 16;

/// Whether decode_attention_o_per_head can run clusters of `cluster` blocks for this
/// shape on this GPU (sm_90, the W_o rows fit a block's shared memory, the GPU schedules
/// the cluster). Throws std::invalid_argument for a shape the kernel lacks (D = 64 or 128).
bool decode_attention_o_per_head_runs(int C, int H, int Hkv, int D, int cluster);

/// The attention of one new token over the cache, its O projection and the residual add
/// (see AttentionOPerHeadParams): x += attention(q, cache) W_o^T + b_o. `cluster`: blocks
/// per query head (1..16, decode_attention_o_per_head_runs). Throws std::invalid_argument
/// for a missing pointer or a cluster that cannot run.
void decode_attention_o_per_head(const AttentionOPerHeadParams& params, int cluster, bool pdl,
                                 cudaStream_t stream = 0);

/// The third form (decode_attention_o_blocks.cu): v6's attention of query head h in
/// `splits` blocks of a cluster, and `o_blocks` more blocks in the same cluster that only
/// project it: O block j owns rows [j R, (j + 1) R) of W_o's column band of head h
/// (R = ceil(C / o_blocks)), holds them in registers from before the PDL wait, merges the
/// head's output itself from the splits' partials (every split pushes its partial into
/// every O block with st.async, counted on an mbarrier there), and adds its rows' dot
/// products into an fp32 accumulator of the O projection with atomics.
///
/// Why another form. The two above lost because W_o's rows were in the attention's way:
/// the splits themselves asked for them (bulk copies into shared memory, 24-147 KB a
/// block) before or after their own loads, and the H heads' shares of a row met through
/// L2 (fence, count, the last block's sum), 4-6 us after the outputs were merged. Here
/// the splits are v6's, unchanged; the rows travel as the O GEMV's do (plain loads into
/// registers of blocks that do nothing else, 32 KB a block for Bielik with 12 O blocks);
/// and the heads meet in the accumulator, where no block waits for another. What it
/// removes is the O GEMV: its kernel boundary after the attention (1.1-1.6 us on the
/// H200's timelines), its input staging and its first dot product.
///
/// The accumulator holds b_o before the first head adds its share (the caller's job;
/// in the model the next layer's kernel resets it, `reset` below), so after the launch
/// it holds the O projection + bias in fp32, summed in no fixed order. The consumers add
/// it into the residual stream as the O GEMV's epilogue would, x + bf16(acc): gate/up
/// while it stages its input (GemvInput::kRmsNormAddPartials), down into the residual it
/// updates (ResidualPartials on GemvOutput::kResidualAdd), with count 1.
struct AttentionOBlocksParams : AttentionOInputs {
  float* accumulator = nullptr;  ///< (C) += this token's O projection, head by head (holds b_o before)
  /// (C) or nullptr: set to reset_value (nullptr: zeros) after the PDL wait, by the O
  /// blocks: the previous layer's accumulator, whose readers have finished by then.
  /// Must not be the accumulator.
  float* reset = nullptr;
  const __nv_bfloat16* reset_value = nullptr;  ///< (C) or nullptr
  /// Let the next kernel be scheduled once a split's q and first keys are in, instead of
  /// as it starts (v6's option of the same name). The O blocks let it at their start.
  bool allow_dependents_after_inputs = false;
  bool stream_evict_first = true;  ///< W_o's loads tell L2 to drop their lines first (as the GEMVs')
};

/// Whether decode_attention_o_blocks can run `splits` attention splits and `o_blocks` O
/// blocks a cluster (at most kAttentionOMaxClusterSize in all) for this shape on this
/// GPU: sm_90, an O block's rows fit its registers (ceil(C / o_blocks) <= 16 x 256 / (D /
/// 8)), and the GPU schedules the cluster. Throws std::invalid_argument for a shape the
/// kernel lacks (D = 64 or 128, H a multiple of Hkv).
bool decode_attention_o_blocks_runs(int C, int H, int Hkv, int D, int splits, int o_blocks);

/// accumulator += attention(q, cache) W_o^T for one new token, and the reset (see
/// AttentionOBlocksParams). Throws std::invalid_argument for a missing pointer, a reset
/// target equal to the accumulator, or a cluster that cannot run. `pdl`: launched with
/// programmatic dependent launch.
void decode_attention_o_blocks(const AttentionOBlocksParams& params, int splits, int o_blocks, bool pdl,
                               cudaStream_t stream = 0);

}  // namespace bielik
