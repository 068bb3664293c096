/// @file decode_kernels.cuh
/// @brief Chapter 08: the fused kernels of the CUDA backend's decode step (the prefill's
/// helpers are in prefill_kernels.cuh).
///
/// A decode step (T = 1) reads every weight once and does 2 FLOPs per weight, so its time
/// is (bytes of weights) / (memory bandwidth) plus whatever lies between the kernels. At
/// Bielik's size a layer reads 93 MB in ~25 us, and a launch + drain costs ~2-4 us: with
/// ten kernels a layer, the gaps would cost as much as the bytes. So the step is built
/// from few kernels that each do more:
///
///   decode_gemv(kRmsNorm, kRopeAppend)  norm of the residual stream + QKV projection,
///                                        RoPE on q and k, k and v into the KV cache
///   (chapter 07 decode attention)
///   decode_gemv(kPlain, kResidualAdd)    O projection, added into the residual stream
///   decode_gemv(kRmsNorm, kSwiGLU)       norm + gate and up projections + SwiGLU
///   decode_gemv(kPlain, kResidualAdd)    down projection, added into the residual stream
///   ...
///   decode_gemv(kRmsNorm, kF32)          final norm + lm_head, fp32 logits, with the
///                                        argmax folded into its last block (ArgmaxFold):
///                                        next token id (and the KV length += 1), and the
///                                        next step's input row, its embedding
///
/// (decode_argmax does that last part in a kernel of its own after the lm_head where the
/// argmax is not folded in: CudaModelOptions::argmax_in_lm_head off, or the lm_head on
/// the tensor cores.)
///
/// Every kernel here can be launched with programmatic dependent launch (PDL, Hopper):
/// it is then scheduled while the previous kernel still runs, starts loading its WEIGHTS
/// (which no kernel writes) at once, and waits on the GPU (griddepcontrol.wait) only
/// before it reads the previous kernel's output. The launch latency and the first HBM
/// round trip are hidden behind the previous kernel. Without PDL (or before sm_90) the
/// wait is a no-op and the kernels behave like ordinary launches.
///
/// Numerics follow the unfused chapter kernels: bf16 in and out, fp32 accumulation, the
/// normalized input rounded to bf16 (as chapter 02 stores it), projections rounded to
/// bf16 before the residual add or the SwiGLU (as chapter 03 stores them).
///
/// Symbols: C hidden, F ffn hidden, H / Hkv query / kv heads, D head_dim, V vocab;
/// N and K are a GEMV's output and input sizes. All pointers are device pointers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "pdl.cuh"  // device_supports_pdl
#include "rope.cuh"
#include "split_batch_rest.hpp"

namespace bielik {

/// Where a decode GEMV's input vector comes from.
enum class GemvInput {
  kPlain,           ///< x as given
  kRmsNorm,         ///< bf16(rmsnorm(x) * norm_weight), computed by every block from x (K values)
  kAttentionMerge,  ///< the attention output, merged by every block from the split
                    ///< partials of chapter 07's split kernel (AttentionMergeSource; x unused)
  kRmsNormAddPartials,  ///< x is the residual stream before a projection that comes as
                        ///< partial sums (ResidualPartials): the O projection's
                        ///< (decode_attention_o.cuh) for gate/up, the fused MLP's
                        ///< accumulator (decode_mlp_fused.cuh) for QKV and the lm_head. Every
                        ///< block adds them in, h = bf16(x + bf16(sum_g partials[g])), and the
                        ///< input is bf16(rmsnorm(h) * norm_weight). h is not stored: the next
                        ///< kResidualAdd GEMV computes its own rows of it (below)
};

/// A projection as `count` partial sums, not yet added into the residual stream: the O
/// projection (decode_attention_o writes one per kv head), or the fused MLP's down
/// projection (decode_mlp_fused: one fp32 accumulator, count 1, read by the next layer's
/// QKV and O, or by the lm_head). For the O projection two GEMVs of the decode step read them:
/// gate/up (GemvInput::kRmsNormAddPartials) adds all of them into its input, and down
/// (GemvOutput::kResidualAdd with these set) adds its row's into the residual before its
/// own output: y[n] = bf16(h[n] + bf16(acc + b[n])), h[n] = bf16(y[n] + bf16(sum_g
/// partials[g][n])). Nobody has to store h, and down reads only what was written two
/// kernels back, so it may read it before its PDL wait.
struct ResidualPartials {
  const float* partials = nullptr;  ///< (count, K) for gate/up, (count, N) for down
  int count = 0;                    ///< 1..kMaxResidualPartials
};
constexpr int kMaxResidualPartials = 8;

/// What a decode GEMV does with output n (acc = W[n, :] . input, b = bias or 0).
enum class GemvOutput {
  kBf16,         ///< y[n] = bf16(acc + b[n])
  kF32,          ///< y[n] = acc + b[n], fp32 (logits)
  kSwiGLU,       ///< W is (2N, K), gate rows then up rows: y[n] = bf16(silu(g) * u),
                 ///< g = bf16(acc_gate + b[n]), u = bf16(acc_up + b[N + n])
  kResidualAdd,  ///< y is the residual stream: y[n] = bf16(y[n] + bf16(acc + b[n]))
  kRopeAppend,   ///< the QKV projection with RoPE and the KV-cache append fused in (below)
};

/// Where kRopeAppend puts its results. W is the fused QKV weight ((H + 2 Hkv) D, K), and
/// N = (H + 2 Hkv) D / 2 counts rotation pairs: unit n is head n / (D/2), dims
/// j = n % (D/2) and j + D/2, the two values RoPE mixes, computed by one warp. With
/// pos = *d_length: q heads are rotated and written to y ((H, D) bf16); k heads are
/// rotated and written to the cache at pos; v heads go to the cache at pos as they are.
/// Numerics equal the unfused path (QKV rounded to bf16, then decode_rope_append). If pos
/// is outside the cache or the table, the cache is not touched and q becomes NaN.
struct RopeAppendTarget {
  __nv_bfloat16* k_cache = nullptr;  ///< (Hkv, max_context, D) one layer
  __nv_bfloat16* v_cache = nullptr;  ///< (Hkv, max_context, D) one layer
  const int* d_length = nullptr;     ///< (1) tokens already in the cache: this token's position
  const float* cos = nullptr;        ///< (max_positions, D/2)
  const float* sin = nullptr;        ///< (max_positions, D/2)
  int H = 0, Hkv = 0, D = 0, max_context = 0, max_positions = 0;
};

/// Where kAttentionMerge finds the attention's split partials: the workspace that
/// chapter 07's decode_attention_v3_splits_device_length filled, and the arguments it was
/// given, so that the GEMV knows how many splits hold keys (decode::splits_with_keys).
/// Input k = h * D + d is the merged output of query head h, dim d, rounded to bf16 (what
/// the combine kernel would store); K must be H * D. The length is read before the PDL
/// wait (it was committed by an earlier step), the partials after it.
struct AttentionMergeSource {
  const float* partial_acc = nullptr;  ///< (num_splits, H, D)
  const float* partial_ml = nullptr;   ///< (num_splits, H, 2)
  const int* d_length = nullptr;       ///< (1) committed tokens: kv_len = *d_length + new_tokens
  int new_tokens = 1;
  int max_context = 0;
  int num_splits = 0;
  int min_keys_per_split = 0;
  int H = 0, D = 0;
};

/// DecodeGemvParams::hold: the block holds its first weight loads until a kernel still
/// running says so (chapter 07's v6 attention with an inputs signal: every block has its
/// q and newest keys), so that they do not queue in front of that kernel's L2 reads.
/// Thread 0 polls *tag until it equals *d_length + 1 (the step's own tag), for at most
/// kHoldTimeoutNs; the block then goes on either way. Only a hint: the data the kernel
/// reads are still ordered by its PDL wait alone, so a missed or stale tag costs time,
/// never a wrong value.
struct HoldForSignal {
  const unsigned* tag = nullptr;   ///< (1) or nullptr: no hold
  const int* d_length = nullptr;   ///< (1) the committed length this step's tag is made from
  int blocks = 0;                  ///< blocks first_block .. blocks - 1 hold; the rest do not
  int first_block = 0;
};
constexpr unsigned long long kHoldTimeoutNs = 3000;

/// DecodeGemvParams::timeline: the moments each block stamps (thread 0). The pair of
/// event e is at 2 e (the first block's, a min) and 2 e + 1 (the last block's, a max).
enum GemvTimelineEvent {
  kTimelineStart = 0,         ///< the block starts
  kTimelineWaitReturned = 1,  ///< its PDL wait returned
  kTimelineStaged = 2,        ///< past the wait, its input staged
  /// its first batch of weights is in thread 0's registers too (stamped after the
  /// staging, so that the stamp changes no load's timing)
  kTimelineWeightsIn = 3,
  kTimelineFirstDot = 4,  ///< thread 0's share of its first row's dot product is summed
  kTimelineEnd = 5,       ///< the block ends
  kGemvTimelineEvents = 6
};

/// Where decode_argmax also writes the next step's input: the embedding row of the token
/// it chose, x = table[token] (zeros when the token is -1), so that a step that follows on
/// the GPU needs no embedding launch of its own (CudaModelOptions::argmax_writes_next_input).
struct NextInputRow {
  const __nv_bfloat16* table = nullptr;  ///< (V, C) the embedding table, or nullptr: no row written
  __nv_bfloat16* x = nullptr;            ///< (C) the decode step's input row
  int C = 0;
};

/// DecodeGemvParams::argmax: the greedy choice folded into the lm_head's GEMV (kF32 on
/// the register kernel), instead of decode_argmax in a kernel of its own after it. Each
/// block writes its rows' logits as before and keeps the first maximum of them in
/// registers; the block's best (value, row) goes to block_best[block], and the last block
/// to finish (a counter, after a fence: the classic "last block" reduction) picks the
/// first maximum among them, commits it exactly as decode_argmax does (token, history,
/// *d_length += 1, the next input row) and resets the counter for the next launch. The
/// same token as decode_argmax over the written logits, -1 if one of them is NaN.
/// Why: one kernel boundary and one 128 KB read of the logits less a decode step.
struct ArgmaxFold {
  int32_t* token = nullptr;      ///< (1) or nullptr: no argmax folded in
  int* d_length = nullptr;       ///< (1) or nullptr: no commit
  int32_t* history = nullptr;    ///< (history_size) or nullptr, as decode_argmax's
  int history_size = 0;
  NextInputRow next;             ///< as decode_argmax's
  int2* block_best = nullptr;    ///< (capacity) each block's (value bits, row); row -2: a NaN
  unsigned* blocks_done = nullptr;  ///< (1) 0 before the first launch; the last block resets it
  int capacity = 0;              ///< block_best's length: decode_gemv refuses a larger grid
  bool next_vectorized = false;  ///< (set by decode_gemv) the row copy in 16-byte pieces
};

/// Arguments of one decode GEMV.
struct DecodeGemvParams {
  void* y;                           ///< (N) bf16, or float for kF32; in/out for kResidualAdd
  const __nv_bfloat16* x;            ///< (K)
  const __nv_bfloat16* norm_weight;  ///< (K) for kRmsNorm, else unused
  const __nv_bfloat16* W;            ///< (N, K), or (2N, K) for kSwiGLU and kRopeAppend
  const __nv_bfloat16* bias;         ///< (N), (2N) for kSwiGLU and kRopeAppend, or nullptr
  int N = 0;
  int K = 0;
  float eps = 0;           ///< kRmsNorm epsilon
  RopeAppendTarget rope;   ///< kRopeAppend only
  AttentionMergeSource merge;  ///< kAttentionMerge only
  /// kRmsNormAddPartials, and optionally kResidualAdd (partials null: none)
  ResidualPartials residual_partials;
  int max_blocks_per_sm = 0;  ///< register kernels: cap on resident blocks per SM (0: occupancy)
  /// Register kernels: output rows (units) each warp computes. 0: the fewest that fit
  /// the grid in one wave, every block resident from the start (the default). Fewer
  /// rows a warp make a grid of several waves: the hardware then hands each later block
  /// to whichever SM slot frees first, so the blocks that started early (while the kernel
  /// before still ran) take more of the rows, at the price of one input staging more
  /// per block. bench_decode_gemv measures it; in the decode step gate/up in several waves
  /// lost 7% (DECODE_LOG.md, twenty-fourth session), so the model runs one wave.
  int rows_per_warp = 0;
  /// Register kernels: read W with an L2 evict-first cache hint. The weights are read
  /// once per step and then only take L2 room from what IS read again soon: the KV
  /// cache the step just appended to, the biases, the norm weights, the activations.
  bool stream_evict_first = false;
  /// Register kernels: warps that share one output row (1, 2, 4 or 8; 0: decode_gemv
  /// picks, see below). bench_decode_gemv sweeps it.
  int split_warps = 0;
  /// kRegisterLoads with PDL: the residual (kResidualAdd) and RoPE's position
  /// (kRopeAppend) were written at least two kernels back, so the kernel may load them
  /// before its PDL wait, with the weights, instead of after it. True when the kernel just
  /// before lets its dependents start only after its own wait, and writes neither. The
  /// model sets it: each of its kernels allows dependents after its wait (the O
  /// projection's early start below is the one exception, and gate/up reads neither).
  /// The bias and cos / sin are constants and are always loaded before the wait.
  bool epilogue_inputs_settled = false;
  /// Register kernels with PDL: let the NEXT kernel be scheduled as soon as this one
  /// starts, instead of after this one's own wait. Its blocks then load their weights
  /// while this kernel and the one before it still run. Only for a next kernel that reads
  /// nothing but constants (weights, biases, norm weights) before its own wait: it may
  /// start before the kernel before THIS one has finished. The model sets it on the O
  /// projection, so that gate/up's 55 MB start streaming during the attention.
  bool allow_dependents_early = false;
  /// kRegisterLoads, the down projection's form (kPlain -> kResidualAdd, K > 2048) and
  /// gate/up's (kRmsNorm -> kSwiGLU, K <= 1536); ignored by the other forms and kernels:
  /// each warp's second batch of weights (the rest of down's row, gate/up's second row
  /// pair) is copied into shared memory (cp.async) before the PDL wait, so twice the
  /// bytes are requested before the wait, instead of after the first batch has arrived.
  /// Down's form takes it with its input staged or read in place (input_from_global).
  /// bench_decode_gemv and bench_model measure it.
  bool second_batch_in_shared = false;
  /// With second_batch_in_shared: each warp's copy goes out right after its block has
  /// staged the input (read in place: right after the PDL wait) instead of before the
  /// wait. It then queues in front of no load of the kernel before (which has finished),
  /// and arrives while the first batch is dotted, where the plain form asks for it only
  /// after that dot.
  /// bench_decode_gemv and bench_model measure it.
  bool second_batch_after_staging = false;
  /// kRegisterLoads, the O and down projections' form (kPlain -> kResidualAdd) only:
  /// no block stages the input vector in shared memory; each lane loads the x chunks its
  /// weight chunks meet straight from global memory (through L1, which the block's warps
  /// share), right after the PDL wait. Removes the staging and its barrier from the path
  /// between the wait and the first FMA. bench_decode_gemv and bench_model measure it.
  bool input_from_global = false;
  /// kRegisterLoads, the forms of QKV and gate/up (kRmsNorm in, row pairs of K <= 1536,
  /// unless their second batch goes to shared memory), of O (kPlain -> kResidualAdd,
  /// K <= 2048, unless read in place) and of the lm_head (kRmsNorm -> kF32, K <= 2048);
  /// ignored by the others: the staging also writes the input widened to fp32 (4 more
  /// bytes of shared memory a value), and the dot products read that instead of widening
  /// x's bf16s in every warp. The same products in the same order: the same values, bit
  /// for bit. bench_model measures it.
  bool widen_input = false;
  /// sm_90+, kRegisterLoads and kTensorCores, kPlain and kRmsNorm inputs that are staged
  /// (ignored by the others): x comes into shared memory by one bulk copy (the copy
  /// engine, cp.async.bulk) instead of every thread's loads (stage_input_bulk in
  /// decode_device.cuh). The same values. bench_decode_gemv and bench_model measure it.
  bool stage_input_bulk = false;
  /// kRegisterLoads and kTensorCores, normalized inputs: the norm weight is asked for
  /// before the weights instead of after them. Both are loaded before the PDL wait, but
  /// a thread's loads come back in about the order it issued them (DECODE_LOG.md,
  /// eleventh session), so after the weights the norm weight arrives behind them, and
  /// the input's normalization after the wait waits for it. The same values.
  bool norm_weight_first = false;
  /// kTensorCores, kRmsNorm (ignored otherwise): x staged as it is (by the threads or the
  /// bulk copy), no norm weight read, and the inverse RMS applied to the dot products in
  /// the epilogue, the block's sum of squares meeting the dots at the barrier they take
  /// anyway: no normalizing pass and no barrier of its own between the wait and the first
  /// mma. Right for a W whose columns hold the norm weight (fold_norm_weight.cuh: the
  /// model's fold_qkv_norm), the norm weight then being ones; up to x's rounding to bf16
  /// after the norm, which it skips. kRegisterLoads, kRmsNorm (the model's
  /// fold_gate_up_norm) and kRmsNormAddPartials (h = bf16(x + bf16(partials)) in place of
  /// x): the same contract, x staged as it is (widened too where asked
  /// for), and each warp finds the inverse RMS itself: inside its first row's dots where it
  /// has a row to itself (they read every chunk of x once), in a pass over x of its own
  /// where rows are split over warps (warp_inverse_rms). No block sum, no normalizing pass,
  /// no second barrier. The pipelined and bulk-stream kernels ignore it (they normalize
  /// with the norm weight, ones in the model).
  bool norm_in_epilogue = false;
  /// kTensorCores, rows of K <= 1536 (ignored otherwise): the instance that holds only the
  /// 6 steps a warp such a row takes, compiled for three blocks an SM (launch bounds: at
  /// most 80 registers a thread) instead of the whole-row instance's two (8 steps, 122
  /// registers). The same products in the same order: the same values, bit for bit. Why:
  /// a block then takes the registers of one register-GEMV block (80) instead of one and
  /// a half, so that QKV's blocks start as soon as one of down's blocks has left their
  /// SM. bench_model measures it (the model runs QKV on it; O on it was slower).
  bool mma_three_blocks_per_sm = false;
  /// Measurement only (bench_model --timeline), register kernels: 2 *
  /// kGemvTimelineEvents values, zeroed min / max pairs (min slots start at ULLONG_MAX),
  /// %globaltimer (ns) over the blocks at each GemvTimelineEvent (thread 0 of each
  /// block). nullptr: off. A timeline, a hold or stage_input_bulk makes the launcher
  /// pick the kernels' kProbes instances, the only ones with these hooks compiled in
  /// (probes_asked in decode_device.cuh).
  unsigned long long* timeline = nullptr;
  /// Register kernels: hold the first weight loads until a signal (HoldForSignal).
  HoldForSignal hold;
  /// Register kernels: each block pauses this long (thread 0 reads %globaltimer, the
  /// block waits for it at a barrier) before its first weight loads. 0: no pause. The
  /// model's gate/up pauses 150 ns and down 500 ns (CudaModelOptions::
  /// gate_up_start_delay_ns, down_start_delay_ns; 300 ns each until the forty-first
  /// session): measured faster, not yet explained.
  int start_delay_ns = 0;
  /// kRegisterLoads, rows that start with a batch of loads before the PDL wait: of that
  /// first batch's loads a lane (a row, kBatch of them: 6 for K <= 1536 row pairs, 9 for
  /// down's), only this many go out before the wait, the rest at the moment split_rest
  /// names (by default right after the input is staged). 0 (or kBatch or more): all of
  /// them before the wait. kTensorCores (whole rows, K <= 2048; longer rows refused):
  /// this many of a warp's steps (32 values of its 16 tile rows each; 6 for K = 1536, as
  /// many as the register kernel's loads a row, so that 3 is half the row in either).
  /// Why: a kernel's early loads are bytes in flight in the memory system while the
  /// kernels before it make their small dependent reads, and bench_read_latency measured
  /// an L2 hit at 143 ns alone, 280-290 ns under streams with 64 KB in flight an SM and
  /// 540-600 ns with 128 KB (gate/up's first batch: 144 KB an SM). A launch with it set
  /// runs an instance of its own (the default ones do not carry the split). In the
  /// decode step (DECODE_LOG.md, forty-third to forty-sixth sessions) gate/up's half
  /// held back until the staging lost (the chain 1.1 us shorter, the MLP 2.1 us longer),
  /// sent once the first half is in it wins past the short graph (the model's default
  /// there), and O's, down's and the lm_head's splits lost. bench_model measures it.
  int loads_before_wait = 0;
  /// With loads_before_wait: when the rest of the split first batch goes out
  /// (SplitBatchRest; exercise 32 of chapter 08's README; measured in
  /// CudaModelOptions::experiments.split_batch_rest). Refused without loads_before_wait.
  SplitBatchRest split_rest = SplitBatchRest::kAfterStaging;
  /// With loads_before_wait (either kernel): only blocks 0 .. split_blocks - 1 split their
  /// first batch, the later ones load all of it before the wait (0: every block splits).
  /// Why (the README's exercise 33): a GEMV's blocks start roughly in index order, the
  /// first ones while the kernels before still make their dependent reads, the later
  /// ones as those kernels leave the SMs, when no chain waits behind their loads and a
  /// split only delays their second half.
  int split_blocks = 0;
  /// kF32 on kRegisterLoads only (refused elsewhere): the argmax of the logits folded in
  /// (ArgmaxFold; token null: off). The model's argmax_in_lm_head.
  ArgmaxFold argmax;
};

/// The largest K decode_gemv takes: every block stages the K-long input row in shared
/// memory (32 KB of bf16 at this size; 96 KB with widen_input's fp32 copy, which the
/// launcher allows those kernels once). The tensor-core kernel takes less
/// (decode_gemv_mma_max_k()). The CUDA backend refuses a model whose GEMVs have longer
/// rows (C, F or H D past it) at load, before it copies any weight
/// (cuda_backend_unsupported_reason).
constexpr int kDecodeGemvMaxK = 16384;

/// y = f(x W^T + b) for one token. One warp per output row (a few consecutive rows per
/// warp when N is large, 2-8 warps per row when K > 2048 and N alone would not fill one
/// wave), 16-byte streaming loads of W with 8 (gate/up: 2 x 6) in flight per lane, the
/// input vector staged (and normalized) in shared memory by every block. One wave of
/// blocks (unless DecodeGemvParams::rows_per_warp asks for fewer rows a warp): every
/// block is resident from the start, which is what lets its first weight loads go out
/// before the PDL wait.
/// Needs K % 8 == 0, K <= kDecodeGemvMaxK (shared memory), 16-byte aligned x, W and
/// norm_weight; kAttentionMerge only with kResidualAdd (the O projection), the register kernels, and
/// a complete AttentionMergeSource with K = H * D, D % 8 == 0; kRmsNormAddPartials only
/// with kSwiGLU (gate/up), kRopeAppend (QKV) or kF32 (the lm_head), on the register
/// kernels (kRopeAppend on the tensor cores too), and a complete ResidualPartials with
/// 16-byte aligned partials; kResidualAdd's partials not on the bulk-stream kernel;
/// throws std::invalid_argument otherwise. `pdl`: launch with programmatic dependent
/// launch (ignored before sm_90).
/// `kernel` picks the implementation (bench_decode_gemv compares them):
///  - kRegisterLoads: every warp loads a batch of its row into registers, uses it, loads
///    the next (decode_gemv_register_kernels.cuh);
///  - kRegisterPipelined: the same, with the next batch's loads issued before the
///    current batch is used (two batches of registers);
///  - kBulkStream (sm_90+): the bulk-copy engine streams each block's rows through a
///    shared-memory ring (decode_gemv_stream.cu); throws std::invalid_argument before
///    sm_90;
///  - kTensorCores: one block per 16 weight rows, the dot products by mma.sync, the 8
///    warps splitting K, every weight loaded before the PDL wait for K <= 2048, streamed
///    in batches (two in flight, one block an SM) beyond (decode_gemv_mma.cu);
///    kPlain and kRmsNorm inputs (and kRmsNormAddPartials into kRopeAppend) with
///    K <= decode_gemv_mma_max_k() only (throws
///    std::invalid_argument otherwise); ignores the register kernels' layout options
///    (split_warps, rows_per_warp, the second batch, widen_input, input_from_global);
///  - kAuto: the one the model uses, kRegisterLoads: the fastest of the three measured
///    back to back on the H200 (bench_decode_gemv; DECODE_LOG.md).
enum class DecodeGemvKernel { kAuto, kRegisterLoads, kRegisterPipelined, kBulkStream, kTensorCores };

void decode_gemv(GemvInput input, GemvOutput output, const DecodeGemvParams& params, bool pdl,
                 cudaStream_t stream = 0, DecodeGemvKernel kernel = DecodeGemvKernel::kAuto);

/// The kBulkStream implementation, without decode_gemv's checks (called by it).
void decode_gemv_stream(GemvInput input, GemvOutput output, const DecodeGemvParams& params, bool pdl,
                        cudaStream_t stream);

/// The kTensorCores implementation (called by decode_gemv, after its checks), and the
/// largest K it takes.
void decode_gemv_mma(GemvInput input, GemvOutput output, const DecodeGemvParams& params, bool pdl,
                     cudaStream_t stream);
int decode_gemv_mma_max_k();

/// The unfused form of kRopeAppend's epilogue (the model fuses it into the QKV GEMV; the
/// test checks the fused form against this, bit for bit).
/// RoPE and the KV-cache append of one token whose position is read on the GPU
/// (pos = *d_length): q rotated in place, k rotated and written to the cache at pos, v
/// copied to the cache at pos. If pos is outside the cache or the table, nothing is
/// written to the cache and q becomes NaN (a host-side check must have prevented it).
/// @param qkv      (H + 2 Hkv, D) the QKV projection of the token: q heads, k heads, v heads
/// @param k_cache  (Hkv, max_context, D) one layer
/// @param v_cache  (Hkv, max_context, D) one layer
/// @param d_length (1) the number of tokens already in the cache
void decode_rope_append(__nv_bfloat16* qkv, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, const int* d_length,
                        const RopeTable& table, int H, int Hkv, int max_context, bool pdl, cudaStream_t stream = 0);

/// token[0] = argmax(logits) (lowest index on ties; -1 if a logit is NaN), then, when
/// d_length is not null, *d_length += 1: the commit of the decode step, on the GPU.
/// @param token    (1) written
/// @param logits   (V)
/// @param d_length (1) or nullptr
/// @param history  (history_size) or nullptr: with d_length, the token is also written at
///                 history[*d_length] (before the increment) when that index is in range
/// @param next     with a table: the chosen token's embedding row written to next.x
void decode_argmax(int32_t* token, const float* logits, int V, int* d_length, bool pdl, cudaStream_t stream = 0,
                   int32_t* history = nullptr, int history_size = 0, NextInputRow next = {});

/// Plain C++ reference of decode_argmax: -1 when a value is NaN.
int32_t decode_argmax_cpu(const float* logits, int V);

}  // namespace bielik
