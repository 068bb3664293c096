/// @file decode_experiments.hpp
/// @brief Chapter 08: the model's knobs that lost (CudaModelOptions::experiments). Each
/// was measured on the H200 against the path CudaModelOptions describes and came out
/// slower or level, or is a measurement hook for bench_model (the GEMV timeline, the
/// kernels left out, the persistent step's clock). The defaults keep every one off (an
/// experiment's own parameters, such as fused_mlp_block_warps, matter only once it is
/// on), so the model runs the chosen path. Each field's comment says what it does and
/// what it measured, DECODE_LOG.md has the story, and bench_model's flags still set them.
#pragma once

#include "decode_side_prefetch.cuh"  // L2PrefetchForm
#include "split_batch_rest.hpp"

namespace bielik {

/// Which weights DecodeExperiments::l2_persist_mb keeps in L2 from one decode step to the
/// next: the first rows of the lm_head, or an equal share of every layer's matrix (the
/// last rows of QKV, O and down; gate's last and up's first rows for gate/up). kNone sets
/// the L2 aside and marks no weight (measurement: what the set-aside alone costs).
enum class L2PersistTarget { kLmHead, kQkv, kO, kGateUp, kDown, kNone };

/// Kernels DecodeExperiments::decode_skip can leave out of a decode step's layers.
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

/// CudaModelOptions::experiments: every knob off by default (see the file comment).
struct DecodeExperiments {
  /// generate_greedy copies each step's token back after the step (a 4-byte copy between
  /// every two steps), as it did before the argmax kept the tokens on the GPU
  /// (d_history_, one copy at the end). Off; it measures what the copies cost: the same
  /// call, 988 / 989 / 987 against 998 / 997 / 997 tokens/s (a graph a step both).
  bool generate_copy_each_token = false;
  /// Prefill projections of 2 to this many rows run on chapter 03's gemv_v2 (the tokens
  /// as the columns of a tensor-core tile, every weight read once) instead of cuBLASLt's
  /// GEMM. 0 or 1: cuBLASLt from 2 rows on. At most kGemvV2MaxTokens (16). Off: H200,
  /// 2026-12-03, bench_model --ttft-gemv-ab, two rounds: TTFT at 4 / 8 / 12 / 16 tokens
  /// 1.88-1.89 / 1.90-1.91 / 2.12-2.14 / 2.18-2.19 ms against cuBLASLt's 1.89-1.90 /
  /// 1.84-1.85 / 1.87 / 1.88-1.89 (chapter 03's README: gemv_v2 streams gate/up and the
  /// lm_head faster at T <= 8, down slower at every T, everything slower at T > 8).
  int prefill_gemv_max_tokens = 0;
  /// Every GEMV that stages a plain or normalized input (QKV, O, gate/up, down, the
  /// lm_head) has it copied into shared memory by one bulk copy instead of every
  /// thread's loads (DecodeGemvParams::stage_input_bulk; sm_90+, else the model refuses
  /// it). The same values. Measured on the H200 (2026-12-02, decode_ab.sh, three rounds):
  /// 893 x 3 against 979-980 tokens/s. bench_model --bulk-staging.
  bool gemv_stage_input_bulk = false;
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
  /// pause at the start. A plain pause does as well (CudaModelOptions::
  /// gate_up_start_delay_ns), so the hold is off. bench_model --hold-o, --hold-gate-up N,
  /// --hold-gate-up-from N.
  bool o_holds_for_attention_inputs = false;
  int gate_up_hold_blocks = 0;  ///< 0: none; a large value: every block
  /// With the holds: the attention signals at the end of its blocks instead of once their
  /// inputs are in (any hand-over). bench_model --hold-until-attention-end.
  bool hold_until_attention_end = false;
  int gate_up_hold_first_block = 0;  ///< gate/up's blocks below this one do not hold (measurement)
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
  /// (CudaModelOptions). bench_model
  /// --split-batch-rest after-staging|after-wait|when-first-arrived.
  SplitBatchRest split_batch_rest = SplitBatchRest::kAfterStaging;
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
  /// Gate/up's and down's pause for QKV, O and the lm_head (0: none). Measured level
  /// (2026-12-02, against 959 / 960 tokens/s): QKV 300 ns 961 / 960, O 300 ns 957 / 957,
  /// lm_head 300 ns 959 / 960, all three 960 / 960. bench_model --qkv-start-delay NS,
  /// --o-start-delay NS, --lm-head-start-delay NS.
  int qkv_start_delay_ns = 0;
  int o_start_delay_ns = 0;
  int lm_head_start_delay_ns = 0;
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

}  // namespace bielik
