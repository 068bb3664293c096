// The streamed persistent decode step (decode_persistent.cuh): one kernel per token, and
// ONE weight stream per block that runs through every projection of every layer.
//
// Why: the graph of ~190 kernels (and the first persistent kernel, decode_step_
// persistent.cu) lose ~40% of the bandwidth at the boundaries between projections.
// There, each projection starts its weight loads only when it starts, so every
// boundary pays a drain (the last loads of one GEMV land while nothing new is asked
// for) and a ramp (the first loads of the next take a full HBM round trip). But the
// weights never depend on the activations: block b knows, before the step begins,
// every byte it will read (its rows of QKV, O, gate/up, down of layer 0, then of
// layer 1, ..., then of the lm_head). So here thread 0 of each block keeps a ring of
// shared-memory slots full with the bulk-copy engine (chapter 03's weight_stream.cuh),
// in that order, across the phase boundaries: while the grid waits at a barrier, or
// runs the attention (which reads no weights), the next projections' bytes are already
// landing. The ring is as large as shared memory allows (~170 KB a block, ~23 MB over
// the GPU, ~5 us of HBM time), enough to cover a barrier and the attention phases.
//
// A slot holds up to 8 whole units (a unit: one weight row, or the two rows a fused
// epilogue needs: gate row n and up row F + n, or the two dims RoPE rotates together),
// so a stage is ~24 KB and the per-stage __syncthreads is rare. The 8 warps split the
// stage's units (8 / units warps per unit); each lane accumulates 16-byte vectors of
// its rows against the staged input, the warps of a unit meet in shared memory, and
// the first warp of the unit runs chapter 08's epilogue (bias, RoPE + cache append,
// SwiGLU, residual add or fp32 logits: store_output_loaded, the same code as
// decode_gemv's, its global inputs loaded for all the block's units at the phase start).
//
// MEASURED SLOWER (bench_model, H200, 2026-11-29 20:4x UTC): 374 tokens/s against the
// graph's 753 and the register persistent kernel's 584. The ring is not the problem:
// bench_weight_stream streams at 96-97% of copy bandwidth through the same ring with a
// dot-product consumer, and here block 0 waits for weight slots only 5-9% of each GEMV
// phase. The consumers are: a gate/up stage of 24 KB takes ~3.3k cycles (the phase
// clock), ~4x its bytes' time, and neither the ring's depth (4 or 7 slots: same speed),
// nor polling instead of try_wait, nor loading the epilogue inputs ahead changed that;
// only bigger stages did (48 KB: 445 tokens/s). Every stage here ends in a block-wide
// barrier that waits for the slowest warp, with thread 0 both the producer and a
// finisher, so the per-stage critical path is serial. The next form to try is warp
// specialization: a producer warp, slots released by mbarrier arrivals instead of
// __syncthreads, the epilogues off the consumers' path (DECODE_LOG.md).
//
// Phases per layer, separated by grid barriers as in decode_step_persistent.cu:
// norm + QKV + RoPE + append | attention splits | merge | O + residual |
// norm + gate/up + SwiGLU | down + residual; then norm + lm_head, the argmax.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "decode_device.cuh"
#include "decode_persistent.cuh"
#include "decode_persistent_device.cuh"
#include "matmul_common.cuh"
#include "weight_stream.cuh"

namespace bielik {

using namespace decode_device;
using namespace persistent_device;

namespace {

constexpr int kMinSlotBytes = 24 * 1024;  // default stage: 8 rows of K = 1536, or 4 row pairs
constexpr int kMaxRingStages = 32;
constexpr int kBarrierBytes = kMaxRingStages * 8;  // one mbarrier per slot

// The projections in stream order: phase 4 l + kind for layer l, then the lm_head.
enum PhaseKind : int { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3, kHead = 4 };

/// What one phase streams: N units of `rows` weight rows of K values each, this block's
/// units [first_unit, end_unit) (balanced over the grid to within one unit), in stages
/// of units_per_stage units.
struct PhaseShape {
  int kind, layer;
  int N, K, rows;
  int units_per_stage;
  int first_unit, end_unit;
  int stages;
};

__device__ __forceinline__ PhaseShape phase_shape(const PersistentStep& p, int phase, int slot_bytes) {
  PhaseShape g;
  g.kind = phase == 4 * p.L ? kHead : phase % 4;
  g.layer = phase / 4;
  switch (g.kind) {
    case kQkv: g.N = (p.H + 2 * p.Hkv) * p.D / 2, g.K = p.C, g.rows = 2; break;  // rotation pairs
    case kO: g.N = p.C, g.K = p.H * p.D, g.rows = 1; break;
    case kGateUp: g.N = p.F, g.K = p.C, g.rows = 2; break;  // gate row n, up row F + n
    case kDown: g.N = p.C, g.K = p.F, g.rows = 1; break;
    default: g.N = p.V, g.K = p.C, g.rows = 1; break;
  }
  const int unit_bytes = g.rows * g.K * 2;  // the host made slot_bytes >= every unit
  g.units_per_stage = kWarps;
  while (g.units_per_stage > 1 && g.units_per_stage * unit_bytes > slot_bytes) g.units_per_stage /= 2;
  // 32-bit arithmetic (the host checks N x grid < 2^32): every thread computes this for
  // every phase, and a 64-bit division is a long software routine.
  g.first_unit = int(blockIdx.x * unsigned(g.N) / gridDim.x);
  g.end_unit = int((blockIdx.x + 1) * unsigned(g.N) / gridDim.x);
  g.stages = (g.end_unit - g.first_unit + g.units_per_stage - 1) / g.units_per_stage;
  return g;
}

constexpr int kMaxLayers = 128;  // the producer's table of weight pointers lives in shared memory
constexpr int kPrefetchedUnits = 256;  // epilogue inputs a block loads at a phase's start

// The weight matrix phase `phase` streams (phase 4 L: the lm_head).
__device__ __forceinline__ const __nv_bfloat16* phase_weight(const PersistentStep& p, int phase) {
  if (phase == 4 * p.L) return p.lm_head;
  const PersistentLayer& layer = p.layers[phase / 4];
  switch (phase % 4) {
    case kQkv: return layer.w_qkv;
    case kO: return layer.w_o;
    case kGateUp: return layer.w_gate_up;
    default: return layer.w_down;
  }
}

// Weight row r of unit n: decode_device::weight_row's layout, for a phase.
__device__ __forceinline__ int phase_row(const PersistentStep& p, const PhaseShape& g, int unit, int r) {
  if (g.kind == kQkv) {
    const int half = p.D / 2;
    return (unit / half) * p.D + unit % half + r * half;
  }
  return unit + r * g.N;
}

/// Thread 0's position in the block's stream: the next stage it will request. It walks
/// the phases in the same order as the consumers, independently of them (up to the
/// ring's depth ahead).
struct StreamProducer {
  const PersistentStep* p;
  int slot_bytes;
  // (4 L + 1) weight pointers, copied to shared memory when the kernel starts: a read of
  // p.layers at a phase change would stall thread 0, and with it the block's next barrier,
  // for an L2 round trip.
  const __nv_bfloat16* const* weights;
  int phase = 0, stage = 0;
  PhaseShape g;
  const __nv_bfloat16* W = nullptr;

  // Issues the copies of the next stage into `slot`, counted in by `barrier`.
  __device__ void operator()(int /*s*/, unsigned char* slot, uint64_t* barrier) {
    while (stage >= g.stages) {  // the phase is done (or this block has no units in it)
      ++phase;
      stage = 0;
      g = phase_shape(*p, phase, slot_bytes);
      W = weights[phase];
    }
    const int first = g.first_unit + stage * g.units_per_stage;
    const int count = min(g.units_per_stage, g.end_unit - first);
    const uint32_t row_bytes = uint32_t(g.K) * 2;
    expect_bytes(barrier, uint32_t(count * g.rows) * row_bytes);
    // Slot layout: row r of the stage's unit i at position r * count + i. Consecutive
    // units mostly have consecutive weight rows (always for O, down and the lm_head;
    // within a head for QKV; for each half of gate/up), so a run of them is ONE copy.
    // Fewer, larger copies; measured against one copy per row, the speed did not change
    // (the copies are not this kernel's limit: see the file comment).
    for (int r = 0; r < g.rows; ++r) {
      int run_start = 0;
      for (int i = 1; i <= count; ++i) {
        if (i == count || phase_row(*p, g, first + i, r) != phase_row(*p, g, first + i - 1, r) + 1) {
          copy_async_bulk(slot + size_t(r * count + run_start) * row_bytes,
                          W + size_t(phase_row(*p, g, first + run_start, r)) * g.K, (i - run_start) * row_bytes,
                          barrier);
          run_start = i;
        }
      }
    }
    ++stage;
  }
};

/// What every streamed projection of the kernel shares: the ring and its producer, the
/// count of stages consumed, and the block's shared-memory scratch.
struct StreamContext {
  const WeightStream& ring;
  StreamProducer& producer;
  int& s;                            ///< stages consumed since the kernel began
  uint4* x_shared;                   ///< (max(C, F, H D) / 8) the phase's input
  float* scratch;                    ///< (kWarps) the norm's reduction
  float (*partials)[kWarps][2];      ///< (2, kWarps, 2) per-warp row sums, by stage parity
  EpilogueInputs* prefetched;        ///< (kPrefetchedUnits)
};

/// One projection of the step: stage (and normalize) the input, then this block's stages
/// of the stream (ctx.s counts the block's stages since the kernel began).
template <GemvInput In, GemvOutput Out>
__device__ __forceinline__ void streamed_gemv(const DecodeGemvParams& gp, const PhaseShape& g, StreamContext& ctx,
                                              unsigned long long* stall_cycles) {
  const WeightStream& ring = ctx.ring;
  int& s = ctx.s;
  uint4* x_shared = ctx.x_shared;
  EpilogueInputs* prefetched = ctx.prefetched;
  constexpr int kRows = rows_per_unit<Out>();  // equals g.rows
  // Diagnostics (bench_model): block 0's thread 0 counts the cycles it waits for slots
  // and the cycles of the whole phase.
  const bool counting = stall_cycles && blockIdx.x == 0 && threadIdx.x == 0;
  const long long phase_start = counting ? clock64() : 0;
  long long waiting = 0;
  // The epilogue's global inputs (bias, residual, cos / sin) of the block's first 256
  // units, loaded by all threads at once while the input is staged, so that no finisher
  // waits for an L2 round trip at the end of a stage (which the next stage's barrier
  // would pass on to the whole block). Measured against loading them per stage: within
  // 5%, so the stage time goes elsewhere (file comment), but the global loads are off
  // the per-stage path.
  const int units = g.end_unit - g.first_unit;
  for (int i = threadIdx.x; i < min(units, kPrefetchedUnits); i += kThreads) {
    prefetched[i] = gp.bias ? load_epilogue_inputs<Out, true>(gp, g.first_unit + i)
                            : load_epilogue_inputs<Out, false>(gp, g.first_unit + i);
  }
  uint4 norm_held[kNormHeld];
  load_norm_weight<In>(gp, norm_held);
  stage_input<In, true>(gp, x_shared, ctx.scratch, norm_held);  // ends with __syncthreads
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int warps_per_unit = kWarps / g.units_per_stage;
  const int slot_unit = warp / warps_per_unit, part = warp % warps_per_unit;
  const int vectors = gp.K / 8;
  for (int stage = 0; stage < g.stages; ++stage, ++s) {
    const int first = g.first_unit + stage * g.units_per_stage;
    const int count = min(g.units_per_stage, g.end_unit - first);  // the last stage may be short
    const int unit = first + slot_unit;
    const bool valid = slot_unit < count;
    const bool finisher = valid && part == 0 && lane == 0;  // runs the unit's epilogue
    // Units past the prefetched ones (a vocabulary over 256 x SMs with a biased head):
    // loaded now, at the stage's start, so that the weights' wait covers some of it.
    EpilogueInputs epilogue;
    if (finisher && unit - g.first_unit >= kPrefetchedUnits) {
      epilogue = gp.bias ? load_epilogue_inputs<Out, true>(gp, unit) : load_epilogue_inputs<Out, false>(gp, unit);
    }
    float acc[2] = {0.0f, 0.0f};
    const long long wait_start = counting ? clock64() : 0;
    ring.wait(s);
    if (counting) waiting += clock64() - wait_start;
    if (valid) {
      // Row r of this unit: slot position r * count + slot_unit (the producer's layout).
      const uint4* rows = reinterpret_cast<const uint4*>(ring.stage(s)) + size_t(slot_unit) * vectors;
      const size_t row_stride = size_t(count) * vectors;
      for (int c = part * 32 + lane; c < vectors; c += 32 * warps_per_unit) {
        const uint4 xv = x_shared[c];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = dot_8(rows[r * row_stride + c], xv, acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);
    // Partials double-buffered by stage parity: the ones of stage s are rewritten at
    // stage s + 2, after the barrier of stage s + 1, which every reader has passed.
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) ctx.partials[s & 1][warp][r] = acc[r];
    }
    __syncthreads();  // the slot is free, the partials are visible
    ring.refill(s, ctx.producer);
    if (finisher) {
      float total[2] = {0.0f, 0.0f};
      for (int q = 0; q < warps_per_unit; ++q) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) total[r] += ctx.partials[s & 1][warp + q][r];
      }
      store_output_loaded<Out>(gp, unit, total,
                               unit - g.first_unit < kPrefetchedUnits ? prefetched[unit - g.first_unit] : epilogue);
    }
  }
  if (counting) {
    stall_cycles[0] += waiting;
    stall_cycles[1] += clock64() - phase_start;
  }
}

template <int D, int G>
__global__ void __launch_bounds__(kThreads, 1)
    decode_step_streamed_kernel(PersistentStep p, int slot_bytes, int ring_stages, int x_bytes) {
  // Shared memory: the slot barriers | the phase's input vector | the ring.
  extern __shared__ __align__(128) unsigned char shared[];
  int mark = 0;
  mark_phase(p, mark);
  uint64_t* barriers = reinterpret_cast<uint64_t*>(shared);
  uint4* x_shared = reinterpret_cast<uint4*>(shared + kBarrierBytes);
  unsigned char* ring_memory = shared + kBarrierBytes + x_bytes;
  __shared__ float scratch[kWarps];
  __shared__ float partials[2][kWarps][2];
  __shared__ const __nv_bfloat16* stream_weights[4 * kMaxLayers + 1];
  // Raw storage: a __shared__ array of a type with default member initializers is not allowed.
  __shared__ __align__(16) unsigned char prefetched_storage[kPrefetchedUnits * sizeof(EpilogueInputs)];
  EpilogueInputs* prefetched = reinterpret_cast<EpilogueInputs*>(prefetched_storage);
  const int C = p.C, QKV_PAIRS = (p.H + 2 * p.Hkv) * D / 2;
  for (int phase = threadIdx.x; phase <= 4 * p.L; phase += kThreads) stream_weights[phase] = phase_weight(p, phase);

  // The stream: every stage of every phase, in the order the phases run.
  int total = 0;
  for (int phase = 0; phase <= 4 * p.L; ++phase) total += phase_shape(p, phase, slot_bytes).stages;
  __syncthreads();  // stream_weights is complete
  StreamProducer producer{&p, slot_bytes, stream_weights};
  producer.g = phase_shape(p, 0, slot_bytes);
  producer.W = stream_weights[0];
  WeightStream ring;
  ring.init(ring_memory, barriers, ring_stages, slot_bytes, total);
  ring.prefill(producer);  // thread 0: the first ~170 KB, before anything else
  __syncthreads();         // the barriers are initialized before anyone waits on them

  // 0. The embedding row of this step's token (written by the previous step's argmax).
  {
    const int token = min(max(__ldcg(p.token), 0), p.V - 1);  // -1 (NaN last step): row 0
    const uint4* row = reinterpret_cast<const uint4*>(p.embed + size_t(token) * C);
    for (int c = blockIdx.x * kThreads + threadIdx.x; c < C / 8; c += gridDim.x * kThreads) {
      reinterpret_cast<uint4*>(p.x)[c] = __ldg(row + c);
    }
  }
  end_phase(p, mark);

  // (5 kinds, 2): cycles waited for slots, cycles of the phases, after the 6 L + 3 times.
  auto stall = [&](int kind) { return p.phase_clock ? p.phase_clock + 6 * p.L + 3 + 2 * kind : nullptr; };
  int s = 0;  // stages consumed
  StreamContext ctx{ring, producer, s, x_shared, scratch, partials, prefetched};
  PersistentLayer layer = p.layers[0];
  for (int l = 0; l < p.L; ++l) {
    // The next layer's pointers are loaded now and used a layer later, off the critical path.
    const PersistentLayer next_layer = p.layers[min(l + 1, p.L - 1)];
    DecodeGemvParams qkv{p.q, p.x, layer.input_norm, layer.w_qkv, layer.b_qkv, QKV_PAIRS, C, p.eps};
    qkv.rope = RopeAppendTarget{layer.k_cache, layer.v_cache, p.d_length, p.cos, p.sin, p.H, p.Hkv, D,
                                p.max_context, p.max_positions};
    streamed_gemv<GemvInput::kRmsNorm, GemvOutput::kRopeAppend>(qkv, phase_shape(p, 4 * l + kQkv, slot_bytes), ctx,
                                                                stall(kQkv));
    end_phase(p, mark);

    attention_splits<D, G>(p, layer);
    end_phase(p, mark);
    merge_splits<D>(p);
    end_phase(p, mark);

    const DecodeGemvParams o{p.x, p.attn, nullptr, layer.w_o, layer.b_o, C, p.H * D, p.eps};
    streamed_gemv<GemvInput::kPlain, GemvOutput::kResidualAdd>(o, phase_shape(p, 4 * l + kO, slot_bytes), ctx,
                                                               stall(kO));
    end_phase(p, mark);

    const DecodeGemvParams gate_up{p.act, p.x, layer.post_norm, layer.w_gate_up, layer.b_gate_up, p.F, C, p.eps};
    streamed_gemv<GemvInput::kRmsNorm, GemvOutput::kSwiGLU>(gate_up, phase_shape(p, 4 * l + kGateUp, slot_bytes), ctx,
                                                            stall(kGateUp));
    end_phase(p, mark);

    const DecodeGemvParams down{p.x, p.act, nullptr, layer.w_down, layer.b_down, C, p.F, p.eps};
    streamed_gemv<GemvInput::kPlain, GemvOutput::kResidualAdd>(down, phase_shape(p, 4 * l + kDown, slot_bytes), ctx,
                                                               stall(kDown));
    end_phase(p, mark);
    layer = next_layer;
  }

  const DecodeGemvParams head{p.logits, p.x, p.final_norm, p.lm_head, nullptr, p.V, C, p.eps};
  streamed_gemv<GemvInput::kRmsNorm, GemvOutput::kF32>(head, phase_shape(p, 4 * p.L, slot_bytes), ctx, stall(kHead));
  // Every stage requested has been consumed here (s == total): no copy is still in
  // flight into this block's shared memory when it exits.
  end_phase(p, mark);
  if (blockIdx.x == 0) block_argmax_commit<kThreads>(p.token, p.logits, p.V, p.d_length);
}

using StepKernel = void (*)(PersistentStep, int, int, int);

template <int D>
StepKernel kernel_for(int G) {
  return decode::kernel_for_group(G, "streamed decode", [](auto group) -> StepKernel {
    return decode_step_streamed_kernel<D, decltype(group)::value>;
  });
}

StepKernel kernel_for(const PersistentStep& step) {
  return step.D == 128 ? kernel_for<128>(step.H / step.Hkv) : kernel_for<64>(step.H / step.Hkv);
}

size_t round_up_128(size_t bytes) { return (bytes + 127) / 128 * 128; }

}  // namespace

bool decode_step_streamed_supported(int D, int H, int Hkv) {
  return decode_step_persistent_supported(D, H, Hkv) && weight_stream_supported();
}

StreamedStepLayout decode_step_streamed_layout(const PersistentStep& step, int ring_stages, int min_slot_bytes) {
  if (!decode_step_streamed_supported(step.D, step.H, step.Hkv) || step.splits < 1 || step.splits > kMaxSplits ||
      step.C % 8 != 0 || step.F % 8 != 0 || !step.layers || !step.barrier || ring_stages < 0 || ring_stages == 1 ||
      min_slot_bytes < 0 || step.L < 1 || step.L > kMaxLayers ||
      (unsigned long long)std::max({step.V, step.F, step.C}) * multiprocessor_count() >= (1ull << 32)) {
    throw std::invalid_argument("streamed decode: unsupported device or shape, or missing buffers (D=" +
                                std::to_string(step.D) + " H=" + std::to_string(step.H) +
                                " Hkv=" + std::to_string(step.Hkv) + " splits=" + std::to_string(step.splits) +
                                " L=" + std::to_string(step.L) + " (at most " + std::to_string(kMaxLayers) + ") ring stages=" + std::to_string(ring_stages) + " slot bytes=" + std::to_string(min_slot_bytes) + ")");
  }
  StreamedStepLayout layout;
  // A slot holds at least one unit of every phase: a QKV or gate/up row pair, a down row.
  const size_t largest_unit = std::max({size_t(4) * step.C, size_t(2) * step.H * step.D, size_t(2) * step.F});
  const size_t wanted = min_slot_bytes > 0 ? size_t(min_slot_bytes) : size_t(kMinSlotBytes);
  layout.slot_bytes = int(round_up_128(std::max(wanted, largest_unit)));
  layout.x_bytes = int(round_up_128(size_t(std::max({step.C, step.F, step.H * step.D})) * 2));
  const StepKernel kernel = kernel_for(step);
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const long long room = (long long)optin - (long long)attributes.sharedSizeBytes - kBarrierBytes - layout.x_bytes;
  const int most = int(std::min<long long>(kMaxRingStages, room / layout.slot_bytes));
  if (most < 2) {
    throw std::invalid_argument("streamed decode: shared memory holds fewer than 2 slots of " +
                                std::to_string(layout.slot_bytes) + " bytes (C=" + std::to_string(step.C) +
                                " F=" + std::to_string(step.F) + ")");
  }
  layout.ring_stages = ring_stages == 0 ? most : std::min(ring_stages, most);
  layout.shared_bytes = size_t(kBarrierBytes) + layout.x_bytes + size_t(layout.ring_stages) * layout.slot_bytes;
  // Allow the kernel the most dynamic shared memory any layout can ask for (not this
  // layout's size: a model with a smaller ring must not shrink another's limit).
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  optin - int(attributes.sharedSizeBytes)));
  int blocks_per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, kThreads, layout.shared_bytes));
  if (blocks_per_sm < 1) throw std::invalid_argument("streamed decode: a block does not fit on an SM");
  return layout;
}

void decode_step_streamed(const PersistentStep& step, const StreamedStepLayout& layout, cudaStream_t stream) {
  if (layout.ring_stages < 2 || layout.slot_bytes <= 0 || layout.shared_bytes == 0) {
    throw std::invalid_argument("streamed decode: the layout is not from decode_step_streamed_layout");
  }
  // One block per SM, each with the whole ring.
  launch_cooperative(kernel_for(step), multiprocessor_count(), layout.shared_bytes, stream, step, layout.slot_bytes,
                     layout.ring_stages, layout.x_bytes);
}

}  // namespace bielik
