// decode_gemv on the tensor cores (DecodeGemvKernel::kTensorCores): the same GEMV, the
// same staging and epilogues as the register kernel (decode_gemv_register_kernels.cuh),
// with the dot products done by mma.sync instead of FMAs.
//
// Why the tensor cores, for a GEMV that does 2 FLOPs per weight byte? Not for the FLOPs:
// for the instructions. In the register kernel a lane dots a 16-byte chunk (8 weights)
// with 8 FMAs plus the 8 shifts and masks that widen the bf16s to fp32, and every row
// ends in a 5-step warp reduction. With 8-24 warps of an SM reaching their dot products
// together, the sixteenth session of DECODE_LOG.md measured ~1000-2500 cycles from a
// warp's weights in to its first row's dot summed, and read the instructions in it. One
// mma.sync.m16n8k16 takes 16 rows x 16 weights (256 products) from four registers a
// lane, with no widening, and sums over k inside the instruction: the warp reduction
// disappears too.
//
// What the H200 said (DECODE_LOG.md, twenty-fifth session): that stretch did NOT get
// shorter (0.67-0.75 us in bench_decode_gemv's chain, as the register kernel's), so it is
// not the instructions. But in the decode step QKV and O on this kernel take a layer
// from 32.4 to 31.6 us (977-981 against 957-962 tokens/s): with 128 and 96 blocks
// instead of ~1000-1500 warps spread over every SM, the attention's inputs arrive
// sooner and O's wait returns 0.5 us earlier. Gate/up (1120 blocks, several waves) and
// the lm_head lose on it, and so does the step after a 2048-token prompt.
//
// The layout. A block computes one tile of 16 weight rows: 16 outputs, or 8 row pairs
// for the pair outputs (gate row n and up row N + n; RoPE's dims j and j + D/2), which
// then sit in rows g and g + 8 of the tile, so that one thread ends with both. The 8
// warps split K: step s covers the 32 values 32 s .. 32 s + 31 and belongs to warp
// s % 8. In a step, lane l (g = l / 4, t = l % 4) loads the 16 bytes at k = 32 s + 8 t of
// tile rows g and g + 8: a warp's load touches 8 rows x 64 contiguous bytes, whole
// 32-byte sectors. The mma's k order is free (a dot product is a sum): its logical k
// 2t, 2t+1, 2t+8, 2t+9 are mapped onto the lane's physical values k+0..3 in the first
// mma and k+4..7 in the second, and the input x (the B operand, the same in all 8
// columns) gets the same map, so each lane reads its 16 bytes of x once per step, a
// broadcast among the 8 lanes of equal t. Column j of the result is then the same dot
// product for every j: lane (g, t) holds row g's in d[0] and row g + 8's in d[2].
// The warps' partial dots meet in shared memory, summed in warp order (deterministic).
//
// As in the register kernel, every weight a warp needs is loaded before the PDL wait
// (K <= 2048: at most 8 steps a warp, 16 loads a lane), so the dot starts as soon as the
// input is staged. One block per 16 rows: QKV (1024 row pairs) is 128 blocks, O 96.
//
// Registers decide when a block can start. The whole-row instance takes 122 registers a
// thread (32 K a block with the allocation's rounding: two blocks an SM), and a QKV block
// waiting on an SM full of the down projection's blocks (80 registers, 20 K a block) can
// start only once two of them have left. Rows of K <= 1536, QKV's and O's, take 6 steps a
// warp, not 8: an instance that holds exactly those, compiled for three blocks an SM,
// needs 80 (48 of them weights, no spills). The same products in the same order. On the
// H200 (DECODE_LOG.md, thirty-eighth session) QKV's last blocks then started 1.1 us
// sooner and the step went from 1002 to 1013 tokens/s; O on it lost 3.5%, so only QKV
// (CudaModelOptions::mma_three_blocks_per_sm). With O lean, the wait before O returned
// 0.86 us later while the attention ended only 0.2 us later (thirty-ninth session): in
// our reading, more of gate/up's blocks fit beside O's, and their first loads are still
// queued when the attention ends.
//
// The norm in the epilogue (DecodeGemvParams::norm_in_epilogue, the model's fold_qkv_norm).
// A kRmsNorm input must be finished before the first mma: the block sums x's squares,
// meets at a barrier, rewrites x scaled by inverse_rms * g and meets again. With g folded
// into W's columns at load (fold_norm_weight.cuh) only inverse_rms is left, one number,
// and the dots are linear in x: the block stages x as it is, runs its mmas at once, and
// each warp's share of the squares travels with its partial dots to the barrier before
// the epilogue, which scales the sums. In the decode step (H200, fortieth session) the
// fold took the step from 1003 to 1020 tokens/s, as much as leaving QKV's norm out
// entirely (1018); the norm's sum and first barrier had cost ~6 tokens/s of that, its
// pass and second barrier the rest.
//
// Longer rows (the down projection, K = 8960: 35 steps a warp, 280 bytes a lane) do not
// fit a lane's registers. There the kernel streams: a warp's steps come in batches of 9
// (18 loads a lane), two batches in flight, the next asked for as soon as the mma has
// taken the one before (kStreamBatches batches, K <= 9216). Two buffers of 18 loads take
// ~190 registers, one block an SM: down's 96 blocks leave 36 SMs to the kernel after it
// (the next layer's QKV), whose blocks can then start and load while down still runs.
// Why it was tried: the register kernel fills every SM with down's 384 blocks, so QKV's
// blocks start only as down's leave, and their weights arrive ~2 us after down has
// ended (DECODE_LOG.md, twenty-fifth session's timeline). What the H200 said (twenty-
// sixth session): QKV's first blocks did start 3.5 us sooner, but its last ones did
// not, nor did it end sooner; down itself streamed at 55-63% of copy bandwidth in
// bench_decode_gemv's chain against the register kernel's 80-85%, and the step fell
// from 976 to 846 tokens/s. So down stays on the register kernel
// (CudaModelOptions::tensor_core_gemvs' kTensorCoreDown: off).
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_device.cuh"
#include "decode_kernels.cuh"
#include "matmul_ptx.cuh"  // chapter 03: mma_bf16_16x8x16

namespace bielik {

using namespace decode_device;

namespace {

constexpr int kTileRows = 16;    // rows of one mma tile, one block
constexpr int kStepValues = 32;  // K values one warp covers per step
// A warp's steps come in batches: the whole row at once (one batch of up to 8 steps,
// K <= 2048), or streamed in kStreamBatches batches of kStreamBatchSteps, two in flight.
constexpr int kWholeRowSteps = 8;
// DecodeGemvParams::mma_three_blocks_per_sm: rows of K <= 1536 (QKV's and O's, 6 steps a
// warp) in an instance that holds only those steps, compiled for three blocks an SM.
constexpr int kShortRowSteps = 6;
constexpr int kStreamBatchSteps = 9;
constexpr int kStreamBatches = 4;
constexpr int kMaxMmaK = kWarps * kWholeRowSteps * kStepValues;                       // 2048
constexpr int kMaxShortK = kWarps * kShortRowSteps * kStepValues;                      // 1536
constexpr int kMaxStreamK = kWarps * kStreamBatches * kStreamBatchSteps * kStepValues;  // 9216

template <GemvOutput Out>
__host__ __device__ constexpr int units_per_tile() {
  return kTileRows / rows_per_unit<Out>();
}

/// The weight row that tile row r (0..15) of the tile starting at unit `unit0` holds, or
/// -1 past the last unit: pair outputs put unit unit0 + r's first row at r < 8 and its
/// second at r + 8; single outputs unit unit0 + r.
template <GemvOutput Out>
__device__ __forceinline__ int tile_row(const DecodeGemvParams& p, int unit0, int r) {
  if constexpr (rows_per_unit<Out>() == 2) {
    const int unit = unit0 + r % 8;
    return unit < p.N ? weight_row<Out>(p, unit, r / 8) : -1;
  } else {
    return unit0 + r < p.N ? unit0 + r : -1;
  }
}

/// Loads steps [begin, end) of batch `batch` of this warp's steps into (low, high): 16
/// bytes of tile rows g and g + 8 a step (-1: a row past the last unit). Chunks past the
/// row read as zero. (A split first batch loads its two parts by two calls; the default
/// range is the whole batch, and with it the bounds fold away.)
template <int kSteps>
__device__ __forceinline__ void load_batch(uint4 (&low)[kSteps], uint4 (&high)[kSteps], const DecodeGemvParams& p,
                                           int row_low, int row_high, int warp, int t, int batch, uint64_t policy,
                                           int begin = 0, int end = kSteps) {
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    if (i < begin || i >= end) continue;
    const int k = (warp + (batch * kSteps + i) * kWarps) * kStepValues + 8 * t;
    const bool in_row = k < p.K;
    low[i] = in_row && row_low >= 0 ? load_streaming(p.W + size_t(row_low) * p.K + k, policy) : make_uint4(0, 0, 0, 0);
    high[i] =
        in_row && row_high >= 0 ? load_streaming(p.W + size_t(row_high) * p.K + k, policy) : make_uint4(0, 0, 0, 0);
  }
}

/// The dot products of batch `batch`: two mmas a step, on two accumulators (half the
/// chain each), against the staged input.
template <int kSteps>
__device__ __forceinline__ void mma_batch(float (&d_first)[4], float (&d_second)[4], const uint4 (&low)[kSteps],
                                          const uint4 (&high)[kSteps], const uint4* x_shared, int K, int warp, int t,
                                          int batch) {
  const int steps = (K + kStepValues - 1) / kStepValues;  // over the whole row
#pragma unroll
  for (int i = 0; i < kSteps; ++i) {
    const int step = warp + (batch * kSteps + i) * kWarps;
    if (step < steps) {  // the same for the whole warp: mma.sync needs every lane
      const int k = step * kStepValues + 8 * t;
      const uint4 x = k < K ? x_shared[k / 8] : make_uint4(0, 0, 0, 0);
      // a = {row g, row g + 8, row g, row g + 8} x {values k+0..1, k+0..1, k+2..3, k+2..3}
      const uint32_t a_first[4] = {low[i].x, high[i].x, low[i].y, high[i].y};
      const uint32_t a_second[4] = {low[i].z, high[i].z, low[i].w, high[i].w};
      ptx::mma_bf16_16x8x16(d_first, a_first, x.x, x.y);
      ptx::mma_bf16_16x8x16(d_second, a_second, x.z, x.w);
    }
  }
}

/// DecodeGemvParams::norm_in_epilogue: after the PDL wait, x staged as it is, thread c
/// staging chunks c, c + 256, ... (two loads in flight, as stage_input); returns the sum
/// of the squares of its chunks, in stage_input's order. No barrier: the caller's.
template <bool kProbes>
__device__ __forceinline__ float stage_raw_summing_squares(const DecodeGemvParams& p, uint4* x_shared) {
  const int chunks = p.K / 8;
  pdl_wait();
  timeline_mark(probe_timeline<kProbes>(p), kTimelineWaitReturned);
  const uint4* x_vectors = reinterpret_cast<const uint4*>(p.x);
  float sum_squares = 0.0f;
  constexpr int kStageLoads = 2;  // stage_input's
  for (int c0 = threadIdx.x; c0 < chunks; c0 += kStageLoads * kThreads) {
    uint4 v[kStageLoads];
#pragma unroll
    for (int u = 0; u < kStageLoads; ++u) {
      const int c = c0 + u * kThreads;
      v[u] = c < chunks ? x_vectors[c] : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kStageLoads; ++u) {
      if (c0 + u * kThreads < chunks) x_shared[c0 + u * kThreads] = v[u];
      float f[8];
      unpack_8(f, v[u]);  // zeros past the end
#pragma unroll
      for (int e = 0; e < 8; ++e) sum_squares += f[e] * f[e];
    }
  }
  return sum_squares;
}

/// The same sum for an x already in shared memory (the bulk copy's): chunks c, c + 256,
/// ... in stage_raw_summing_squares' order, so that both stagings give the same values.
__device__ __forceinline__ float sum_own_squares(const DecodeGemvParams& p, const uint4* x_shared) {
  float sum_squares = 0.0f;
  for (int c = threadIdx.x; c < p.K / 8; c += kThreads) {
    float f[8];
    unpack_8(f, x_shared[c]);
#pragma unroll
    for (int e = 0; e < 8; ++e) sum_squares += f[e] * f[e];
  }
  return sum_squares;
}

// kBatchSteps x kBatches: a warp's steps. One batch: all of them loaded before the wait
// (two blocks an SM). Several: two batches loaded before the wait, the third asked for
// once the first has been multiplied, and so on (one block an SM: two buffers).
// kProbes: the measurement hooks compiled in, as in the register kernel. kMinBlocks: the
// blocks an SM the registers are budgeted for (launch bounds).
//
// kSplitFirstBatch (DecodeGemvParams::loads_before_wait, whole-row instances only): only
// the first loads_before_wait steps of a warp go out before the PDL wait, the rest at
// the moment DecodeGemvParams::split_rest names, as in the register kernel
// (decode_kernels.cu). Why for the O projection (the README's exercise 32): its 96
// blocks ask for all of W_o, 4.7 MB, before their wait, while the attention before them
// makes its dependent reads of q and the keys; the split keeps half of that out of the
// queue those reads wait in. An instance of its own, so the default ones carry none of it.
// Measured on the H200 (DECODE_LOG.md, forty-sixth session): O with 2-4 steps before the
// wait lost 0.8-1.1% over 256 tokens after 16 and 1.3% after 2048, so the model leaves
// O whole (CudaModelOptions::experiments.o_loads_before_wait = 0).
template <GemvInput In, GemvOutput Out, bool HasBias, int kBatchSteps, int kBatches, bool kProbes, int kMinBlocks,
          bool kSplitFirstBatch = false>
__global__ void __launch_bounds__(kThreads, kMinBlocks) decode_gemv_mma_kernel(DecodeGemvParams p) {
  static_assert(!kSplitFirstBatch || kBatches == 1, "only a whole-row batch is split around the wait");
  constexpr int kUnits = units_per_tile<Out>();
  constexpr int kBuffers = kBatches == 1 ? 1 : 2;
  extern __shared__ uint4 x_shared[];               // (K/8) the input, normalized for kRmsNorm*
  __shared__ float warp_partial[kWarps][kTileRows];  // each warp's share of the 16 dots
  __shared__ uint64_t input_arrived;                 // (stage_input_bulk) the copy of x
  __shared__ float norm_sums[kWarps];                // (norm_in_epilogue) each warp's share of x's squares
  // (* unless norm_in_epilogue: then x as it is.)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int unit0 = blockIdx.x * kUnits;
  unsigned long long* const timeline = probe_timeline<kProbes>(p);  // null unless kProbes
  timeline_mark(timeline, kTimelineStart);
  constexpr bool kBulkStaging = kProbes && (In == GemvInput::kPlain || In == GemvInput::kRmsNorm);
  if constexpr (kBulkStaging) init_input_arrival(p, &input_arrived);
  if (p.allow_dependents_early) pdl_allow_dependents();
  if constexpr (kProbes) hold_for_signal(p.hold);
  delay_start(p.start_delay_ns);

  // 1. Weights before the wait: every step of the row (one batch), or the first two
  //    batches. Tile rows g and g + 8, 16 bytes of each per step.
  const uint64_t policy = l2_policy(p.stream_evict_first);
  const int row_low = tile_row<Out>(p, unit0, g), row_high = tile_row<Out>(p, unit0, g + 8);
  // (norm_in_epilogue: kRmsNorm, the norm weight folded into W.)
  const bool norm_in_epilogue = In == GemvInput::kRmsNorm && p.norm_in_epilogue;
  uint4 norm_held[kNormHeld];
  if (p.norm_weight_first && !norm_in_epilogue) load_norm_weight<In>(p, norm_held);
  uint4 w_low[kBuffers][kBatchSteps], w_high[kBuffers][kBatchSteps];
  // (kSplitFirstBatch) Steps [0, before_wait) now, [before_wait, kBatchSteps) later;
  // blocks from p.split_blocks on (when set) take the whole row now.
  const bool block_splits = kSplitFirstBatch && (p.split_blocks == 0 || int(blockIdx.x) < p.split_blocks);
  const int before_wait = block_splits ? min(max(p.loads_before_wait, 1), kBatchSteps) : kBatchSteps;
  auto load_rest = [&] {
    load_batch(w_low[0], w_high[0], p, row_low, row_high, warp, t, 0, policy, before_wait, kBatchSteps);
  };
#pragma unroll
  for (int b = 0; b < kBuffers; ++b) {
    load_batch(w_low[b], w_high[b], p, row_low, row_high, warp, t, b, policy, 0, b == 0 ? before_wait : kBatchSteps);
  }
  if constexpr (kSplitFirstBatch) {
    // kWhenFirstArrived: a value the first loads produce holds each lane until they are
    // in (value_has_arrived), so a block never has more than the first part in flight.
    if (p.split_rest == SplitBatchRest::kWhenFirstArrived && before_wait < kBatchSteps) {
      float arrived = 0.0f;
#pragma unroll
      for (int i = 0; i < kBatchSteps; ++i) {
        if (i < before_wait) arrived += __uint_as_float(w_low[0][i].x) + __uint_as_float(w_high[0][i].x);
      }
      if (value_has_arrived(arrived)) load_rest();
    }
  }
  if (!p.norm_weight_first && !norm_in_epilogue) load_norm_weight<In>(p, norm_held);
  // Thread u < kUnits stores unit unit0 + u: its epilogue inputs now when no running
  // kernel writes them (the register kernel's reasoning), else after the wait.
  constexpr bool kReadsWritten = Out == GemvOutput::kResidualAdd || Out == GemvOutput::kRopeAppend;
  const bool early = !kReadsWritten || p.epilogue_inputs_settled;
  const int my_unit = unit0 + int(threadIdx.x);
  const bool stores = int(threadIdx.x) < kUnits && my_unit < p.N;
  EpilogueInputs epilogue;
  if (stores && early) epilogue = load_epilogue_inputs<Out, HasBias>(p, my_unit);

  // 2. The wait, then the input staged (normalized for kRmsNorm) by the whole block, or
  //    copied in by the bulk-copy engine.
  //    (norm_in_epilogue: x as it is, and this thread's share of its squares.)
  //    (kSplitFirstBatch, kAfterWait: the rest between the wait and the input's loads; the
  //    staging's own wait then returns at once.)
  if constexpr (kSplitFirstBatch) {
    if (p.split_rest == SplitBatchRest::kAfterWait) {
      pdl_wait();
      load_rest();
    }
  }
  float squares = 0.0f;
  if (norm_in_epilogue) {
    if (kBulkStaging && p.stage_input_bulk) {
      if constexpr (kBulkStaging) stage_input_bulk<GemvInput::kPlain>(p, x_shared, nullptr, norm_held, &input_arrived);
      squares = sum_own_squares(p, x_shared);
    } else {
      squares = stage_raw_summing_squares<kProbes>(p, x_shared);
      __syncthreads();
    }
  } else if constexpr (kBulkStaging) {
    if (p.stage_input_bulk) {
      stage_input_bulk<In>(p, x_shared, &warp_partial[0][0], norm_held, &input_arrived);
    } else {
      stage_input<In, false, kProbes>(p, x_shared, &warp_partial[0][0], norm_held);
    }
  } else {
    stage_input<In, false, kProbes>(p, x_shared, &warp_partial[0][0], norm_held);
  }
  timeline_mark(timeline, kTimelineStaged);
  if constexpr (kSplitFirstBatch) {
    if (p.split_rest == SplitBatchRest::kAfterStaging) load_rest();
  }
  if (!p.allow_dependents_early) pdl_allow_dependents();
  if (stores && !early) epilogue = load_epilogue_inputs<Out, HasBias>(p, my_unit);
  if (timeline) {  // (measurement) thread 0's weights are in
    timeline_fold_when_ready(timeline, kTimelineWeightsIn,
                             __uint_as_float(w_low[0][0].x) + __uint_as_float(w_high[0][0].x));
  }

  // 3. The dot products, batch by batch; a buffer is refilled with the batch after next
  //    as soon as the mma has read it.
  float d_first[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d_second[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int b = 0; b < kBatches; ++b) {
    mma_batch(d_first, d_second, w_low[b % kBuffers], w_high[b % kBuffers], x_shared, p.K, warp, t, b);
    if (b + kBuffers < kBatches) {
      load_batch(w_low[b % kBuffers], w_high[b % kBuffers], p, row_low, row_high, warp, t, b + kBuffers, policy);
    }
  }
  if (t == 0) {  // every column holds the same dots: column 0's
    warp_partial[warp][g] = d_first[0] + d_second[0];
    warp_partial[warp][g + 8] = d_first[2] + d_second[2];
  }
  timeline_fold_when_ready(timeline, kTimelineFirstDot, d_first[0] + d_second[0]);  // (measurement)
  if (norm_in_epilogue) {  // the block's sum of squares meets at the barrier the dots take
    squares = warp_sum(squares);
    if (lane == 0) norm_sums[warp] = squares;
  }
  __syncthreads();

  // 4. Thread u sums unit u's rows over the warps, in warp order, and runs the epilogue.
  if (stores) {
    float acc[2] = {0.0f, 0.0f};
    constexpr int kPair = rows_per_unit<Out>() == 2;
#pragma unroll
    for (int v = 0; v < kWarps; ++v) {
      acc[0] += warp_partial[v][threadIdx.x];
      if constexpr (kPair) acc[1] += warp_partial[v][threadIdx.x + 8];
    }
    if (norm_in_epilogue) {
      float total = 0.0f;
#pragma unroll
      for (int v = 0; v < kWarps; ++v) total += norm_sums[v];
      const float inverse_rms = rsqrtf(total / float(p.K) + p.eps);
      acc[0] *= inverse_rms;
      acc[1] *= inverse_rms;
    }
    store_output_loaded<Out>(p, my_unit, acc, epilogue);
  }
  timeline_mark(timeline, kTimelineEnd);
}

// Whole rows: two blocks an SM (122 registers, ptxas -v), or, for rows of K <= 1536 when
// asked (three_per_sm), three (6 steps a warp: 48 registers of weights instead of 64).
// Longer rows stream, one block an SM. A split first batch (split) takes a whole-row
// instance of its own; decode_gemv_mma refuses it for streamed rows.
template <GemvInput In, GemvOutput Out, bool HasBias, bool kProbes, bool kSplit>
auto mma_kernel_for(int K, bool three_per_sm) {
  if (three_per_sm && K <= kMaxShortK) {
    return decode_gemv_mma_kernel<In, Out, HasBias, kShortRowSteps, 1, kProbes, 3, kSplit>;
  }
  if (kSplit || K <= kMaxMmaK) return decode_gemv_mma_kernel<In, Out, HasBias, kWholeRowSteps, 1, kProbes, 2, kSplit>;
  return decode_gemv_mma_kernel<In, Out, HasBias, kStreamBatchSteps, kStreamBatches, kProbes, 1>;
}

/// Whether a launch splits its first batch: loads_before_wait short of a warp's steps
/// (ceil(K / 32) steps dealt round the 8 warps; 6 for K = 1536). As many or more: the
/// whole row before the wait, the default instance.
bool splits_first_batch(const DecodeGemvParams& p) {
  const int steps_a_warp = ((p.K + kStepValues - 1) / kStepValues + kWarps - 1) / kWarps;
  return p.loads_before_wait > 0 && p.loads_before_wait < steps_a_warp;
}

template <GemvInput In, GemvOutput Out, bool HasBias, bool kProbes>
auto mma_kernel_for(const DecodeGemvParams& p) {
  return splits_first_batch(p) ? mma_kernel_for<In, Out, HasBias, kProbes, true>(p.K, p.mma_three_blocks_per_sm)
                               : mma_kernel_for<In, Out, HasBias, kProbes, false>(p.K, p.mma_three_blocks_per_sm);
}

template <GemvInput In, GemvOutput Out, bool HasBias>
auto mma_kernel_for(const DecodeGemvParams& p, bool probes) {
  return probes ? mma_kernel_for<In, Out, HasBias, true>(p) : mma_kernel_for<In, Out, HasBias, false>(p);
}

template <GemvInput In, GemvOutput Out>
void launch_mma(const DecodeGemvParams& p, bool pdl, cudaStream_t stream) {
  const bool probes = probes_asked(p);
  auto kernel = p.bias ? mma_kernel_for<In, Out, true>(p, probes) : mma_kernel_for<In, Out, false>(p, probes);
  const int blocks = (p.N + units_per_tile<Out>() - 1) / units_per_tile<Out>();
  launch_kernel(pdl, kernel, dim3(blocks), dim3(kThreads), size_t(p.K) * sizeof(__nv_bfloat16), stream, p);
}

template <GemvInput In>
void launch_mma_output(GemvOutput output, const DecodeGemvParams& p, bool pdl, cudaStream_t stream) {
  switch (output) {
    case GemvOutput::kBf16: launch_mma<In, GemvOutput::kBf16>(p, pdl, stream); break;
    case GemvOutput::kF32: launch_mma<In, GemvOutput::kF32>(p, pdl, stream); break;
    case GemvOutput::kSwiGLU: launch_mma<In, GemvOutput::kSwiGLU>(p, pdl, stream); break;
    case GemvOutput::kResidualAdd: launch_mma<In, GemvOutput::kResidualAdd>(p, pdl, stream); break;
    case GemvOutput::kRopeAppend: launch_mma<In, GemvOutput::kRopeAppend>(p, pdl, stream); break;
  }
}

}  // namespace

int decode_gemv_mma_max_k() { return kMaxStreamK; }

void decode_gemv_mma(GemvInput input, GemvOutput output, const DecodeGemvParams& p, bool pdl, cudaStream_t stream) {
  // Residual partials (the fused MLP's accumulator, decode_mlp_fused.cuh): QKV adds them
  // into its input (kRmsNormAddPartials -> kRopeAppend), O into its residual.
  const bool partial_input = input == GemvInput::kRmsNormAddPartials && output == GemvOutput::kRopeAppend;
  const bool partials_read = partial_input || (input == GemvInput::kPlain && output == GemvOutput::kResidualAdd);
  if ((input != GemvInput::kPlain && input != GemvInput::kRmsNorm && !partial_input) || p.K > kMaxStreamK ||
      (p.residual_partials.partials && !partials_read)) {
    throw std::invalid_argument("decode_gemv: the tensor-core kernel takes a plain or kRmsNorm input (or "
                                "kRmsNormAddPartials for kRopeAppend), K <= " + std::to_string(kMaxStreamK) +
                                " and residual partials only where it reads them; got K=" + std::to_string(p.K));
  }
  if (splits_first_batch(p) && p.K > kMaxMmaK) {
    throw std::invalid_argument("decode_gemv: the tensor-core kernel splits a whole row around the wait "
                                "(loads_before_wait), K <= " + std::to_string(kMaxMmaK) + "; got K=" +
                                std::to_string(p.K) + " (streamed rows keep two batches before it)");
  }
  if (partial_input) {
    launch_mma<GemvInput::kRmsNormAddPartials, GemvOutput::kRopeAppend>(p, pdl, stream);
  } else if (input == GemvInput::kRmsNorm) {
    launch_mma_output<GemvInput::kRmsNorm>(output, p, pdl, stream);
  } else {
    launch_mma_output<GemvInput::kPlain>(output, p, pdl, stream);
  }
}

}  // namespace bielik
