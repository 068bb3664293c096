// The streamed persistent decode step (decode_persistent.cuh): one kernel per token, and
// one weight stream per WARP that runs through every projection of every layer.
//
// Why: the graph of ~190 kernels (and the first persistent kernel, decode_step_
// persistent.cu) lose ~30% of the bandwidth at the boundaries between projections.
// There, each projection starts its weight loads only when it starts, so every
// boundary pays a drain (the last loads of one GEMV land while nothing new is asked
// for) and a ramp (the first loads of the next take a full HBM round trip). But the
// weights never depend on the activations: every warp knows, before the step begins,
// every byte it will read (its rows of QKV, O, gate/up, down of layer 0, then of layer
// 1, ..., then of the lm_head). So each warp keeps its own small ring of shared-memory
// slots full with the bulk-copy engine (cp.async.bulk), in that order, across the phase
// boundaries: while the grid waits at a barrier, or runs the attention (which reads no
// weights), the next projections' bytes are already landing. The rings together hold
// as much as shared memory allows (~150 KB a block, ~20 MB over the GPU, ~5 us of HBM
// time), enough to cover a barrier and the attention phases.
//
// The first form of this kernel (commit 0670b2e and before) had ONE ring per block,
// filled by thread 0, and every stage of ~24 KB shared by the 8 warps: a block-wide
// barrier per stage, the warps of a unit meeting in shared memory, thread 0 both the
// producer and a finisher. It streamed at ~43% of the bandwidth (374 tokens/s against
// the graph's 753): the per-stage critical path was serial (DECODE_LOG.md, fourth and
// twentieth sessions). Here nothing is shared per stage:
//   * each warp owns a contiguous range of the block's units (a unit: one weight row, or
//     the two rows a fused epilogue needs: gate row n and up row F + n, or the two dims
//     RoPE rotates together) and its own slots, one mbarrier each;
//   * a stage is as many whole units as a slot holds, or, for a unit larger than a slot
//     (down's 17.5 KB rows), one chunk of its columns; the accumulators carry over;
//   * the warp waits for its slot, dots the stage against the staged input, sums each
//     finished unit with shuffles, and the lane that holds the unit's epilogue inputs
//     (loaded one unit per lane at the phase's start) stores the output; then its lane 0
//     requests the warp's stage S slots later into the freed slot. No __syncthreads
//     between stages: a warp that waits for its bytes stalls no other.
//
// MEASURED SLOWER (bench_model, H200, 2026-12-02): 551-560 tokens/s against the graph's
// 957-962 (the one-ring form: 374). Lane 0 spends 30-42% of the big phases inside
// cp.async.bulk while its warp waits for it (our reading: the SM's copy queue is full),
// and the six grid barriers a layer leave ~21 us of critical path a layer in the small
// phases, which no ring of ~5 us of bytes can hide. DECODE_LOG.md, twentieth session,
// has the tables and the two changes a faster form needs (a producer warp; per-head
// counters instead of most grid barriers).
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

constexpr int kDefaultSlotBytes = 6 * 1024;  // a gate/up or QKV row pair of K = 1536, two O rows
constexpr int kMaxWarpSlots = 16;
constexpr int kBarrierBytes = kWarps * kMaxWarpSlots * 8;  // one mbarrier per slot
constexpr int kHeldUnits = 32;  // a warp's units whose epilogue inputs are loaded at the phase's start

// The projections in stream order: phase 4 l + kind for layer l, then the lm_head.
enum PhaseKind : int { kQkv = 0, kO = 1, kGateUp = 2, kDown = 3, kHead = 4 };

/// What one warp streams in one phase: the phase has N units of `rows` weight rows of K
/// values each; this warp's units are [first_unit, end_unit) (the block's share, balanced
/// over the grid to within one unit, split over the block's warps the same way). A stage
/// is units_per_stage whole units (chunks == 1), or one chunk of chunk_k columns of one
/// unit (chunks > 1: the unit is larger than a slot).
struct PhaseShape {
  int kind, layer;
  int N, K, rows;
  int first_unit, end_unit;
  int units_per_stage;
  int chunks, chunk_k;
  int stages;
};

__device__ __forceinline__ PhaseShape phase_shape(const PersistentStep& p, int phase, int slot_bytes, int warp) {
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
  // 32-bit arithmetic (the host checks N x grid < 2^32): every thread computes this for
  // every phase, and a 64-bit division is a long software routine.
  const int block_first = int(blockIdx.x * unsigned(g.N) / gridDim.x);
  const int block_units = int((blockIdx.x + 1) * unsigned(g.N) / gridDim.x) - block_first;
  g.first_unit = block_first + warp * block_units / kWarps;
  g.end_unit = block_first + (warp + 1) * block_units / kWarps;
  const int units = g.end_unit - g.first_unit;
  // The widest chunk a slot holds, a multiple of 8 columns (16-byte copies).
  const int widest = (slot_bytes / (2 * g.rows)) & ~7;
  if (g.K <= widest) {
    g.chunks = 1;
    g.chunk_k = g.K;
    g.units_per_stage = slot_bytes / (2 * g.rows * g.K);
    g.stages = (units + g.units_per_stage - 1) / g.units_per_stage;
  } else {
    const int fewest = (g.K + widest - 1) / widest;
    g.chunk_k = ((g.K + fewest - 1) / fewest + 7) & ~7;  // balanced chunks, still <= widest
    g.chunks = (g.K + g.chunk_k - 1) / g.chunk_k;          // so that no chunk is empty
    g.units_per_stage = 1;
    g.stages = units * g.chunks;
  }
  return g;
}

/// One stage: units [first, first + count), columns [k0, k0 + klen).
struct StageSpan {
  int first, count, k0, klen;
};

__device__ __forceinline__ StageSpan stage_span(const PhaseShape& g, int stage) {
  StageSpan s;
  if (g.chunks == 1) {
    s.first = g.first_unit + stage * g.units_per_stage;
    s.count = min(g.units_per_stage, g.end_unit - s.first);
    s.k0 = 0;
    s.klen = g.K;
  } else {
    s.first = g.first_unit + stage / g.chunks;
    s.count = 1;
    s.k0 = (stage % g.chunks) * g.chunk_k;
    s.klen = min(g.chunk_k, g.K - s.k0);
  }
  return s;
}

constexpr int kMaxLayers = 128;  // the table of weight pointers lives in shared memory

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

/// A warp's slots: slot s % slots of its s-th stage, counted in by its own mbarrier.
struct WarpRing {
  unsigned char* memory;  ///< (slots, slot_bytes)
  uint64_t* barriers;     ///< (slots)
  int slots, slot_bytes;

  __device__ unsigned char* slot(int s) const { return memory + size_t(s % slots) * slot_bytes; }
  __device__ uint64_t* barrier(int s) const { return barriers + s % slots; }
  /// Slot s % slots is on its (s / slots)-th use: the phase to wait for has that parity.
  __device__ void wait(int s) const { stream_ptx::barrier_wait(barrier(s), uint32_t(s / slots) & 1u); }
};

/// Lane 0's position in its warp's stream: the next stage it will request. It walks the
/// phases in the same order as the warp consumes them, up to the ring's depth ahead.
struct WarpRequester {
  const PersistentStep* p;
  // (4 L + 1) weight pointers, copied to shared memory when the kernel starts: a read of
  // p.layers at a phase change would stall the request for an L2 round trip.
  const __nv_bfloat16* const* weights;
  int slot_bytes, warp;
  int phase = 0, stage = 0;
  PhaseShape g;

  /// Issues the copies of the warp's next stage into the slot of its s-th stage; nothing
  /// once the stream is over.
  __device__ void request(const WarpRing& ring, int s) {
    while (stage >= g.stages) {  // the phase is done (or this warp has no units in it)
      if (phase == 4 * p->L) return;
      ++phase;
      stage = 0;
      g = phase_shape(*p, phase, slot_bytes, warp);
    }
    const StageSpan span = stage_span(g, stage++);
    const __nv_bfloat16* W = weights[phase];
    uint64_t* barrier = ring.barrier(s);
    unsigned char* slot = ring.slot(s);
    const uint32_t chunk_bytes = uint32_t(span.klen) * 2;
    expect_bytes(barrier, uint32_t(span.count * g.rows) * chunk_bytes);
    // Slot layout: row r of the stage's unit i at position r * count + i (klen values
    // each). Whole units mostly have consecutive weight rows (always for O, down and the
    // lm_head; within a head for QKV; for each half of gate/up), so a run of them is ONE
    // copy.
    for (int r = 0; r < g.rows; ++r) {
      if (span.klen != g.K) {  // one chunk of one unit's row
        copy_async_bulk(slot + size_t(r) * chunk_bytes,
                        W + size_t(phase_row(*p, g, span.first, r)) * g.K + span.k0, chunk_bytes, barrier);
        continue;
      }
      int run_start = 0;
      for (int i = 1; i <= span.count; ++i) {
        if (i == span.count || phase_row(*p, g, span.first + i, r) != phase_row(*p, g, span.first + i - 1, r) + 1) {
          copy_async_bulk(slot + size_t(r * span.count + run_start) * chunk_bytes,
                          W + size_t(phase_row(*p, g, span.first + run_start, r)) * g.K, (i - run_start) * chunk_bytes,
                          barrier);
          run_start = i;
        }
      }
    }
  }
};

/// What every streamed projection of the kernel shares: the warp's ring, its requester
/// and stages consumed, and the block's shared-memory scratch.
struct StreamContext {
  const WarpRing& ring;
  WarpRequester& requester;
  int& s;            ///< stages this warp consumed since the kernel began
  uint4* x_shared;   ///< (max(C, F, H D) / 8) the phase's input
  float* scratch;    ///< (kWarps) the norm's reduction
};

/// One projection of the step: stage (and normalize) the input with the whole block,
/// then each warp runs through its own stages of the stream.
template <GemvInput In, GemvOutput Out>
__device__ __forceinline__ void streamed_gemv(const DecodeGemvParams& gp, const PhaseShape& g, StreamContext& ctx,
                                              unsigned long long* stall_cycles, unsigned long long* block_ns) {
  const WarpRing& ring = ctx.ring;
  int& s = ctx.s;
  constexpr int kRows = rows_per_unit<Out>();  // equals g.rows
  const int lane = threadIdx.x % 32;
  // Diagnostics (bench_model): block 0's thread 0 counts the cycles it waits for slots,
  // the cycles it spends requesting stages, and the cycles of the whole phase.
  const bool counting = stall_cycles && blockIdx.x == 0 && threadIdx.x == 0;
  const long long phase_start = counting ? clock64() : 0;
  const unsigned long long block_start = block_ns ? globaltimer_ns() : 0;
  long long waiting = 0, requesting = 0;
  // The epilogue's global inputs (bias, residual, cos / sin) of the warp's first 32
  // units, one unit per lane, loaded while the input is staged: the lane that holds them
  // stores that unit's output, so no epilogue waits for an L2 round trip.
  const int units = g.end_unit - g.first_unit;
  EpilogueInputs held;
  if (lane < units) {
    held = gp.bias ? load_epilogue_inputs<Out, true>(gp, g.first_unit + lane)
                   : load_epilogue_inputs<Out, false>(gp, g.first_unit + lane);
  }
  uint4 norm_held[kNormHeld];
  load_norm_weight<In>(gp, norm_held);
  stage_input<In, true>(gp, ctx.x_shared, ctx.scratch, norm_held);  // ends with __syncthreads
  float acc[2] = {0.0f, 0.0f};
  for (int stage = 0; stage < g.stages; ++stage, ++s) {
    const StageSpan span = stage_span(g, stage);
    const long long wait_start = counting ? clock64() : 0;
    ring.wait(s);
    if (counting) waiting += clock64() - wait_start;
    const uint4* slot = reinterpret_cast<const uint4*>(ring.slot(s));
    const uint4* x = ctx.x_shared + span.k0 / 8;
    const int vectors = span.klen / 8;
    const bool unit_ends = span.k0 + span.klen == g.K;
    for (int i = 0; i < span.count; ++i) {
#pragma unroll 3
      for (int c = lane; c < vectors; c += 32) {
        const uint4 xv = x[c];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = dot_8(slot[size_t(r * span.count + i) * vectors + c], xv, acc[r]);
      }
      if (unit_ends) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = warp_sum(acc[r]);  // every lane has the sums
        const int unit = span.first + i, j = unit - g.first_unit;
        if (lane == (j & 31)) {
          EpilogueInputs in = held;
          if (j >= kHeldUnits) {  // more units than lanes (a vocabulary over 256 x SMs)
            in = gp.bias ? load_epilogue_inputs<Out, true>(gp, unit) : load_epilogue_inputs<Out, false>(gp, unit);
          }
          store_output_loaded<Out>(gp, unit, acc, in);
        }
        acc[0] = acc[1] = 0.0f;
      }
    }
    __syncwarp();  // every lane is done with the slot
    if (lane == 0) {
      const long long request_start = counting ? clock64() : 0;
      ctx.requester.request(ring, s + ring.slots);
      if (counting) requesting += clock64() - request_start;
    }
  }
  if (counting) {
    stall_cycles[0] += waiting;
    stall_cycles[1] += requesting;
    stall_cycles[2] += clock64() - phase_start;
  }
  if (block_ns) {  // every block: from its phase start to its last warp's last output
    __syncthreads();
    if (threadIdx.x == 0) *block_ns += globaltimer_ns() - block_start;
  }
}

template <int D, int G>
__global__ void __launch_bounds__(kThreads, 1)
    decode_step_streamed_kernel(PersistentStep p, int slot_bytes, int warp_slots, int x_bytes) {
  // Shared memory: the slot barriers | the phase's input vector | the warps' rings.
  extern __shared__ __align__(128) unsigned char shared[];
  int mark = 0;
  mark_phase(p, mark);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  uint64_t* barriers = reinterpret_cast<uint64_t*>(shared);
  uint4* x_shared = reinterpret_cast<uint4*>(shared + kBarrierBytes);
  unsigned char* ring_memory = shared + kBarrierBytes + x_bytes;
  __shared__ float scratch[kWarps];
  __shared__ const __nv_bfloat16* stream_weights[4 * kMaxLayers + 1];
  const int C = p.C, QKV_PAIRS = (p.H + 2 * p.Hkv) * D / 2;
  for (int phase = threadIdx.x; phase <= 4 * p.L; phase += kThreads) stream_weights[phase] = phase_weight(p, phase);
  if (threadIdx.x == 0) {
    for (int i = 0; i < kWarps * warp_slots; ++i) stream_ptx::barrier_init(&barriers[i], 1);
    stream_ptx::barrier_init_fence();
  }
  __syncthreads();  // stream_weights is complete, the barriers are initialized

  const WarpRing ring{ring_memory + size_t(warp) * warp_slots * slot_bytes, barriers + warp * warp_slots, warp_slots,
                      slot_bytes};
  WarpRequester requester{&p, stream_weights, slot_bytes, warp};
  requester.g = phase_shape(p, 0, slot_bytes, warp);
  if (lane == 0) {  // the warp's first stages, before anything else
    for (int s = 0; s < warp_slots; ++s) requester.request(ring, s);
  }

  // 0. The embedding row of this step's token (written by the previous step's argmax).
  {
    const int token = min(max(__ldcg(p.token), 0), p.V - 1);  // -1 (NaN last step): row 0
    const uint4* row = reinterpret_cast<const uint4*>(p.embed + size_t(token) * C);
    for (int c = blockIdx.x * kThreads + threadIdx.x; c < C / 8; c += gridDim.x * kThreads) {
      reinterpret_cast<uint4*>(p.x)[c] = __ldg(row + c);
    }
  }
  end_phase(p, mark);

  // (5 kinds, 3): cycles waited for slots, spent requesting, of the phases; after the 6 L + 3 times.
  auto stall = [&](int kind) { return p.phase_clock ? p.phase_clock + 6 * p.L + 3 + 3 * kind : nullptr; };
  // (5 kinds, grid): each block's ns in its share of each phase, after those.
  auto block_ns = [&](int kind) {
    return p.phase_clock ? p.phase_clock + 6 * p.L + 18 + size_t(kind) * gridDim.x + blockIdx.x : nullptr;
  };
  int s = 0;  // stages this warp consumed
  StreamContext ctx{ring, requester, s, x_shared, scratch};
  PersistentLayer layer = p.layers[0];
  for (int l = 0; l < p.L; ++l) {
    // The next layer's pointers are loaded now and used a layer later, off the critical path.
    const PersistentLayer next_layer = p.layers[min(l + 1, p.L - 1)];
    DecodeGemvParams qkv{p.q, p.x, layer.input_norm, layer.w_qkv, layer.b_qkv, QKV_PAIRS, C, p.eps};
    qkv.rope = RopeAppendTarget{layer.k_cache, layer.v_cache, p.d_length, p.cos, p.sin, p.H, p.Hkv, D,
                                p.max_context, p.max_positions};
    streamed_gemv<GemvInput::kRmsNorm, GemvOutput::kRopeAppend>(
        qkv, phase_shape(p, 4 * l + kQkv, slot_bytes, warp), ctx, stall(kQkv), block_ns(kQkv));
    end_phase(p, mark);

    attention_splits<D, G>(p, layer);
    end_phase(p, mark);
    merge_splits<D>(p);
    end_phase(p, mark);

    const DecodeGemvParams o{p.x, p.attn, nullptr, layer.w_o, layer.b_o, C, p.H * D, p.eps};
    streamed_gemv<GemvInput::kPlain, GemvOutput::kResidualAdd>(o, phase_shape(p, 4 * l + kO, slot_bytes, warp), ctx,
                                                               stall(kO), block_ns(kO));
    end_phase(p, mark);

    const DecodeGemvParams gate_up{p.act, p.x, layer.post_norm, layer.w_gate_up, layer.b_gate_up, p.F, C, p.eps};
    streamed_gemv<GemvInput::kRmsNorm, GemvOutput::kSwiGLU>(
        gate_up, phase_shape(p, 4 * l + kGateUp, slot_bytes, warp), ctx, stall(kGateUp), block_ns(kGateUp));
    end_phase(p, mark);

    const DecodeGemvParams down{p.x, p.act, nullptr, layer.w_down, layer.b_down, C, p.F, p.eps};
    streamed_gemv<GemvInput::kPlain, GemvOutput::kResidualAdd>(
        down, phase_shape(p, 4 * l + kDown, slot_bytes, warp), ctx, stall(kDown), block_ns(kDown));
    end_phase(p, mark);
    layer = next_layer;
  }

  const DecodeGemvParams head{p.logits, p.x, p.final_norm, p.lm_head, nullptr, p.V, C, p.eps};
  streamed_gemv<GemvInput::kRmsNorm, GemvOutput::kF32>(head, phase_shape(p, 4 * p.L, slot_bytes, warp), ctx,
                                                       stall(kHead), block_ns(kHead));
  // Every stage requested has been consumed here: no copy is still in flight into this
  // block's shared memory when it exits.
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
      step.C % 8 != 0 || step.F % 8 != 0 || !step.layers || !step.barrier || ring_stages < 0 ||
      min_slot_bytes < 0 || step.L < 1 || step.L > kMaxLayers ||
      (unsigned long long)std::max({step.V, step.F, step.C}) * multiprocessor_count() >= (1ull << 32)) {
    throw std::invalid_argument("streamed decode: unsupported device or shape, or missing buffers (D=" +
                                std::to_string(step.D) + " H=" + std::to_string(step.H) +
                                " Hkv=" + std::to_string(step.Hkv) + " splits=" + std::to_string(step.splits) +
                                " L=" + std::to_string(step.L) + " (at most " + std::to_string(kMaxLayers) + ") ring stages=" + std::to_string(ring_stages) + " slot bytes=" + std::to_string(min_slot_bytes) + ")");
  }
  StreamedStepLayout layout;
  // Any slot of 128 bytes or more works: a unit larger than a slot streams in chunks.
  const size_t wanted = min_slot_bytes > 0 ? size_t(min_slot_bytes) : size_t(kDefaultSlotBytes);
  layout.slot_bytes = int(round_up_128(wanted));
  layout.x_bytes = int(round_up_128(size_t(std::max({step.C, step.F, step.H * step.D})) * 2));
  const StepKernel kernel = kernel_for(step);
  cudaFuncAttributes attributes{};
  CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  int device = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const long long room = (long long)optin - (long long)attributes.sharedSizeBytes - kBarrierBytes - layout.x_bytes;
  const int most = int(std::min<long long>(kMaxWarpSlots, room / (kWarps * (long long)layout.slot_bytes)));
  if (most < 1) {
    throw std::invalid_argument("streamed decode: shared memory holds no slot of " +
                                std::to_string(layout.slot_bytes) + " bytes a warp (C=" + std::to_string(step.C) +
                                " F=" + std::to_string(step.F) + ")");
  }
  layout.ring_stages = ring_stages == 0 ? most : std::min(ring_stages, most);
  layout.shared_bytes =
      size_t(kBarrierBytes) + layout.x_bytes + size_t(kWarps) * layout.ring_stages * layout.slot_bytes;
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
  if (layout.ring_stages < 1 || layout.slot_bytes <= 0 || layout.shared_bytes == 0) {
    throw std::invalid_argument("streamed decode: the layout is not from decode_step_streamed_layout");
  }
  // One block per SM, each warp with its own ring.
  launch_cooperative(kernel_for(step), multiprocessor_count(), layout.shared_bytes, stream, step, layout.slot_bytes,
                     layout.ring_stages, layout.x_bytes);
}

}  // namespace bielik
