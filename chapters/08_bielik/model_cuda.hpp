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
#include "decode_experiments.hpp"
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
  /// Prefill projections of 2 to this many rows run on chapter 03's v6 (wgmma with the
  /// weights as the tile's rows and the tokens as its columns, K split over a cluster)
  /// instead of cuBLASLt's GEMM, where the GPU runs it (sm_90a). 0 or 1: off. At most
  /// kMatmulV6MaxTokens (64). Checked before experiments.prefill_gemv_max_tokens. 16: H200,
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
  /// The O projection lets gate/up start as soon as it starts itself (DecodeGemvParams::
  /// allow_dependents_early): gate/up's weights then stream during the attention, which
  /// otherwise leaves HBM idle. bench_model measures both.
  bool o_allows_gate_up_early = true;
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
  /// experiments.attention_allows_o_after_inputs in the third (long) decode graph only:
  /// there the attention is longer and gains from it, at chat lengths gate/up's early
  /// loads are worth more (chapter 08's exercise 12). H200, 2026-12-01, the long graph
  /// from 1024 keys: 1.2% faster after a 2048-token prompt (845 / 845 against 835 / 834
  /// tokens/s), 1.0% after 1536 (863 / 862 against 854 / 854), 0.6% slower after 1024
  /// (865 / 866 against 870 / 871); with gate/up holding: 851 against 840 after 2048, 867
  /// against 869 after 1024. On. bench_model --o-after-attention-inputs-long,
  /// --no-o-after-attention-inputs-long.
  bool attention_allows_o_after_inputs_in_long_graph = true;
  /// Gate/up's and down's blocks pause this long before their first weight loads
  /// (DecodeGemvParams::start_delay_ns; thread 0 reads %globaltimer, the block waits at a
  /// barrier). H200, 2026-12-01, three rounds: gate/up pausing 300 ns, 948-949 tokens/s
  /// against 912-913 without, and 940 with gate/up holding; 1000 ns, 947-948; down pausing
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
  /// Gate/up's split in the steps past the short graph (the main graph from
  /// short_attention_max_keys + 1 keys, and the long graph), in place of experiments'
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
  /// Where gate/up splits its first batch (here or in experiments), only its blocks 0 ..
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
  /// kClusterWithO: clusters per kv head, each computing the same attention and
  /// projecting 1 / replicas of the O rows (decode_attention_o; bench_model sweeps it).
  int attention_o_replicas = 4;
  /// How the decode step computes attention (bench_model measures each).
  DecodeAttentionPath decode_attention = DecodeAttentionPath::kClusterPerHead;
  /// The decode knobs that measured slower than the path above, or only measure it (each
  /// documented with its measurement; decode_experiments.hpp). Off by default.
  DecodeExperiments experiments;
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
  /// Whether the decode step runs the O projection inside v6's clusters (options'
  /// experiments.v6_fuses_o, where the GPU can).
  bool v6_fuses_o() const { return v6_fuses_o_; }
  /// The O blocks the attention of a decode step over kv_len keys takes
  /// (options' experiments.attention_o_blocks; 0: that step runs the O GEMV).
  int attention_o_blocks_at(int kv_len) const { return o_blocks_for(attention_splits_at(kv_len)); }
  /// How a register GEMV's first batch is split around its PDL wait: this many loads a
  /// row before it (0: the whole batch), the rest at `rest`.
  struct FirstBatchSplit {
    int loads_before_wait = 0;
    SplitBatchRest rest = SplitBatchRest::kAfterStaging;
    int blocks = 0;  ///< only blocks below this split (0: every block)
  };
  /// Gate/up's split in the decode step over kv_len keys (options' experiments.
  /// gate_up_loads_before_wait and split_batch_rest in the short graph, their
  /// _past_short_graph forms in the others).
  FirstBatchSplit gate_up_split_at(int kv_len) const {
    return gate_up_split(short_attention_step(kv_len), long_attention_step(kv_len));
  }
  /// Whether the decode step runs the fused MLP (options' experiments.fused_mlp, where the
  /// model's shape takes it).
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
  /// What the side branch asks L2 for in `layer` (options_.experiments.side_prefetch_*).
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
  // options_.prefill_v6_max_tokens rows, gemv_v2 up to
  // options_.experiments.prefill_gemv_max_tokens, else matmul_forward (chapter 03).
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
  // options_.experiments.l2_persist_mb: sets the persisting L2 set-aside
  // (l2_persist_bytes_), and restores the previous one.
  void set_aside_l2();
  void restore_l2();
  // The access-policy window of one decode GEMV (num_bytes 0: none): `target` in `layer`
  // (nullptr: the lm_head), when options_.experiments.l2_persist_target is that target.
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
  // The O blocks a cluster of v6 with `splits` splits takes
  // (options_.experiments.attention_o_blocks): as many as asked for that fit a cluster of
  // 16 with the splits, or 0 (the O GEMV runs) where none are asked for or the kernel
  // cannot run that many.
  int o_blocks_for(int splits) const;
  // Gate/up's split in a step of the short graph or of another (gate_up_split_at).
  FirstBatchSplit gate_up_split(bool short_graph, bool long_graph) const;
  // loads_before_wait loads a row before the wait (0: the whole batch), the rest at
  // options_.experiments.split_batch_rest: the split every graph gives down and the
  // lm_head.
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
  // The decode graph's side branch (options_.experiments.side_prefetch_*): its stream, and
  // the events that fork it from stream_ and join it back.
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t side_fork_ = nullptr, side_join_ = nullptr;
  // options_.experiments.l2_persist_mb: the set-aside granted, and the limit before this
  // model set it.
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
  // The persistent decode step (options_.experiments.persistent_decode): its per-layer
  // pointers on the device, the grid barrier's state, and the step's arguments.
  DeviceBuffer<PersistentLayer> d_persistent_layers_;
  DeviceBuffer<unsigned> d_barrier_;
  DeviceBuffer<unsigned long long> d_phase_clock_;
  // (4 L + 1, 2 kGemvTimelineEvents) then (L, 16), with options_.experiments.decode_timeline
  DeviceBuffer<unsigned long long> d_timeline_;
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
  // options_.experiments.v6_fuses_o, where the GPU runs it at every cluster size of the step
  bool v6_fuses_o_ = false;
  // options_.experiments.attention_o_blocks on this model (o_blocks_for decides per graph)
  bool o_blocks_enabled_ = false;
  DeviceBuffer<float> d_o_accumulators_;  // (L, C) o_blocks_enabled_: each layer's O projection + bias
  DeviceBuffer<unsigned> d_attention_signals_;  // (L, 2) v6's inputs signal per layer (count, tag), zeroed
  DeviceBuffer<float> d_logits_;        // (V) fp32, also the prefill's last-row logits
  bool fused_mlp_ = false;                   // options_.experiments.fused_mlp, where the model's shape takes it
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
