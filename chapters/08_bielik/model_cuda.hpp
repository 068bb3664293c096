/// @file model_cuda.hpp
/// @brief The whole model on the GPU: the chapters' kernels assembled, bf16 weights, a KV
/// cache, prefill in chunks, and decode as replayed CUDA graphs.
///
/// Prefill (T tokens at positions P..P+T-1, in chunks of at most prefill_chunk tokens):
///
///     x = embedding(tokens)                                         chapter 01
///     for each layer:
///         h = rmsnorm(x) (fused with the previous residual add)     chapter 02
///         qkv = h Wqkv^T + bqkv     (q, k, v weights concatenated)  chapter 03
///         q, k = rope(q, k) at positions P..P+T-1                    chapter 04
///         append k, v to the KV cache                                chapter 07
///           (split, RoPE and append in one pass: prefill_kernels.cuh)
///         a = attention(q, cache positions 0..P+T-1)                 chapter 05
///         x = x + a Wo^T + bo;  h = rmsnorm(x)                        chapters 03, 02
///         act = silu(h Wg^T + bg) * (h Wu^T + bu)  (one GEMM, 2F wide)
///         mlp = act Wd^T + bd   (added into x by the next fused norm)
///     logits = rmsnorm(x) lm_head^T   (the last row only, unless Logits::kAll)
///
/// Attention over the cache: the first chunk (P == 0) attends to its own token-major k, v.
/// A chunk on top of a cache (P > 0: a new chat turn, or the second chunk of a long
/// prompt) needs keys 0..P+T-1, which the cache holds head-major; they are gathered into
/// a token-major scratch first (chapter 07's kv_cache_gather_token_major). That copy moves
/// 2 * Hkv * D * 2 bytes per cached token per layer (1 KB for Bielik): 2 MB per layer at a
/// 2k-token context, ~1 us of bandwidth next to the chunk's ~0.2 ms of matmuls per layer.
///
/// Decode (T = 1) runs the fused kernels of decode_kernels.cuh, captured into CUDA graphs
/// once, at load time. Nothing in a graph depends on the position: the input token, the
/// position (RoPE, cache append, attention length) and the commit are all read or written
/// in device memory, so every step replays a graph captured at load. There are up to six
/// (six with the default options and a cache of 1280 tokens or more): the step with the
/// attention's main cluster size, one for short caches and one for long ones
/// (short_attention_*, long_attention_*), each also captured as decode_graph_steps steps
/// in one graph for generate_greedy; the host picks one by the cache length it knows. A
/// graph starts at layer 0: the step's input row (the token's embedding) was written by
/// the previous step's argmax, or, where the host gave the token, by one embedding launch
/// before the graph (argmax_writes_next_input). generate_greedy queues the steps back to
/// back and copies the tokens back once; decode and decode_sample copy back the V logits
/// or the drawn token.
///
/// Memory is allocated once, in the constructor: the weights, the KV cache, the prefill
/// activations for one chunk, the decode buffers. Nothing is allocated per token.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend.hpp"
#include "decode_attention.cuh"
#include "decode_persistent.cuh"
#include "decode_side_prefetch.cuh"
#include "device_buffer.cuh"
#include "kv_cache.cuh"
#include "model_config.hpp"
#include "rope.cuh"
#include "sample_kernels.cuh"
#include "split_batch_rest.hpp"

namespace bielik {

/// The decode step's attention: chapter 07's kernels, or v3's splits with the merge fused
/// into the O projection.
enum class DecodeAttentionPath {
  /// v5's cluster attention with the O projection fused in (decode_attention_o.cuh): no O
  /// kernel; gate/up adds the projection's partials into its input, down into the
  /// residual stream. Measured slower than kCluster on the H200 (774 against 859
  /// tokens/s; DECODE_LOG.md), so not the default. Where the GPU cannot run it (before
  /// sm_90, or W_o's rows do not fit a cluster's shared memory), the model takes kCluster.
  kClusterWithO,
  kCluster,       ///< v5: splits and merge in one kernel, a thread block cluster per kv head (sm_90+, else v3)
  /// v6: as v5, but a cluster per QUERY head, each block doing one head's work over its
  /// kv head's keys (sm_90+, else v3). The default: 908 against v5's 891 tokens/s, 802
  /// against 715 after a 2048-token prompt (H200, 2026-12-01).
  kClusterPerHead,
  kSplitCombine,  ///< v3: the split kernel, then the combine kernel
  kMergeInO,      ///< v3's split kernel; the O projection merges the partials (GemvInput::kAttentionMerge)
};

/// Which weights CudaModelOptions::l2_persist_mb keeps in L2 from one decode step to the
/// next: the first rows of the lm_head, or an equal share of every layer's matrix (the
/// last rows of QKV, O and down; gate's last and up's first rows for gate/up). kNone sets
/// the L2 aside and marks no weight (measurement: what the set-aside alone costs).
enum class L2PersistTarget { kLmHead, kQkv, kO, kGateUp, kDown, kNone };

/// Decode GEMVs CudaModelOptions::tensor_core_gemvs runs on the tensor-core kernel
/// (DecodeGemvKernel::kTensorCores; down's long rows on its streamed form).
enum TensorCoreGemv : unsigned {
  kTensorCoreQkv = 1u << 0,
  kTensorCoreO = 1u << 1,
  kTensorCoreGateUp = 1u << 2,
  kTensorCoreLmHead = 1u << 3,
  kTensorCoreDown = 1u << 4,  ///< not with the fused attention + O (its residual partials)
  kTensorCoreEvery = kTensorCoreQkv | kTensorCoreO | kTensorCoreGateUp | kTensorCoreLmHead | kTensorCoreDown,
};

/// Kernels CudaModelOptions::decode_skip can leave out of a decode step's layers.
enum DecodeSkip : unsigned {
  kSkipAttention = 1u << 0,
  kSkipOProjection = 1u << 1,  ///< the O GEMV alone (a fused attention + O kernel: both)
  kSkipGateUp = 1u << 2,
  kSkipDown = 1u << 3,
  kSkipQkv = 1u << 4,  ///< the attention then reads the q, k and v of an earlier step
  /// Not a kernel but a kernel's share: QKV stages x as it is, without the RMSNorm's
  /// block-wide sum of squares and its normalizing pass (a kPlain input): what the norm
  /// costs the step on its critical path (exercise 29). (The same for gate/up's norm was
  /// tried once, 2026-12-04: bench_model printed no rate, the cause was not looked into,
  /// and the knob was dropped.)
  kSkipQkvNorm = 1u << 5,
  /// Not a kernel but a kernel's share: with attention_o_blocks, gate/up stages x alone,
  /// without the O blocks' accumulator (down still adds it): what reading it costs
  /// gate/up's staging (exercise 31).
  kSkipOAccumulatorInGateUp = 1u << 6,
};

struct CudaModelOptions {
  int max_context = 0;       ///< KV cache length in tokens; 0: max_position_embeddings
  int prefill_chunk = 2048;  ///< most tokens per prefill pass (sizes the activation buffers)
  bool use_graph = true;     ///< decode by replaying the captured CUDA graph (else launch eagerly)
  /// generate_greedy replays graphs of this many decode steps where the steps it has left
  /// all take the same graph (the attention's cluster size changes with the length): one
  /// graph launch, and no graph boundary, for several steps. 1: a graph a step. H200,
  /// 2026-12-03, three alternating rounds (256 tokens after 16): 4 steps 1000 / 1000 /
  /// 1000 tokens/s, 16 steps 998 / 997 / 997, 1 step 998 / 997 / 997. With the argmax
  /// writing the next input (below), 2026-12-03 18:40 UTC: 2 / 4 / 8 / 16 steps 997 /
  /// 998 / 996 / 996 (medians of three rounds).
  int decode_graph_steps = 4;
  /// generate_greedy copies each step's token back after the step (a 4-byte copy between
  /// every two steps), as it did before the argmax kept the tokens on the GPU
  /// (d_history_, one copy at the end). Off; it measures what the copies cost: the same
  /// call, 988 / 989 / 987 against 998 / 997 / 997 tokens/s (a graph a step both).
  bool generate_copy_each_token = false;
  /// The decode step's argmax also writes the next step's input row (the chosen token's
  /// embedding, decode_argmax's NextInputRow), and the step graphs start at layer 0's QKV
  /// instead of at an embedding launch: between two steps on the GPU the next QKV then
  /// follows the argmax with PDL (its weights asked for while the argmax runs) instead of
  /// waiting for a separate embedding kernel to end. Where the host writes the token
  /// (decode, decode_sample, the first step of generate_greedy), one embedding launch
  /// before the graph makes the row. Layer 0's QKV then loads RoPE's position after its
  /// wait: the argmax before it commits the length.
  bool argmax_writes_next_input = true;
  /// The decode step's argmax is folded into the lm_head's GEMV (decode_gemv's
  /// ArgmaxFold): each of its blocks keeps the first maximum of the logits it writes,
  /// and the last block to finish chooses among the blocks' and commits (the token, the
  /// history, the length, the next input row), instead of decode_argmax in a kernel of its
  /// own reading the 128 KB of logits again. One kernel boundary less a step. Only where
  /// the lm_head runs on the register kernel: with kTensorCoreLmHead in a graph's
  /// tensor_core_gemvs the argmax stays a kernel of its own there.
  /// Measured (H200, 2026-12-05, three alternating rounds): 1015 / 1015 / 1015 against
  /// 1014 / 1014 / 1014 tokens/s, 256 tokens after 16 (DECODE_LOG.md, forty-eighth session).
  bool argmax_in_lm_head = true;
  bool use_pdl = true;       ///< programmatic dependent launch between decode kernels and between prefill's small kernels (sm_90+)
  /// Prefill attention with chapter 05's v6 on sm_90+ (each query block's key tiles split
  /// over a thread block cluster) instead of attention_forward (v5, or v3 on GPUs with
  /// less shared memory). Measured a tie to 3% faster in TTFT; bench_model measures both.
  bool prefill_attention_clusters = true;
  /// Prefill's last layer computes only the rows whose logits are asked for: the last
  /// token's (Logits::kLast), none in a chunk before the last (its keys and values still
  /// go into the cache). No later layer reads the other rows' outputs. Off: every row, as
  /// Logits::kAll needs. bench_model --ttft-rows-ab measures both.
  bool prefill_last_layer_rows_only = true;
  /// Prefill replays a CUDA graph for a chunk shape it has run before: T tokens at
  /// position P, with the last token's logits or none (Logits::kLast). A shape's first
  /// run launches its ~300 kernels from the host, its second captures them into a graph,
  /// and every later one is one graph launch. A chat turn (a new T and P each time) so
  /// pays no capture; a server's or a benchmark's repeated prompt lengths stop paying the
  /// host's launches (bench_model --ttft-graph-ab measures both). Logits::kAll and
  /// prefill_probed always launch eagerly.
  bool prefill_graphs = true;
  /// Most prefill graphs kept; the least recently replayed one goes first.
  int prefill_graph_cache = 8;
  /// Prefill projections of 2 to this many rows run on chapter 03's gemv_v2 (the tokens
  /// as the columns of a tensor-core tile, every weight read once) instead of cuBLASLt's
  /// GEMM. 0 or 1: cuBLASLt from 2 rows on. At most kGemvV2MaxTokens (16). Off: H200,
  /// 2026-12-03, bench_model --ttft-gemv-ab, two rounds: TTFT at 4 / 8 / 12 / 16 tokens
  /// 1.88-1.89 / 1.90-1.91 / 2.12-2.14 / 2.18-2.19 ms against cuBLASLt's 1.89-1.90 /
  /// 1.84-1.85 / 1.87 / 1.88-1.89 (chapter 03's README: gemv_v2 streams gate/up and the
  /// lm_head faster at T <= 8, down slower at every T, everything slower at T > 8).
  int prefill_gemv_max_tokens = 0;
  /// Prefill projections of 2 to this many rows run on chapter 03's v6 (wgmma with the
  /// weights as the tile's rows and the tokens as its columns, K split over a cluster)
  /// instead of cuBLASLt's GEMM, where the GPU runs it (sm_90a). 0 or 1: off. At most
  /// kMatmulV6MaxTokens (64). Checked before prefill_gemv_max_tokens. 16: H200,
  /// 2026-12-03, bench_model --ttft-v6-ab, two rounds: TTFT at 4 / 8 / 16 tokens 1.73 /
  /// 1.76 / 1.82 ms against cuBLASLt's 1.89 / 1.84 / 1.89 (4-9% lower); routed up to 64,
  /// 32 tokens level and 48-64 tokens 16-19% slower (v6's wider token tiles stream worse).
  int prefill_v6_max_tokens = 16;
  /// Resident blocks per SM the decode GEMVs may use (0: as many as fit), for the small
  /// ones (QKV, O) and the large ones (gate/up, down, lm_head). Fewer leaves room on each
  /// SM for the NEXT kernel's blocks, which PDL then starts early: their weight loads
  /// overlap this kernel (bench_model sweeps these).
  int small_gemv_blocks_per_sm = 0;
  int large_gemv_blocks_per_sm = 0;
  /// Decode GEMVs read their weights with an L2 evict-first hint (DecodeGemvParams::
  /// stream_evict_first): the 3 GB a step streams then stop pushing the KV cache, the
  /// biases and the norm weights out of L2. bench_model measures both.
  bool gemv_evict_first = true;
  /// QKV, O, gate/up and the lm_head stage their input in shared memory widened to fp32
  /// as well (DecodeGemvParams::widen_input): their dot products then skip the widening
  /// of x in every warp. The same values bit for bit. H200, 2026-12-02, one call, three
  /// rounds: 954 / 955 / 954 tokens/s against 946 x 3 after a 16-token prompt, 856 against
  /// 840 after 2048 tokens. bench_model --widen-input / --no-widen-input.
  bool gemv_widen_input = true;
  /// Every GEMV that stages a plain or normalized input (QKV, O, gate/up, down, the
  /// lm_head) has it copied into shared memory by one bulk copy instead of every
  /// thread's loads (DecodeGemvParams::stage_input_bulk; sm_90+, else the model refuses
  /// it). The same values. Measured on the H200 (2026-12-02, decode_ab.sh, three rounds):
  /// 893 x 3 against 979-980 tokens/s. bench_model --bulk-staging.
  bool gemv_stage_input_bulk = false;
  /// The O projection lets gate/up start as soon as it starts itself (DecodeGemvParams::
  /// allow_dependents_early): gate/up's weights then stream during the attention, which
  /// otherwise leaves HBM idle. bench_model measures both.
  bool o_allows_gate_up_early = true;
  /// The QKV projection lets the attention start as soon as it starts itself: the
  /// attention's blocks then read the length and the committed keys (written by earlier
  /// steps) while the previous layer's down projection still finishes. Measured slower
  /// on the H200 (836 against 848 tokens/s), so off; bench_model measures both. On
  /// today's step (2026-12-04, forty-third session) 1014 against 1023: the attention's
  /// blocks then start 2.8 us sooner, O's 2.6 and gate/up's 1.3, but QKV's input staging
  /// queues behind O's weight loads and gate/up's wait returns 0.2-0.3 us later; lengthening
  /// gate/up's or O's pause with it lost more (933-998).
  bool qkv_allows_attention_early = false;
  /// Gate/up and down request each warp's second batch of weights before their PDL wait
  /// too, by cp.async into shared memory (DecodeGemvParams::second_batch_in_shared):
  /// gate/up's second row pair, down's whole row. On the H200 neither gained: gate/up's
  /// measured +1% in two A/B pairs and -2% in the next run's options table (run-to-run
  /// noise), down's -3% in both; so both are off. bench_model measures them.
  bool gate_up_second_batch_in_shared = false;
  bool down_second_batch_in_shared = false;
  /// With the two options above: the copy goes out once the block has staged its input,
  /// past the wait, instead of before it (DecodeGemvParams::second_batch_after_staging).
  /// H200, 2026-12-02, three rounds: down's 954-955 against 956-957 tokens/s (its blocks,
  /// with 36 KB more shared memory, start 2.4 us later beside gate/up's), gate/up's 923
  /// (its shared form cannot widen its input), both 936; so off.
  /// bench_model --down-shared-after-staging / --gate-up-shared-after-staging.
  bool second_batch_after_staging = false;
  /// The down projection reads its input (the SwiGLU output) from global memory where
  /// its lanes need it, instead of every block staging all of it in shared memory after
  /// the wait (DecodeGemvParams::input_from_global). On the H200 (2026-12-01): 864-865
  /// against 851 tokens/s in two A/B pairs, and down alone in a graph 7.95 against 8.20
  /// us (82.1% against 79.6% of copy bandwidth). With the attention in v6 the order
  /// turned (2026-12-01, three interleaved A/B pairs): staged 931-932 against 913-914
  /// tokens/s, and 812 against 785 after a 2048-token prompt. Off; bench_model measures both.
  bool down_input_from_global = false;
  /// The same for the O projection (its input: the attention output, 1536 values), when
  /// the attention is its own kernel (kCluster, kSplitCombine). Faster alone (1.93
  /// against 2.42 us in a graph) but slower in the step (845-862 against 866-888
  /// tokens/s): each warp asks L2 for all of x while gate/up's weights stream. Off;
  /// bench_model measures both.
  bool o_input_from_global = false;
  /// The QKV GEMV loads RoPE's position, then cos / sin at that position, after its wait
  /// instead of before it. Before the wait, the lane that stores waits for the position to
  /// arrive before it can ask for cos / sin, and its block's staging barrier waits for
  /// that lane. After the wait, the last block's wait returns 1.6 us sooner, but the
  /// loads then land at the end of the row: 853-864 against 888 tokens/s on the H200.
  /// Off; bench_model measures both.
  bool qkv_rope_inputs_after_wait = false;
  /// Decode attention splits per kv head (0: a cluster of 8 for kClusterWithO, kCluster
  /// and kClusterPerHead (the largest that fits, if smaller); sized for 512 keys for
  /// the v3 paths; at most 1024, the workspace's size, and for the cluster paths at most
  /// the largest cluster, 16; bench_model sweeps it).
  int attention_splits = 0;
  /// kClusterPerHead with attention_splits 0: steps whose attention reads at most this
  /// many keys (this token's included) replay a second decode graph, whose attention runs
  /// in clusters of short_attention_splits instead of 8. Fewer blocks per head, each
  /// with more keys, free SMs for gate/up's blocks sooner; with many keys the splits are
  /// too long. bench_model (H200, 2026-12-01, the mbarrier hand-over), 256 tokens decoded
  /// with clusters of 4 up to 384 keys against 8 everywhere: 937 / 930 tokens/s after a
  /// 64-token prompt, 930 / 926 after 128, 908 / 922 after 192, 908 / 919 after 256; so
  /// the switch sits at 256 keys. 0: one graph. The graph and eager launches choose
  /// alike, so they agree bit for bit.
  int short_attention_max_keys = 256;
  int short_attention_splits = 4;  ///< clusters of this many blocks up to short_attention_max_keys
  /// kClusterPerHead with attention_splits 0: steps whose attention reads at least this
  /// many keys replay a third decode graph, whose attention runs in clusters of
  /// long_attention_splits (clamped to the largest cluster the GPU runs: 16 on the H200,
  /// a non-portable size; nothing changes where that is 8). Long splits then spread over
  /// more SMs. bench_model (H200, 2026-12-01), clusters of 8 against 16 everywhere: 898 /
  /// 894 tokens/s after a 512-token prompt, 881 / 885 after 768, 866 / 868 after 1024,
  /// 840 / 853 after 1536, 816 / 839 after 2048. With gate/up's split past the short graph
  /// and QKV and O on the tensor cores in every graph (forty-fifth session, 2026-12-04,
  /// decode_ab.sh, two rounds, 64 tokens after N), the third graph from 1024 / 1280 / 1536
  /// / 2048 keys: 928.5 / 945 / 945 / 944.5 tokens/s at N = 1024, 927.5 / 928.5 / 926.5 /
  /// 925.5 at 1280, 914.5 / 914.5 / 913.5 / 909.5 at 1536, 902 / 902.5 / 902.5 / 901.5 at
  /// 2048: so 1280 (it was 1024). 0: no third graph.
  int long_attention_min_keys = 1280;
  int long_attention_splits = 16;  ///< clusters of this many blocks from long_attention_min_keys on
  /// kClusterPerHead: how v6's splits hand their partials over (chapter 07's V6Handover;
  /// bench_model --v6-handover measures each).
  V6Handover v6_handover = kV6DefaultHandover;
  /// kClusterPerHead: the O projection and its residual add inside v6's clusters
  /// (decode_attention_o_per_head, decode_attention_o.cuh): no O kernel. Where the GPU
  /// cannot run it for one of the step's cluster sizes, the model keeps the O kernel.
  /// Measured slower on the H200 (2026-12-02): 703 tokens/s at the default clusters, 880
  /// at its best (clusters of 16, attention_splits = 16, and
  /// attention_allows_o_after_inputs) against 956 for the O GEMV. bench_model
  /// --v6-with-o / --no-v6-with-o.
  bool v6_fuses_o = false;
  /// With v6_fuses_o: each block requests its W_o rows after its attention partial, not
  /// before its wait (AttentionOPerHeadParams::w_o_after_attention). bench_model
  /// --v6-with-o-late-weights.
  bool v6_fused_o_late_weights = false;
  /// v6's clusters take this many O blocks beside their splits (at most 16 blocks a
  /// cluster in all; a graph whose splits leave no room for enough runs the O GEMV): the
  /// O projection inside the attention's kernel, added into a per-layer accumulator that
  /// gate/up and down read (decode_attention_o_blocks, decode_attention_o.cuh). 0: off.
  /// Not with fused_mlp, v6_fuses_o or the persistent step; the kernel has no timeline
  /// stamps (bench_model --timeline leaves O's row out, the attention's are not written).
  /// --attention-o-blocks N.
  int attention_o_blocks = 0;
  /// kClusterPerHead, pushed hand-overs: the attention lets O be scheduled only once each
  /// of its blocks has q and its first keys, not at its start, so that O's and gate/up's
  /// first weight loads do not queue in front of those L2 reads (bench_model
  /// --o-after-attention-inputs).
  bool attention_allows_o_after_inputs = false;
  /// The same, in the third (long) decode graph only: there the attention is longer and
  /// gains from it, at chat lengths gate/up's early loads are worth more (chapter 08's
  /// exercise 12). H200, 2026-12-01, the long graph from 1024 keys: 1.2% faster after a
  /// 2048-token prompt (845 / 845 against 835 / 834 tokens/s), 1.0% after 1536 (863 /
  /// 862 against 854 / 854), 0.6% slower after 1024 (865 / 866 against 870 / 871); with
  /// gate/up holding: 851 against 840 after 2048, 867 against 869 after 1024. On.
  /// bench_model --o-after-attention-inputs-long, --no-o-after-attention-inputs-long.
  bool attention_allows_o_after_inputs_in_long_graph = true;
  /// The shared-memory carveout every decode kernel's launch asks for, in percent of an
  /// SM's unified L1 / shared memory (cudaLaunchAttributePreferredSharedMemoryCarveout),
  /// or -1 for none: the driver then picks a split per kernel from its own needs. An SM
  /// holds blocks of two kernels side by side only while both fit its current split, and
  /// it changes the split only when idle; one split for the whole step would let PDL place
  /// the next kernel's blocks beside the running ones. Measured on the H200 (2026-12-01):
  /// 887 tokens/s at 100, 916 at 28 and 44, 632 at 0, against 920 for the driver's choice,
  /// which stays. -1 to 100; bench_model --carveout.
  int decode_shared_carveout = -1;
  /// kClusterPerHead with a pushed hand-over: the O projection's blocks, and gate/up's
  /// blocks gate_up_hold_first_block .. gate_up_hold_blocks - 1, hold their first weight
  /// loads until every block of the attention has its q and newest keys (chapter 07's
  /// inputs signal, DecodeGemvParams::hold; at most kHoldTimeoutNs). The idea: the
  /// attention's loads are L2 hits that otherwise queue behind the weights. Measured (H200,
  /// 2026-12-01, three rounds on each of three machines): every gate/up block holding, 950
  /// / 950 / 951 against 917 / 918 / 917 tokens/s, 943 / 943 / 944 against 912 / 912 / 911,
  /// 940 x 3 against 912-913; only the first 160, level (915-916); the first 260, 921; all
  /// but the first 160, 936-937; O holding, level (917), and with gate/up 941. So the gain
  /// comes from the blocks that start LATE, after the signal: for them the hold is only a
  /// pause at the start. A plain pause does as well (gate_up_start_delay_ns), so the hold
  /// is off. bench_model --hold-o, --hold-gate-up N, --hold-gate-up-from N.
  bool o_holds_for_attention_inputs = false;
  int gate_up_hold_blocks = 0;  ///< 0: none; a large value: every block
  /// With the holds: the attention signals at the end of its blocks instead of once their
  /// inputs are in (any hand-over). bench_model --hold-until-attention-end.
  bool hold_until_attention_end = false;
  int gate_up_hold_first_block = 0;  ///< gate/up's blocks below this one do not hold (measurement)
  /// Gate/up's and down's blocks pause this long before their first weight loads
  /// (DecodeGemvParams::start_delay_ns; thread 0 reads %globaltimer, the block waits at a
  /// barrier). H200, 2026-12-01, three rounds: gate/up pausing 300 ns, 948-949 tokens/s
  /// against 912-913 without, and 940 with the hold above; 1000 ns, 947-948; down pausing
  /// 300 ns as well (with gate/up holding), 946 against 940. Both pausing, swept on
  /// 2026-12-02: 0 / 1 / 100 / 300 / 600 ns gave 917 / 933 / 945 / 959 / 968 on one machine,
  /// 300 / 600 / 1000 / 2000 ns 951 / 950 / 935 / 878 on another, so 300. The timeline puts
  /// the gain in gate/up's input staging after its wait (DECODE_LOG.md, fifteenth
  /// session). Swept again on 2026-12-04 with gate/up's norm folded (one machine, three or
  /// four rounds each, against 1016 for 300 / 300): gate/up 0 / 100 / 150 / 200 / 500 ns
  /// 1013 / 1019 / 1018 / 1018 / 1010; with gate/up at 150, down 150 / 450 / 500 / 600 /
  /// 800 ns 1015 / 1021 / 1021 / 1021-1022 / 1018; level after 2048 tokens (867 against
  /// 866). So 150 and 500. bench_model --gate-up-start-delay NS, --down-start-delay NS.
  int gate_up_start_delay_ns = 150;
  int down_start_delay_ns = 500;
  /// Gate/up's, down's and the lm_head's first batch split around the PDL wait
  /// (DecodeGemvParams::loads_before_wait: this many of a lane's loads a row before the
  /// wait, the rest once the input is staged; 0: all before it). Fewer bytes in flight
  /// while the kernels before make their dependent reads. H200 (2026-12-04, forty-third
  /// session, decode_ab.sh): gate/up 5..1 996-975, down 7/5/3 998/974/948, the lm_head 3
  /// 1021, against 1022 with all before the wait; with gate/up 3 the chain ended 1.1 us
  /// sooner and the MLP took 2.1 us longer. So 0. bench_model
  /// --gate-up-loads-before-wait N, --down-loads-before-wait N, --lm-head-loads-before-wait N.
  int gate_up_loads_before_wait = 0;
  int down_loads_before_wait = 0;
  int lm_head_loads_before_wait = 0;
  /// When the rest of those split batches goes out (DecodeGemvParams::split_rest;
  /// exercise 32): once the input is staged, right after the wait, or before it once the
  /// first loads have landed. Needs one of the three above. H200 (2026-12-04, forty-fourth
  /// session, decode_ab.sh, 256 tokens after 16): gate/up 3 after the wait 921 against 965
  /// after the staging and 1015 with none split; once the first loads are in, gate/up 2-5
  /// 1002-1010 and down 3 / 5 1010-1011 against 1016, and by context (gate/up 3, 64
  /// tokens after 16 / 128 / 512 / 1024 / 2048) 1023 / 1013 / 992 / 916 / 893 against
  /// 1027 / 1022 / 988 / 885 / 871: a loss up to ~500 keys, a gain of 2.5-3.5% in the
  /// long graph. (Its timelines favour it everywhere, a layer 2% shorter: with every GEMV
  /// stamping it wins, 972 against 956.) So the staging's moment stays the default (and
  /// no split) in the short graph; past it, gate_up_loads_before_wait_past_short_graph
  /// below. bench_model
  /// --split-batch-rest after-staging|after-wait|when-first-arrived.
  SplitBatchRest split_batch_rest = SplitBatchRest::kAfterStaging;
  /// Gate/up's split in the steps past the short graph (the main graph from
  /// short_attention_max_keys + 1 keys, and the long graph), in place of
  /// gate_up_loads_before_wait and split_batch_rest there (exercise 33): 3 loads a row
  /// before the wait, the rest once they are in. Beside the short graph's attention
  /// (clusters of 4) the whole first batch early is worth more to the MLP than its queue
  /// costs the chain; beside clusters of 8 or 16 the split wins, at the same lengths too
  /// (below). H200 (2026-12-04, forty-fifth session, decode_ab.sh, three rounds, 64
  /// tokens after a prompt of N): the main graph 1002 against 997 tokens/s at N = 300,
  /// 1000 against 992 at 400 (two rounds: 986 against 981 at 512, 965.5 against 956.5 at
  /// 768); the long graph 886 against 866 at 2048, 911 against 879 at 1024, and with QKV
  /// and O on the tensor cores there too (tensor_core_gemvs_in_long_graph) 901 and 928;
  /// the short graph, 256 tokens after 16, 1010 against 1016 (forty-fourth session; the
  /// same lengths with no short graph, clusters of 8 throughout: 1013 against 1010). 0:
  /// those steps split as the short graph's (gate_up_split_rest_past_short_graph is then
  /// not used). Not used where gate/up's second batch goes to shared memory
  /// (gate_up_second_batch_in_shared, which the split does not combine with). On the
  /// tensor cores it counts a warp's steps (6 for K = 1536), on the register kernel a
  /// lane's loads a row (6 too). Where there is no short graph, every step takes it.
  /// bench_model --gate-up-loads-before-wait-past-short N,
  /// --split-batch-rest-past-short MOMENT.
  int gate_up_loads_before_wait_past_short_graph = 3;
  SplitBatchRest gate_up_split_rest_past_short_graph = SplitBatchRest::kWhenFirstArrived;
  /// The O projection's first batch split the same way (exercise 32's second half): this
  /// many of a warp's steps (the tensor-core kernel) or of a lane's loads a row (the
  /// register kernel), 6 for Bielik's K = 1536 in either, before the wait, the rest at
  /// o_split_rest; 0: the whole row before it. Why: O's 96 blocks ask for all of W_o
  /// (4.7 MB) before their wait, while the attention before them reads q and its keys in
  /// dependent trips that wait in the same queue. Not with o_input_from_global. H200
  /// (2026-12-04, forty-sixth session, decode_ab.sh, three rounds): 2 / 3 / 4 steps, the
  /// rest once they are in, 1009 / 1007 / 1006 against 1017 over 256 tokens after 16; 3
  /// 986 against 986 after 512 and 891 against 903 after 2048; 3 with the rest after the
  /// wait 953. O's second half is on the chain itself, so 0.
  /// bench_model --o-loads-before-wait N, --o-split-rest MOMENT.
  int o_loads_before_wait = 0;
  SplitBatchRest o_split_rest = SplitBatchRest::kWhenFirstArrived;
  /// Where gate/up splits its first batch (either option above), only its blocks 0 ..
  /// gate_up_split_blocks - 1 do, in the long graph gate_up_split_blocks_in_long_graph;
  /// the later ones load the whole batch before the wait (DecodeGemvParams::split_blocks;
  /// 0: every block splits). Exercise 33's rule: the first blocks start beside the
  /// attention and O, whose dependent reads queue behind their loads; the later ones
  /// start as O's blocks leave or in gate/up's later waves (1120 blocks, at most three an
  /// SM), when a split only delays their second half. H200 (2026-12-04, forty-sixth
  /// session, decode_ab.sh, three rounds, 64 tokens after N), against every block
  /// splitting: the main graph 132 / 200 / 232 / 264 / 300 / 330 / 396 blocks at N = 512
  /// 984 / 992 / 994 / 995-996 / 994 / 993 / 988 against 987, at N = 1024 - / 952 / 954 /
  /// 955 / 954 / 952 / - against 947, 264 at N = 300 1010 against 1005; the long graph
  /// 264 at 1536 / 2048 913 / 902 against 915 / 904 (132: 885); the short graph, which
  /// splits nothing by default, 264 blocks of 3 loads 1017 against 1022 unsplit (every
  /// block 1010). So 264 (two blocks an SM), and every block in the long graph.
  /// bench_model --gate-up-split-blocks N, --gate-up-split-blocks-long N.
  int gate_up_split_blocks = 264;
  int gate_up_split_blocks_in_long_graph = 0;
  /// A second stream of the decode graph asks L2 for the last side_prefetch_gate_up_mb MB
  /// of each layer's gate/up weights (half from gate's rows, half from up's: the rows the
  /// GEMV's last blocks read) and the last side_prefetch_down_mb MB of its down weights,
  /// while QKV, the attention and O leave HBM mostly idle (decode_side_prefetch.cuh: the
  /// branch forks after the previous layer's down projection, or after this layer's QKV
  /// with side_prefetch_fork = 1, and rejoins after the argmax, so no kernel of the chain
  /// waits for it). 0: off. side_prefetch_form: prefetch.global.L2 a line, cp.async.bulk.
  /// prefetch.L2 in 16 KB requests, or loads whose values are dropped; side_prefetch_blocks: the
  /// kernel's blocks of 256 threads. In every decode step, in a graph or eager, except
  /// the probed step (its per-kernel timings). bench_model --side-prefetch GATE_UP_MB[,DOWN_MB],
  /// --side-prefetch-form lines|bulk|loads, --side-prefetch-blocks N, --side-prefetch-stride BYTES,
  /// --side-prefetch-after-qkv.
  double side_prefetch_gate_up_mb = 0.0;
  double side_prefetch_down_mb = 0.0;
  L2PrefetchForm side_prefetch_form = L2PrefetchForm::kLines;
  int side_prefetch_blocks = 8;
  int side_prefetch_stride_bytes = 128;  ///< the line-by-line form's stride: 32, 64 or 128
  int side_prefetch_fork = 0;
  /// Keep this many MB of weights in L2 across decode steps (0: off): the model sets
  /// aside that much of L2 for persisting lines (cudaLimitPersistingL2CacheSize, at most
  /// the device's persistingL2CacheMaxSize; the previous limit is restored when the model
  /// is destroyed), and the decode GEMVs of l2_persist_target launch with an access-policy
  /// window over their share of it (persisting inside, streaming outside; those GEMVs then
  /// load without the evict-first hint). A step reads every weight once, so the most L2
  /// can do is spare HBM those bytes each step: ~39 MB of 3.19 GB. Measured slower at
  /// every size on the H200 (2026-12-02, DECODE_LOG.md): 879-883 against 962 tokens/s at
  /// the 39.32 MB the GPU grants, whatever the target, and 884 with nothing marked; 951-958
  /// at 4-24 MB. The set-aside itself takes the room the step's streams need. Off.
  /// bench_model --l2-persist MB[,lm_head|qkv|o|gate_up|down|none]; l2_persist_bytes()
  /// says what was granted.
  double l2_persist_mb = 0.0;
  L2PersistTarget l2_persist_target = L2PersistTarget::kLmHead;
  /// Decode GEMVs (bits of TensorCoreGemv) whose dot products run on the tensor cores
  /// (decode_gemv_mma.cu: a block per 16 weight rows, mma.sync, the warps splitting K)
  /// instead of the register kernel's FMAs; their sums come in another order. Measured
  /// on the H200 (2026-12-02, decode_ab.sh, two rounds, 256 tokens after 16): QKV and O
  /// 977 / 977 tokens/s against 956 / 957 with none, a layer 31.6 against 32.4 us; QKV
  /// alone 939-940, O alone 961, the lm_head 951-952, gate/up 781-782 (1120 blocks of 16
  /// rows: several waves), all four 774. So QKV and O. Down on its streamed form
  /// (kTensorCoreDown, twenty-sixth session): 846-847 against 976. bench_model
  /// --tensor-cores qkv,o,gate_up,lm_head,down or none.
  unsigned tensor_core_gemvs = kTensorCoreQkv | kTensorCoreO;
  /// The same in the third (long) decode graph. After a 2048-token prompt QKV and O on
  /// the tensor cores measured 846 against 858 tokens/s (H200, 2026-12-02, one round), so
  /// none there until the forty-fifth session, whose three rounds (2026-12-04, 64 tokens)
  /// turned it: 882 against 866 after 2048, 904 against 879 after 1024; with gate/up's
  /// split (gate_up_loads_before_wait_past_short_graph) 901 against 886 and 928
  /// against 911. (The forty-second session's report had 880 against 863.) So QKV and O,
  /// as in the other graphs. bench_model --tensor-cores-long LIST.
  unsigned tensor_core_gemvs_in_long_graph = kTensorCoreQkv | kTensorCoreO;
  /// Decode GEMVs (bits of TensorCoreGemv) that, on the tensor cores with rows of K <=
  /// 1536, run the instance compiled for three blocks an SM instead of two
  /// (DecodeGemvParams::mma_three_blocks_per_sm): a QKV or O block then takes the
  /// registers of one register-GEMV block (gate/up, down) instead of one and a half. The
  /// same values. Measured on the H200 (2026-12-03, decode_ab.sh, three rounds, 256 tokens
  /// after 16): QKV 1007 x 3 tokens/s against 997-998 for none (its last blocks start 1.1
  /// us sooner, as down's leave); O 962-963 (the boundary before O 0.66 us longer on the
  /// timeline, thirty-ninth session); both 974-975. So QKV. bench_model
  /// --mma-three-per-sm qkv,o|none (the same names as --tensor-cores).
  unsigned mma_three_blocks_per_sm = kTensorCoreQkv;
  /// Decode GEMVs with a kRmsNorm input (bits of TensorCoreGemv: QKV, gate/up, the
  /// lm_head; on either kernel) that ask for the norm weight before their weights
  /// (DecodeGemvParams::norm_weight_first). The same values. Measured on the H200
  /// (2026-12-04, one call, decode_ab.sh, three rounds, 256 tokens after 16): all three
  /// 1001-1003 tokens/s against 995-997 with none; QKV alone 998 x 3, gate/up and the
  /// lm_head 999-1000. bench_model --norm-weight-first qkv,gate_up,lm_head|none. (With
  /// fold_qkv_norm and fold_gate_up_norm, QKV and gate/up read no norm weight: their bits
  /// do nothing, and the lm_head's is the one left; 1016 against 1017 without it,
  /// 2026-12-04, level.)
  unsigned norm_weight_first = kTensorCoreQkv | kTensorCoreGateUp | kTensorCoreLmHead;
  /// Each layer's input RMSNorm weight folded into its W_qkv's columns at load
  /// (W[n][k] g[k], rounded to bf16; the norm weight then ones), so that QKV's decode GEMV
  /// on the tensor cores stages x as it is and applies the inverse RMS to its dot products
  /// in the epilogue (DecodeGemvParams::norm_in_epilogue): no normalizing pass and no
  /// barrier of its own between the wait and the first mma. Not the same values bit for
  /// bit (one more bf16 rounding of each QKV weight; see fold_norm_weight.cuh); the tests
  /// hold it to the CPU backend's tolerance. Measured on the H200 (2026-12-04, decode_ab.sh,
  /// three rounds, 256 tokens after 16): 1020 x 3 tokens/s against 1003 x 3 without the
  /// fold, and 1018 x 3 with QKV's norm left out altogether; the report run's options
  /// table 1022 against 1005. bench_model --no-fold-qkv-norm.
  bool fold_qkv_norm = true;
  /// The same fold for each layer's post-attention RMSNorm weight, into W_gate_up's
  /// columns, so that gate/up's decode GEMV (on the register kernel in the defaults)
  /// stages x as it is and each warp applies the inverse RMS, which it sums itself, to
  /// its dot products (DecodeGemvParams::norm_in_epilogue), summing x's squares inside
  /// its first row's dots. Measured on the H200 (2026-12-04, decode_ab.sh, three rounds,
  /// 256 tokens after 16): 1016-1017 tokens/s against 1009-1010 without the fold (with the
  /// squares summed in a pass of their own after the staging instead: 1019-1020 against
  /// 1016-1017, another call). bench_model --no-fold-gate-up-norm.
  bool fold_gate_up_norm = true;
  /// The same pause for the small GEMVs and the lm_head (0: none). Measured level
  /// (2026-12-02, against 959 / 960 tokens/s): QKV 300 ns 961 / 960, O 300 ns 957 / 957,
  /// lm_head 300 ns 959 / 960, all three 960 / 960. bench_model --qkv-start-delay NS,
  /// --o-start-delay NS, --lm-head-start-delay NS.
  int qkv_start_delay_ns = 0;
  int o_start_delay_ns = 0;
  int lm_head_start_delay_ns = 0;
  /// kClusterWithO: clusters per kv head, each computing the same attention and
  /// projecting 1 / replicas of the O rows (decode_attention_o; bench_model sweeps it).
  int attention_o_replicas = 4;
  /// How the decode step computes attention (bench_model measures each).
  DecodeAttentionPath decode_attention = DecodeAttentionPath::kClusterPerHead;
  /// kMergeInO: least keys per attention split (0: chapter 07's kDecodeV3MinKeysPerSplit).
  /// More keys per split means fewer splits hold keys at chat lengths, so fewer partials
  /// for the merge to read; bench_model sweeps it.
  int attention_min_keys_per_split = 0;
  /// Measurement only (bench_model's marginal-cost table): leave these kernels out of
  /// every layer of the decode step (bits of DecodeSkip). The logits are then meaningless;
  /// the step just runs without them, which is what the time saved is about.
  unsigned decode_skip = 0;
  /// Decode with ONE persistent kernel per token (decode_persistent.cuh) instead of the
  /// graph of per-projection kernels; needs cooperative launch. An experiment: off unless
  /// asked for (bench_model measures both).
  bool persistent_decode = false;
  int persistent_blocks_per_sm = 2;  ///< 1 or 2 blocks of 256 threads per SM
  /// With persistent_decode: the streamed form (decode_step_streamed: one block per SM,
  /// one bulk-copy weight stream per warp across every projection; sm_90+).
  bool persistent_weight_stream = false;
  int persistent_ring_stages = 0;  ///< slots of each warp's ring (0: as many as fit)
  int persistent_slot_bytes = 0;   ///< its slots' size (0: 6 KB; the tests use less)
  /// Record the persistent step's phase times (PersistentStep::phase_clock), read back
  /// with CudaModel::persistent_phase_clock().
  bool persistent_phase_clock = false;
  /// Measurement only (bench_model --timeline): every decode GEMV records when its blocks
  /// start, pass their wait and end (DecodeGemvParams::timeline), read back with
  /// CudaModel::decode_timeline().
  bool decode_timeline = false;
  /// With decode_timeline: the attention stamps its timeline too (its kTimed instance).
  /// false: the GEMVs alone are timed, and the attention runs its lean instance, so that
  /// a run can tell what the attention's own stamps cost the boundaries around it
  /// (bench_model --timeline-gemvs-only, which then leaves the attention's table out).
  bool decode_timeline_attention = true;
  /// The decode step's MLP as ONE kernel (decode_mlp_fused.cuh): norm, gate/up, SwiGLU
  /// and down, the down projection split over the intermediate values and summed into a
  /// per-layer fp32 accumulator by atomics, which the next layer's QKV and O (or the
  /// lm_head) add into the residual stream. W_down is then kept transposed, (F, C), for
  /// the prefill too. The sums' order varies from run to run (the last bits of fp32).
  /// Where the model's shape takes it (C <= 1536, two layers or more); refused with
  /// persistent_decode, v6_fuses_o, kClusterWithO and the side prefetch. Measured
  /// slower on the H200 (2026-12-03, decode_ab.sh): 985 against 995 tokens/s, then
  /// 942-967 against 983 (DECODE_LOG.md, thirty-first session); against today's
  /// defaults 961 against 1013 (forty-third session), so off.
  /// bench_model --fused-mlp.
  bool fused_mlp = false;
  /// With fused_mlp: the values (3 weight rows each) a warp asks for before its PDL wait,
  /// 0, 1 or 2. bench_model --fused-mlp-before-wait N.
  int fused_mlp_values_before_wait = 2;
  /// With fused_mlp: warps a block, 4 or 8 (FusedMlpParams::block_warps). Blocks of 4 fit
  /// beside the attention's and O's blocks, yet measured slower in the step (942 against
  /// 967 tokens/s with 8, both pausing 300 ns). bench_model --fused-mlp-block-warps N.
  int fused_mlp_block_warps = 8;
  /// With fused_mlp: the pause of each block before its first loads (FusedMlpParams::
  /// start_delay_ns). Blocks of 4: 942 tokens/s with 300 ns, 955 without; blocks of 8
  /// without it measured the option's best, 985 against 995 (another call).
  /// bench_model --fused-mlp-start-delay NS.
  int fused_mlp_start_delay_ns = 0;
  /// With fused_mlp: blocks in its grid (FusedMlpParams::blocks; 0: every SM once). Fewer
  /// leave SMs on which the next layer's QKV blocks start, and ask for their weights,
  /// while the MLP still streams (a grid of one block an SM holds every SM's registers
  /// until its end). H200 (2026-12-04, decode_ab.sh, three rounds): 128 blocks 974
  /// tokens/s against 961 on every SM and 1013 for the unfused pair; 120, 112, 100 and 88
  /// blocks 955, 962, 928 and 855, as fewer SMs stream the MLP slower (DECODE_LOG.md,
  /// forty-third session). bench_model --fused-mlp-blocks N.
  int fused_mlp_blocks = 0;
};

class CudaModel final : public Backend {
 public:
  /// Reads `model_dir`/config.json and the safetensors checkpoint (shapes checked by
  /// map_model_weights), copies the weights to the GPU and captures the decode graphs.
  /// Throws std::runtime_error for a bad checkpoint, std::invalid_argument for a shape the
  /// kernels cannot run (cuda_backend_unsupported_reason) or a bad option, or one this GPU
  /// cannot run; both before anything is allocated or copied.
  explicit CudaModel(const std::string& model_dir, const CudaModelOptions& options = {});
  ~CudaModel() override;
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  std::vector<float> prefill(const std::vector<int32_t>& tokens, Logits which = Logits::kLast) override;
  std::vector<float> decode(int32_t token) override;
  /// The step and the draw on the GPU (sample_kernels.cuh): 20 bytes come back instead
  /// of the (V) logits, and the host does no pass over them. Options the GPU sampler does
  /// not run (top-k above kGpuSamplerMaxTopK) take the host path, Backend::decode_sample;
  /// top-p over a nucleus of more than kGpuSamplerMaxTopK tokens copies the logits back
  /// after the kernel says so and draws on the host with the same u.
  int32_t decode_sample(int32_t token, Sampler& sampler) override;
  void reset() override;
  int position() const override { return kv_.length(); }
  int context_size() const override { return kv_.max_context(); }
  const ModelConfig& config() const override { return config_; }
  std::string name() const override;

  /// The greedy fast path: runs `token` at position() and returns the argmax of the
  /// logits, computed on the GPU (only 4 bytes come back). Same checks as decode().
  int32_t decode_greedy(int32_t token);

  /// `count` greedy steps: `token` first, then each step's argmax feeds the next step on
  /// the GPU, without a round trip to the host; returns the `count` generated ids. Throws
  /// std::length_error before any work when position() + count > context_size().
  std::vector<int32_t> generate_greedy(int32_t token, int count);

  /// One decode step of `token`, launched eagerly (never the graph, no PDL) with
  /// `after_kernel(name)` called on the host after each kernel class is enqueued
  /// ("embedding", "qkv_rope_append", "attention" (with kClusterWithO "attention_o"),
  /// "o_proj" (none where the O projection runs inside the attention's kernel),
  /// "gate_up_swiglu" and "down" (with fused_mlp "mlp_fused"), "lm_head", and "argmax"
  /// only where the argmax is not folded into the lm_head): the benchmark records an
  /// event there. Advances position().
  void decode_probed(int32_t token, const std::function<void(const char*)>& after_kernel);

  /// prefill(tokens) (last logits) with `after_kernel(name)` called on the host after each
  /// kernel class of the forward pass is enqueued ("embedding", "norm", "qkv_gemm",
  /// "split_rope_append", "attention", "o_gemm", "gate_up_gemm", "swiglu", "down_gemm",
  /// "final_norm_lm_head"): the benchmark's per-kernel TTFT breakdown. tokens.size() must fit one chunk.
  void prefill_probed(const std::vector<int32_t>& tokens, const std::function<void(const char*)>& after_kernel);

  /// With persistent_decode and persistent_phase_clock: PersistentStep::phase_clock, i.e.
  /// the last step's 6 L + 3 timestamps (ns), then the streamed step's 5 x 2 wait /
  /// phase cycle counts, summed over every step since the model was created; empty
  /// otherwise.
  std::vector<unsigned long long> persistent_phase_clock();

  /// With decode_timeline: one greedy decode step of `token` (the graph, as every step),
  /// then its GEMVs' timeline: for launch i = 4 l + k (k: 0 QKV, 1 O, 2 gate/up, 3 down;
  /// i = 4 L: the lm_head) the G = 2 kGemvTimelineEvents values of DecodeGemvParams::
  /// timeline at G i; then, at G (4 L + 1) + 16 l, layer l's attention's 16 (chapter 07's v6 or v5 timed
  /// launchers; left at their preset ULLONG_MAX / 0 on the other attention paths). Empty
  /// without the option.
  std::vector<unsigned long long> decode_timeline(int32_t token);

  /// The stream every kernel of this model runs on.
  cudaStream_t stream() const { return stream_; }
  /// Device bytes of the weights (all tensors, the embedding table included).
  size_t weight_bytes() const { return weights_.bytes(); }
  /// Weight bytes one decode step reads: all but the embedding table (one row of it).
  size_t decode_weight_bytes() const;
  size_t kv_cache_bytes() const { return kv_.bytes(); }
  /// Device bytes of every other buffer the model allocated: the prefill activations and
  /// gathered keys, the decode buffers and logits, the attention workspace, the RoPE
  /// table, the argmax's, the sampler's and the options' buffers (not the libraries' own
  /// workspaces, such as cuBLASLt's).
  size_t scratch_bytes() const { return scratch_bytes_; }
  bool uses_pdl() const { return use_pdl_; }
  /// Nodes of the default decode graph (0 without one): what the tests count the side
  /// branch's prefetch kernels by.
  size_t decode_graph_nodes() const;
  /// Bytes of L2 set aside for the weights l2_persist_mb keeps there (0: none, or the
  /// device has no persisting L2).
  size_t l2_persist_bytes() const { return l2_persist_bytes_; }
  /// Whether the decode step runs the O projection inside v6's clusters (options' v6_fuses_o,
  /// where the GPU can).
  bool v6_fuses_o() const { return v6_fuses_o_; }
  /// The O blocks the attention of a decode step over kv_len keys takes
  /// (options' attention_o_blocks; 0: that step runs the O GEMV).
  int attention_o_blocks_at(int kv_len) const { return o_blocks_for(attention_splits_at(kv_len)); }
  /// How a register GEMV's first batch is split around its PDL wait: this many loads a
  /// row before it (0: the whole batch), the rest at `rest`.
  struct FirstBatchSplit {
    int loads_before_wait = 0;
    SplitBatchRest rest = SplitBatchRest::kAfterStaging;
    int blocks = 0;  ///< only blocks below this split (0: every block)
  };
  /// Gate/up's split in the decode step over kv_len keys (options' gate_up_loads_before_wait
  /// and split_batch_rest in the short graph, their _past_short_graph forms in the others).
  FirstBatchSplit gate_up_split_at(int kv_len) const {
    return gate_up_split(short_attention_step(kv_len), long_attention_step(kv_len));
  }
  /// Whether the decode step runs the fused MLP (options' fused_mlp, where the model's
  /// shape takes it).
  bool fused_mlp() const { return fused_mlp_; }
  /// Prefill graphs captured and kept now (options' prefill_graphs): 0 until a chunk
  /// shape has run twice.
  size_t prefill_graphs_cached() const { return prefill_graphs_.size(); }

 private:
  struct Layer {
    const __nv_bfloat16* input_norm;  // (C)
    const __nv_bfloat16* w_qkv;       // ((H + 2 Hkv) D, C): q rows, then k rows, then v rows
    const __nv_bfloat16* b_qkv;       // ((H + 2 Hkv) D) or nullptr
    const __nv_bfloat16* w_o;         // (C, H D)
    const __nv_bfloat16* b_o;         // (C) or nullptr
    const __nv_bfloat16* post_norm;   // (C)
    const __nv_bfloat16* w_gate_up;   // (2F, C): gate rows, then up rows
    const __nv_bfloat16* b_gate_up;   // (2F) or nullptr
    const __nv_bfloat16* w_down;      // (C, F)
    const __nv_bfloat16* b_down;      // (C) or nullptr
  };
  /// What the side branch asks L2 for in `layer` (options_.side_prefetch_*).
  L2PrefetchPlan side_prefetch_plan(const Layer& layer) const;

  void load_weights(const std::string& model_dir);
  // fused_mlp_: every layer's W_down rewritten in place as W_down^T, (F, C).
  void transpose_down_weights();
  // One accumulator of C floats a layer, each starting at that layer's `bias` (zeros
  // where the layer has none): the fused MLP's (b_down) and the O blocks' (b_o).
  DeviceBuffer<float> accumulators_at_bias(const __nv_bfloat16* Layer::*bias) const;
  // options_.fold_qkv_norm and fold_gate_up_norm: every layer's input norm weight folded
  // into its W_qkv's columns, its post-attention norm weight into W_gate_up's, and each
  // norm weight so folded rewritten as ones (fold_norm_weight.cuh).
  void fold_norms_into_weights();
  void check_fits(size_t count, const char* what) const;
  void check_token(int32_t token) const;
  // Runs T <= prefill_chunk tokens at positions position()..+T-1 and commits them;
  // writes (T, V) logits when all_logits, the last token's (V) when `logits` is set.
  void forward_chunk(const int32_t* tokens, int T, bool all_logits, float* logits,
                     const std::function<void(const char*)>* after = nullptr);
  // Enqueues the device work of one chunk of T tokens whose ids are in p_tokens_, at
  // position P = kv_.length(): the layers, the device length's advance and, with
  // want_logits, the final norm (every computed row) and, unless all_logits, the last
  // row's lm_head GEMV into d_logits_. No host sync, no copy: a graph can hold it.
  void enqueue_chunk(int T, bool all_logits, bool want_logits, const std::function<void(const char*)>* after);
  // enqueue_chunk(T, false, want_logits, nullptr) as prefill_graphs says: eagerly the
  // first time the shape is seen, then captured, then replayed.
  void launch_chunk(int T, bool want_logits);
  // A prefill projection y = x W^T + b of `rows` tokens: v6 up to
  // options_.prefill_v6_max_tokens rows, gemv_v2 up to options_.prefill_gemv_max_tokens,
  // else matmul_forward (chapter 03).
  void project(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* b, int rows,
               int C_in, int C_out, cudaStream_t s) const;
  void destroy_prefill_graphs();
  // Enqueues one decode step on `stream`: reads d_token_ and the device KV length, writes
  // logits_ and d_token_ (the argmax), advances the device length.
  // Its attention runs with `attention_splits` (attention_splits_at(kv length)).
  void enqueue_decode_step(cudaStream_t stream, bool pdl, const std::function<void(const char*)>* after_kernel,
                           int attention_splits);
  // options_.argmax_writes_next_input: the step does not embed its token itself, so after
  // the host writes d_token_ this launches the embedding of it into d_x_. Otherwise nothing.
  void embed_host_token();
  // One step whose attention reads kv_len keys (position + 1): the graph for that length,
  // or the eager launches.
  void run_decode_step(int kv_len);
  // The decode step with `attention_splits` into `graph` / `exec`.
  void capture_graph(bool pdl, int attention_splits, cudaGraph_t& graph, cudaGraphExec_t& exec, int steps = 1);
  // graph_, short_graph_ and long_graph_ when their splits are set, and each as
  // decode_graph_steps steps (multi_step_graph_) when that is more than 1
  void capture_graphs(bool pdl);
  void destroy_graphs();
  void destroy_side_branch();  // side_stream_ and its events
  // options_.l2_persist_mb: sets the persisting L2 set-aside (l2_persist_bytes_), and
  // restores the previous one.
  void set_aside_l2();
  void restore_l2();
  // The access-policy window of one decode GEMV (num_bytes 0: none): `target` in `layer`
  // (nullptr: the lm_head), when options_.l2_persist_target is that target.
  cudaAccessPolicyWindow l2_persist_window(L2PersistTarget target, const Layer* layer) const;
  // Whether a step over kv_len keys takes the short attention (short_attention_splits_,
  // short_graph_): set, and at most short_attention_max_keys_ keys; or the long one
  // (long_attention_splits_, long_graph_): set, and at least long_attention_min_keys_.
  bool short_attention_step(int kv_len) const {
    return short_attention_splits_ > 0 && kv_len <= short_attention_max_keys_;
  }
  bool long_attention_step(int kv_len) const {
    return long_attention_splits_ > 0 && kv_len >= long_attention_min_keys_;
  }
  // Which kind of graph a step over kv_len keys replays: 0 the default, 1 the short
  // one, 2 the long one (each as one step, or decode_graph_steps steps).
  int graph_kind_at(int kv_len) const {
    return short_attention_step(kv_len) ? 1 : long_attention_step(kv_len) ? 2 : 0;
  }
  // The O blocks a cluster of v6 with `splits` splits takes (options_.attention_o_blocks):
  // as many as asked for that fit a cluster of 16 with the splits, or 0 (the O GEMV runs)
  // where none are asked for or the kernel cannot run that many.
  int o_blocks_for(int splits) const;
  // Gate/up's split in a step of the short graph or of another (gate_up_split_at).
  FirstBatchSplit gate_up_split(bool short_graph, bool long_graph) const;
  // loads_before_wait loads a row before the wait (0: the whole batch), the rest at
  // options_.split_batch_rest: the split every graph gives down and the lm_head.
  FirstBatchSplit split_with_rest_option(int loads_before_wait) const;
  int attention_splits_at(int kv_len) const {
    const int splits[3] = {attention_splits_, short_attention_splits_, long_attention_splits_};
    return splits[graph_kind_at(kv_len)];
  }
  cudaGraphExec_t graph_exec_at(int kv_len) const {
    const cudaGraphExec_t execs[3] = {graph_exec_, short_graph_exec_, long_graph_exec_};
    return execs[graph_kind_at(kv_len)];
  }

  ModelConfig config_;
  CudaModelOptions options_;
  int C_, F_, H_, Hkv_, D_, V_, QKV_;  // QKV_ = (H + 2 Hkv) D
  bool use_pdl_ = false;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  // The decode graph's side branch (options_.side_prefetch_*): its stream, and the events
  // that fork it from stream_ and join it back.
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t side_fork_ = nullptr, side_join_ = nullptr;
  // options_.l2_persist_mb: the set-aside granted, and the limit before this model set it.
  size_t l2_persist_bytes_ = 0;
  size_t l2_previous_limit_ = 0;
  size_t l2_max_window_bytes_ = 0;  // the device's accessPolicyMaxWindowSize

  DeviceBuffer<__nv_bfloat16> weights_;  // every tensor, 256-byte aligned, in one allocation
  const __nv_bfloat16* embed_ = nullptr;       // (V, C)
  const __nv_bfloat16* final_norm_ = nullptr;  // (C)
  const __nv_bfloat16* lm_head_ = nullptr;     // (V, C); == embed_ when tied
  std::vector<Layer> layers_;

  KvCache kv_;
  RopeTable rope_;
  std::unique_ptr<DecodeAttentionWorkspace> attention_workspace_;
  // The persistent decode step (options_.persistent_decode): its per-layer pointers on
  // the device, the grid barrier's state, and the step's arguments.
  DeviceBuffer<PersistentLayer> d_persistent_layers_;
  DeviceBuffer<unsigned> d_barrier_;
  DeviceBuffer<unsigned long long> d_phase_clock_;
  DeviceBuffer<unsigned long long> d_timeline_;  // (4 L + 1, 2 kGemvTimelineEvents) then (L, 16), with options_.decode_timeline
  PersistentStep persistent_step_;
  StreamedStepLayout streamed_layout_;  ///< persistent_weight_stream: the ring, computed at load
  int attention_splits_ = 1;
  int short_attention_splits_ = 0;    ///< options_.short_attention_splits where it applies, else 0
  int short_attention_max_keys_ = 0;  ///< options_.short_attention_max_keys where it applies
  int long_attention_splits_ = 0;     ///< options_.long_attention_splits (clamped) where it applies, else 0
  int long_attention_min_keys_ = 0;   ///< options_.long_attention_min_keys where it applies
  /// The path the decode step takes: options_.decode_attention, or kCluster where the
  /// GPU cannot run kClusterWithO.
  DecodeAttentionPath attention_path_ = DecodeAttentionPath::kClusterPerHead;
  int attention_min_keys_ = 16;  ///< least keys per attention split (options or chapter 07 default)
  size_t scratch_bytes_ = 0;

  // Prefill activations for one chunk of Tc = prefill_chunk tokens.
  DeviceBuffer<int32_t> p_tokens_;                 // (Tc)
  DeviceBuffer<__nv_bfloat16> p_x_, p_h_, p_proj_;  // (Tc, C) residual stream, normed, block output
  DeviceBuffer<__nv_bfloat16> p_qkv_;               // (Tc, (H + 2 Hkv) D)
  DeviceBuffer<__nv_bfloat16> p_q_, p_attn_;        // (Tc, H, D) each
  DeviceBuffer<__nv_bfloat16> p_k_, p_v_;           // (Tc, Hkv, D) each
  DeviceBuffer<__nv_bfloat16> p_gate_up_, p_act_;   // (Tc, 2F) (Tc, F)
  DeviceBuffer<__nv_bfloat16> p_k_gathered_, p_v_gathered_;  // (max_context, Hkv, D) each
  DeviceBuffer<__nv_bfloat16> p_logits_;            // (kLogitRows, V) for Logits::kAll

  // Decode buffers (one token).
  DeviceBuffer<int32_t> d_token_;       // (1) input token; the argmax overwrites it
  DeviceBuffer<int32_t> d_history_;     // (max_context) the argmax's token after each position
  DeviceBuffer<int2> d_argmax_block_best_;       // (V) argmax_in_lm_head: each lm_head block's best
  DeviceBuffer<unsigned> d_argmax_blocks_done_;  // (1) argmax_in_lm_head: blocks counted, zeroed
  DeviceBuffer<__nv_bfloat16> d_x_;     // (C) residual stream
  DeviceBuffer<__nv_bfloat16> d_qkv_;   // ((H + 2 Hkv) D)
  DeviceBuffer<__nv_bfloat16> d_attn_;  // (H D)
  DeviceBuffer<__nv_bfloat16> d_act_;   // (F)
  DeviceBuffer<float> d_o_partials_;    // (Hkv, C) kClusterWithO: the O projection by kv group; (H, C) with v6_fuses_o
  DeviceBuffer<unsigned> d_o_arrivals_;  // (kAttentionOMaxClusterSize) v6_fuses_o: blocks counted in per row range, zeroed
  bool v6_fuses_o_ = false;              // options_.v6_fuses_o, where the GPU runs it at every cluster size of the step
  bool o_blocks_enabled_ = false;         // options_.attention_o_blocks on this model (o_blocks_for decides per graph)
  DeviceBuffer<float> d_o_accumulators_;  // (L, C) o_blocks_enabled_: each layer's O projection + bias
  DeviceBuffer<unsigned> d_attention_signals_;  // (L, 2) v6's inputs signal per layer (count, tag), zeroed
  DeviceBuffer<float> d_logits_;        // (V) fp32, also the prefill's last-row logits
  bool fused_mlp_ = false;                   // options_.fused_mlp, where the model's shape takes it
  DeviceBuffer<float> d_mlp_accumulators_;  // (L, C) fused_mlp_: each layer's down projection + bias

  // Pinned host memory for the copies back (async, no staging).
  struct PinnedDeleter {
    void operator()(void* p) const { cudaFreeHost(p); }
  };
  std::unique_ptr<float, PinnedDeleter> h_logits_;      // (V)
  std::unique_ptr<int32_t, PinnedDeleter> h_tokens_;    // (max_context) generated ids
  struct SampleExchange {
    double uniform = 0;  // the host's draw, copied to d_sample_uniform_
    SampleResult result;  // the GPU sampler's answer, copied back
  };
  std::unique_ptr<SampleExchange, PinnedDeleter> h_sample_;
  DeviceBuffer<double> d_sample_uniform_;       // (1) decode_sample's draw
  DeviceBuffer<SampleResult> d_sample_result_;  // (1) its token

  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t graph_exec_ = nullptr;
  cudaGraph_t short_graph_ = nullptr;  // short_attention_splits_ > 0: the step for short caches
  cudaGraphExec_t short_graph_exec_ = nullptr;
  cudaGraph_t long_graph_ = nullptr;  // long_attention_splits_ > 0: the step for long caches
  cudaGraphExec_t long_graph_exec_ = nullptr;
  // options_.decode_graph_steps > 1: that many steps in one graph, for each kind above.
  cudaGraph_t multi_step_graph_[3] = {nullptr, nullptr, nullptr};
  cudaGraphExec_t multi_step_exec_[3] = {nullptr, nullptr, nullptr};

  // The prefill graphs (options_.prefill_graphs), by chunk shape.
  struct PrefillShape {
    int T = 0, P = 0;
    bool logits = false;
    bool operator<(const PrefillShape& o) const {
      return T != o.T ? T < o.T : P != o.P ? P < o.P : logits < o.logits;
    }
  };
  struct PrefillGraph {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    uint64_t last_used = 0;  // prefill_graph_clock_ at its last replay
  };
  std::map<PrefillShape, PrefillGraph> prefill_graphs_;
  std::map<PrefillShape, uint64_t> prefill_shapes_seen_;  // run once eagerly, at this clock
  uint64_t prefill_graph_clock_ = 0;
  bool prefill_graphs_broken_ = false;  // a capture failed: launch eagerly from then on
};

/// Why the CUDA backend cannot run a model of this shape, or "" when it can (the
/// kernels are compiled for D = 64 and 128, GQA groups up to 8, 16-byte rows, and the
/// decode GEMVs take rows of up to kDecodeGemvMaxK values: C, F and H D). Needs no GPU.
std::string cuda_backend_unsupported_reason(const ModelConfig& config);

/// The factory the chat program uses: a CudaModel with default options and the given
/// KV-cache length (0: max_position_embeddings).
std::unique_ptr<Backend> make_cuda_backend(const std::string& model_dir, int max_context);

}  // namespace bielik
