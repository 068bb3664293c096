/// @file decode_gemv_register_kernels.cuh
/// @brief The register GEMV (decode_gemv's default kernel, decode_kernels.cuh): its kernel
/// templates and launchers, included only by the decode_gemv_register_*.cu files.
///
/// Each of those files compiles the forms of one or two inputs (explicit instantiations of
/// register_gemv::launch, declared in decode_gemv_register.cuh). A form is many kernel
/// instances (bias or not, the batch sizes, lean and probed, the split first batch, the
/// pipelined kernel), ~100 in all: in one file they took nvcc ~4 minutes, the longest
/// step of every build; split, the files compile side by side.
#pragma once

// decode_gemv is chapter 03's GEMV idea (a warp streams a weight row with 16-byte
// loads, several in flight) with three things added for the decode step:
//  * Prologue: each block stages the input vector in shared memory, and for kRmsNorm
//    normalizes it there (a block reduction of the sum of squares). The vector is tiny
//    (C = 1536 values, 3 KB, an L2 hit), so recomputing the norm in every block costs
//    less than a separate norm kernel's launch and drain. (With the norm weight folded
//    into W, DecodeGemvParams::norm_in_epilogue, x is staged as it is, each warp sums its
//    squares inside its first row's dots, and the epilogue applies the inverse RMS.)
//  * Epilogue: the bias, and then the residual add or the SwiGLU, on the accumulator
//    before it is stored: no (1, C) or (1, 2F) intermediate goes through memory.
//  * PDL: the first batch of weight loads is issued BEFORE griddepcontrol.wait. For the
//    small matrices (QKV 2048 x 1536, O 1536 x 1536) one batch is a warp's whole row, so
//    their weights are already in registers when the previous kernel finishes.

#include <algorithm>
#include <climits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "cuda_check.cuh"
#include "decode_device.cuh"
#include "decode_gemv_register.cuh"
#include "decode_kernels.cuh"
#include "embedding_row.cuh"  // chapter 01: the row copy
#include "matmul_common.cuh"

namespace bielik {
namespace register_gemv {

using namespace decode_device;

constexpr int kMaxK = kDecodeGemvMaxK;  // K bf16 values of shared memory: 32 KB, under the 48 KB default

// DecodeGemvParams::argmax (ArgmaxFold), at the end of an lm_head block: the block's best
// row goes to block_best, and the last block to finish chooses among all blocks' and
// commits, as decode_argmax does after the GEMV. The classic last-block reduction: each
// block's thread 0 writes its best, fences (so that the best is visible to every block
// before the count is), then counts; the one that counts last sees every best.
template <int kBlockThreads>
__device__ __forceinline__ void fold_argmax(const ArgmaxFold& f, const ArgmaxState& rows_best, int V) {
  __shared__ bool s_last;
  const ArgmaxState block = block_reduce_argmax<kBlockThreads>(rows_best);
  if (threadIdx.x == 0) {
    // row -2 marks a NaN; a block without rows sends (-inf, INT_MAX), which never wins.
    f.block_best[blockIdx.x] =
        block.nan ? make_int2(0, -2) : make_int2(__float_as_int(block.best), block.best_index);
    __threadfence();
    s_last = atomicAdd(f.blocks_done, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Blocks cover rising row ranges, so a thread's bests (block b, b + kBlockThreads, ...)
  // come in rising row order, which consider's first-maximum rule needs. kBatch loads
  // are asked for before any is compared: one trip to L2 for up to kBatch x kBlockThreads
  // blocks (the lm_head's one wave: ~360).
  constexpr int kBatch = 4;
  ArgmaxState state;
  const int blocks = int(gridDim.x);
  for (int base = 0; base < blocks; base += kBatch * kBlockThreads) {
    int2 held[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + b * kBlockThreads + int(threadIdx.x);
      if (i < blocks) held[b] = __ldcg(f.block_best + i);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int i = base + b * kBlockThreads + int(threadIdx.x);
      if (i < blocks) {
        if (held[b].y == -2) {
          state.nan = true;
        } else if (held[b].y != INT_MAX) {
          state.consider(__int_as_float(held[b].x), held[b].y);
        }
      }
    }
  }
  const int32_t chosen = block_commit_argmax<kBlockThreads>(state, f.token, f.d_length, f.history, f.history_size);
  if (threadIdx.x == 0) *f.blocks_done = 0;  // for the next launch, which the kernel's end orders after this
  if (f.next.table == nullptr) return;
  // The next step's input row, as decode_argmax copies it.
  if (f.next_vectorized) {
    embedding_copy_row<true>(f.next.x, f.next.table, chosen, f.next.C, V, threadIdx.x, kBlockThreads);
  } else {
    embedding_copy_row<false>(f.next.x, f.next.table, chosen, f.next.C, V, threadIdx.x, kBlockThreads);
  }
}

// Weights a warp copies into shared memory before the PDL wait with kSecondBatchShared:
// one batch, (kRows, kBatch, 32) uint4.
template <GemvOutput Out, int kBatch>
__host__ __device__ constexpr int shared_batch_vectors() {
  return rows_per_unit<Out>() * kBatch * 32;
}

// kSecondBatchShared (DecodeGemvParams::second_batch_in_shared): a warp's second batch
// is also requested before the PDL wait, by cp.async into shared memory, without the
// registers to hold it. The second batch is the rest of the first row when rows take
// two batches or more (down: 8960 values split over 2 warps, two batches of 9 loads a
// lane, so the whole row is in flight), else the next row (gate/up: its second row pair
// of three). 36 KB (down) or 48 KB (gate/up) a block: 3 blocks still fit an SM.
//
// kInputFromGlobal (DecodeGemvParams::input_from_global, kPlain inputs): no staging; the
// lanes load x's chunks from global memory with their weight chunks' partners.
//
// kWidenInput (DecodeGemvParams::widen_input): the staging also writes the input as fp32
// (stage_input's x_widened), and the dot products read that (accumulate_batch_widened).
//
// kProbes: the measurement hooks (the timeline stamps, hold_for_signal, the bulk-copy
// staging) are compiled in; launch_gemv picks this instance only when one is asked for
// (probe_timeline in decode_device.cuh says why).
//
// kSplitFirstBatch (DecodeGemvParams::loads_before_wait): of the first batch, only the
// first loads_before_wait loads a row go out before the PDL wait, the rest once the input
// is staged, right after the wait or once the first ones have landed
// (DecodeGemvParams::split_rest). An instance of its own, so that the default ones carry
// none of it.
template <GemvInput In, GemvOutput Out, bool HasBias, int kBatch, bool kSecondBatchShared = false,
          bool kInputFromGlobal = false, bool kWidenInput = false, bool kProbes = false,
          bool kSplitFirstBatch = false>
__global__ void __launch_bounds__(kThreads, 3)
    decode_gemv_kernel(DecodeGemvParams p, int rows_per_warp, int split) {
  static_assert(!kInputFromGlobal || In == GemvInput::kPlain, "only a plain input can be read in place");
  static_assert(!kWidenInput || (!kInputFromGlobal && !kSecondBatchShared), "the widened input is staged");
  constexpr int kRows = rows_per_unit<Out>();
  // (K/8) the input, normalized for kRmsNorm; with kSecondBatchShared then (kWarps,
  // shared_batch_vectors) the copied weights; with kWidenInput then (2, K/8) float4 the
  // input widened to fp32
  extern __shared__ uint4 x_shared[];
  __shared__ float warp_partial[kWarps][kRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % split;
  const int chunks = p.K / 8;
  const int first = (blockIdx.x * (kWarps / split) + warp / split) * rows_per_warp;
  const int base_first = part * 32 + lane, stride = 32 * split;
  __shared__ uint64_t input_arrived;  // (stage_input_bulk) the copy of x
  unsigned long long* const timeline = probe_timeline<kProbes>(p);  // null unless kProbes
  timeline_mark(timeline, kTimelineStart);
  constexpr bool kBulkStaging =
      kProbes && !kInputFromGlobal && (In == GemvInput::kPlain || In == GemvInput::kRmsNorm);
  if constexpr (kBulkStaging) init_input_arrival(p, &input_arrived);
  if (p.allow_dependents_early) pdl_allow_dependents();
  if constexpr (kProbes) hold_for_signal(p.hold);  // (off unless asked for) until the kernel before has its inputs
  delay_start(p.start_delay_ns);  // (0 unless asked for; the model's gate/up 150 ns, down 500)

  // 1. Weights first (the first batch of the first row, the norm weight): no kernel
  //    writes them, so they are loaded while the previous kernel may still run.
  //    (norm_in_epilogue: no norm weight is read; norm_held stays unused.)
  const uint64_t policy = l2_policy(p.stream_evict_first);
  const bool norm_in_epilogue =
      (In == GemvInput::kRmsNorm || In == GemvInput::kRmsNormAddPartials) && p.norm_in_epilogue;
  uint4 norm_held[kNormHeld];
  if (p.norm_weight_first && !norm_in_epilogue) load_norm_weight<In>(p, norm_held);
  uint4 w[kRows][kBatch];
  // (kSplitFirstBatch) Loads [0, before_wait) of each row now, the rest later; blocks
  // from p.split_blocks on (when set) take the whole batch now, as the unsplit kernel.
  const bool block_splits = kSplitFirstBatch && (p.split_blocks == 0 || int(blockIdx.x) < p.split_blocks);
  const int before_wait = block_splits ? min(max(p.loads_before_wait, 1), kBatch) : kBatch;
  auto load_rest = [&] {
    load_batch<Out, kBatch>(w, p, first < p.N ? first : -1, base_first, stride, policy, before_wait, kBatch);
  };
  load_batch<Out, kBatch>(w, p, first < p.N ? first : -1, base_first, stride, policy, 0, before_wait);
  // (kSplitFirstBatch, kWhenFirstArrived) The rest once those have landed: a value the
  // loads produce, tested (see value_has_arrived), holds each thread until its loads are
  // in, so a block never has more than the first part in flight. (A block that does not
  // split goes on at once.)
  if constexpr (kSplitFirstBatch) {
    if (p.split_rest == SplitBatchRest::kWhenFirstArrived && before_wait < kBatch) {
      float arrived = 0.0f;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          if (u < before_wait) arrived += __uint_as_float(w[r][u].x);
        }
      }
      if (value_has_arrived(arrived)) load_rest();
    }
  }
  // The second batch: (first, its second batch) or (first + 1, its first). The same for
  // every lane of the warp (lanes whose chunks lie past the row copy nothing).
  // (Read in place, no input is staged: the copied batches start the shared memory.)
  uint4* second_batch = x_shared + (kInputFromGlobal ? 0 : chunks) + warp * shared_batch_vectors<Out, kBatch>();
  float4* x_widened = kWidenInput ? reinterpret_cast<float4*>(x_shared + chunks) : nullptr;
  const bool rows_take_two_batches = chunks > kBatch * stride;
  const int second_row = rows_take_two_batches ? first : first + 1;
  const int second_base = rows_take_two_batches ? base_first + kBatch * stride : base_first;
  const bool second_exists = second_row < p.N && (rows_take_two_batches || rows_per_warp > 1);
  if constexpr (kSecondBatchShared) {
    if (!p.second_batch_after_staging) {
      copy_batch_to_shared<Out, kBatch>(second_batch, p, second_exists ? second_row : -1, second_base, stride,
                                        policy);
    }
  }
  if (!p.norm_weight_first && !norm_in_epilogue) load_norm_weight<In>(p, norm_held);
  // The first row's epilogue inputs too, by the lane that stores it: the bias, and
  // RoPE's position and cos / sin or the residual when p.epilogue_inputs_settled says no
  // kernel still running writes them (in the model: the position was committed by the
  // previous step, and the residual stream was last written two kernels back, O reading
  // what the previous layer's down projection wrote and down what O wrote). Loaded at
  // the end of the row instead, they cost one or two more trips to L2 after the dot.
  // load_epilogue_inputs converts what it loads (bf16 -> float, the position check), so
  // the storing lane of each warp waits here for its loads, which return behind the
  // warp's first batch of weights, and only then reaches the wait. That delay is
  // useful: the block's input staging after the wait then finds the queues empty. Kept
  // as loaded and converted at the end instead (H200, 2026-12-01), gate/up's waits
  // returned up to 2 us sooner, but its input loads queued behind the 18 MB of weights
  // its blocks had asked for: its last block staged 2.1 us later, a layer took 36.0
  // against 34.6 us, and decode measured 838 tokens/s against 880 in the call before.
  constexpr bool kReadsWritten = Out == GemvOutput::kResidualAdd || Out == GemvOutput::kRopeAppend;
  const bool early = !kReadsWritten || p.epilogue_inputs_settled;
  const bool stores = lane == 0 && part == 0;
  EpilogueInputs epilogue;
  if (stores && first < p.N && early) epilogue = load_epilogue_inputs<Out, HasBias>(p, first);

  // 2. Every block waits, then stages the input vector (normalized for kRmsNorm unless
  //    norm_in_epilogue), or with kInputFromGlobal only waits: each lane then reads its
  //    x chunks in place.
  //    (kSplitFirstBatch, kAfterWait) The rest of the first batch goes out between the
  //    wait and the input's loads; the staging's own wait then returns at once
  //    (griddepcontrol.wait may be called again), so with kProbes its stamp of the wait
  //    comes after these loads are sent, and sending them took ~2.4 us in the step
  //    (forty-fourth session; our reading: a load's issue waits for room in flight).
  if constexpr (kSplitFirstBatch) {
    if (p.split_rest == SplitBatchRest::kAfterWait) {
      pdl_wait();
      load_rest();
    }
  }
  if constexpr (kInputFromGlobal) {
    pdl_wait();
    timeline_mark(timeline, kTimelineWaitReturned);
  } else if constexpr (kBulkStaging) {
    if (p.stage_input_bulk) {
      stage_input_bulk<In>(p, x_shared, &warp_partial[0][0], norm_held, &input_arrived, x_widened, norm_in_epilogue);
    } else {
      stage_input<In, false, kProbes>(p, x_shared, &warp_partial[0][0], norm_held, x_widened, norm_in_epilogue);
    }
  } else {
    stage_input<In, false, kProbes>(p, x_shared, &warp_partial[0][0], norm_held, x_widened, norm_in_epilogue);
  }
  // norm_in_epilogue (W's columns hold the norm weight: fold_norm_weight.cuh): each warp
  // sums x's squares itself and scales its rows' dot products by the inverse RMS in
  // finish_row. What that replaces: the block's sum of squares, a barrier, the pass that
  // wrote x * inverse_rms * g back, and a second barrier. With a row to itself (split 1)
  // a warp's first row reads every chunk of x once, so the squares are summed inside
  // those dots (no load of x of their own); rows split over warps read x once more first.
  const bool squares_in_dots = norm_in_epilogue && split == 1;
  float dot_scale = norm_in_epilogue && !squares_in_dots ? warp_inverse_rms(x_shared, p.K, p.eps) : 1.0f;
  timeline_mark(timeline, kTimelineStaged);
  // (kSplitFirstBatch, kAfterStaging) The rest of the first batch.
  if constexpr (kSplitFirstBatch) {
    if (p.split_rest == SplitBatchRest::kAfterStaging) load_rest();
  }
  // (second_batch_after_staging) The second batch goes out now: the kernel before has
  // finished, so it queues in front of nobody's loads, and it arrives while the first
  // batch is dotted instead of being asked for after that.
  // (Read in place, "after staging" is right after the wait, just before the first
  // batch's x loads: issued behind them instead, the copy's addresses beside the 72
  // registers of weights and x made the kernel spill 120 bytes.)
  if constexpr (kSecondBatchShared) {
    if (p.second_batch_after_staging) {
      copy_batch_to_shared<Out, kBatch>(second_batch, p, second_exists ? second_row : -1, second_base, stride,
                                        policy);
    }
  }
  if (!p.allow_dependents_early) pdl_allow_dependents();
  // Otherwise right after the wait: they still arrive during the dot product.
  if (stores && first < p.N && !early) epilogue = load_epilogue_inputs<Out, HasBias>(p, first);
  // (measurement) thread 0's first batch is in: a sum of a word of each of its loads (a
  // value the loads produce, not a loaded one: see value_has_arrived). Here, where thread
  // 0 is about to use them anyway, the stamp delays none of its loads or signals.
  if (timeline) {
    float arrived = 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) arrived += __uint_as_float(w[r][u].x);
    }
    timeline_fold_when_ready(timeline, kTimelineWeightsIn, arrived);
  }

  // 3. The rows: dot products against the staged input, then the epilogue. The trip
  //    count is the same for every warp of the block (the barriers below need that).
  bool loaded = true;  // the first batch is already in registers
  // (kF32 with p.argmax) The first maximum of the rows this thread stored (its warp's
  // rows rise: consider's first-maximum rule holds).
  const bool fold = Out == GemvOutput::kF32 && p.argmax.token != nullptr;
  ArgmaxState rows_best;
  for (int i = 0; i < rows_per_warp; ++i) {
    const int row = first + i;
    const bool valid = row < p.N;
    // Later rows: their epilogue inputs go out now, and arrive while the row's weights do.
    if (i > 0 && stores && valid) epilogue = load_epilogue_inputs<Out, HasBias>(p, row);
    float acc[2] = {0.0f, 0.0f};
    const bool sum_squares = squares_in_dots && i == 0;
    float squares = 0.0f;  // (sum_squares) this lane's share of x's squares
    for (int base = base_first; valid && base < chunks; base += kBatch * stride) {
      if constexpr (kSecondBatchShared) {  // the second batch: copied before the wait (or after staging)
        if (!loaded && row == second_row && base == second_base) {
          read_batch_from_shared<kRows, kBatch>(w, second_batch);
          loaded = true;
        }
      }
      if (!loaded) load_batch<Out, kBatch>(w, p, row, base, stride, policy);
      loaded = false;
      if constexpr (kInputFromGlobal) {
        accumulate_batch_global_input<kRows, kBatch>(acc, w, reinterpret_cast<const uint4*>(p.x), base, stride,
                                                           chunks);
      } else {
        // (kSum: x's squares summed too; compiled only into the normalized inputs' forms.)
        auto accumulate = [&](auto sum_squares_tag) {
          constexpr bool kSum = decltype(sum_squares_tag)::value;
          if constexpr (kWidenInput) {
            accumulate_batch_widened<kRows, kBatch, kSum>(acc, w, x_widened, base, stride, chunks, &squares);
          } else {
            accumulate_batch<kRows, kBatch, kSum>(acc, w, x_shared, base, stride, chunks, &squares);
          }
        };
        if constexpr (In == GemvInput::kRmsNorm || In == GemvInput::kRmsNormAddPartials) {
          if (sum_squares) {
            accumulate(std::true_type{});
          } else {
            accumulate(std::false_type{});
          }
        } else {
          accumulate(std::false_type{});
        }
      }
    }
    if (sum_squares) dot_scale = rsqrtf(warp_sum(squares) / float(p.K) + p.eps);
    loaded = false;
    if (i == 0) timeline_fold_when_ready(timeline, kTimelineFirstDot, acc[0] + acc[1]);  // (measurement)
    const float stored = finish_row<Out, HasBias>(p, valid ? row : -1, acc, warp_partial, split, &epilogue, dot_scale);
    if (fold && stores && valid) rows_best.consider(stored, row);
  }
  if constexpr (Out == GemvOutput::kF32) {
    if (fold) fold_argmax<kThreads>(p.argmax, rows_best, p.N);
  }
  timeline_mark(timeline, kTimelineEnd);
}

// The same work layout, software-pipelined: a warp's work is a flat sequence of steps
// (row i, batch b), the same count for every lane and warp, and the loads of step n + 1
// are issued before step n is computed. The register kernel above leaves HBM idle while
// its warps all compute and reduce at about the same moment, then ask again; here every
// warp has a batch in flight at all times. Costs a second set of batch registers
// (launch bounds of 2 blocks per SM instead of 3).
template <GemvInput In, GemvOutput Out, bool HasBias, int kBatch>
__global__ void __launch_bounds__(kThreads, 2)
    decode_gemv_pipelined_kernel(DecodeGemvParams p, int rows_per_warp, int split) {
  constexpr int kRows = rows_per_unit<Out>();
  extern __shared__ uint4 x_shared[];  // (K/8) the input, normalized for kRmsNorm
  __shared__ float warp_partial[kWarps][kRows];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int part = warp % split;
  const int chunks = p.K / 8;
  const int first = (blockIdx.x * (kWarps / split) + warp / split) * rows_per_warp;
  const int base_first = part * 32 + lane, stride = 32 * split;
  const int batch_span = kBatch * stride;                                 // chunks one batch covers
  const int batches_per_row = (chunks + batch_span - 1) / batch_span;     // same for every lane
  const int steps = rows_per_warp * batches_per_row;
  auto row_of = [&](int step) {
    const int row = first + step / batches_per_row;
    return row < p.N ? row : -1;  // -1: loads read zeros
  };
  auto base_of = [&](int step) { return base_first + (step % batches_per_row) * batch_span; };

  if (p.allow_dependents_early) pdl_allow_dependents();
  const uint64_t policy = l2_policy(p.stream_evict_first);
  uint4 w[kRows][kBatch], w_next[kRows][kBatch];
  load_batch<Out, kBatch>(w, p, row_of(0), base_of(0), stride, policy);  // before the PDL wait
  uint4 norm_held[kNormHeld];
  load_norm_weight<In>(p, norm_held);
  stage_input<In>(p, x_shared, &warp_partial[0][0], norm_held);
  if (!p.allow_dependents_early) pdl_allow_dependents();

  float acc[2] = {0.0f, 0.0f};
  for (int step = 0; step < steps; ++step) {
    if (step + 1 < steps) load_batch<Out, kBatch>(w_next, p, row_of(step + 1), base_of(step + 1), stride, policy);
    accumulate_batch<kRows, kBatch>(acc, w, x_shared, base_of(step), stride, chunks);
    if (step % batches_per_row == batches_per_row - 1) {  // the row is complete
      finish_row<Out, HasBias>(p, row_of(step), acc, warp_partial, split);
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int u = 0; u < kBatch; ++u) w[r][u] = w_next[r][u];
    }
  }
}


template <typename Kernel>
int occupancy(Kernel kernel, size_t shared_bytes = 4096) {
  int blocks = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, shared_bytes));
  return std::max(blocks, 1);
}

// occupancy() of a kernel whose shared memory grows with K, asked once per (kernel, K):
// the launch happens every step, the answer never changes. (Every GEMV kernel has the
// same pointer type, so the kernel is part of the key.)
template <typename Kernel>
int occupancy_at(Kernel kernel, int K, size_t shared_bytes) {
  static std::mutex mutex;
  // Not keyed by device: one GPU a process is assumed (the model's, as multiprocessor_count's).
  static std::map<std::pair<const void*, int>, int> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), K);
  auto found = known.find(key);
  if (found == known.end()) found = known.emplace(key, occupancy(kernel, shared_bytes)).first;
  return found->second;
}

template <GemvInput In, GemvOutput Out, bool HasBias, int kBatch, bool kSecondBatchShared = false,
          bool kInputFromGlobal = false, bool kWidenInput = false>
void launch_gemv(const DecodeGemvParams& p, bool pipelined, bool pdl, cudaStream_t stream) {
  auto lean_kernel = decode_gemv_kernel<In, Out, HasBias, kBatch, kSecondBatchShared, kInputFromGlobal, kWidenInput>;
  auto probed_kernel =
      decode_gemv_kernel<In, Out, HasBias, kBatch, kSecondBatchShared, kInputFromGlobal, kWidenInput, true>;
  // loads_before_wait: the split instance, lean or probed (the forms that read the input
  // in place or copy a second batch into shared memory do not take it: refused below).
  constexpr bool kSplitTakes = !kSecondBatchShared && !kInputFromGlobal;
  auto lean_split_kernel = kSplitTakes ? decode_gemv_kernel<In, Out, HasBias, kBatch, kSecondBatchShared,
                                                            kInputFromGlobal, kWidenInput, false, kSplitTakes>
                                       : lean_kernel;
  auto probed_split_kernel = kSplitTakes ? decode_gemv_kernel<In, Out, HasBias, kBatch, kSecondBatchShared,
                                                              kInputFromGlobal, kWidenInput, true, kSplitTakes>
                                         : probed_kernel;
  const bool probes = probes_asked(p);
  const bool split_first_batch = kSplitTakes && p.loads_before_wait > 0 && p.loads_before_wait < kBatch;
  auto register_kernel = split_first_batch ? (probes ? probed_split_kernel : lean_split_kernel)
                                           : (probes ? probed_kernel : lean_kernel);
  auto kernel = pipelined ? decode_gemv_pipelined_kernel<In, Out, HasBias, kBatch> : register_kernel;
  constexpr size_t kSecondBatchBytes =
      kSecondBatchShared ? size_t(kWarps) * shared_batch_vectors<Out, kBatch>() * sizeof(uint4) : 0;
  // The register kernel's shared memory for a K-long input: the input (bf16, and with
  // kWidenInput fp32 too, 4 more bytes a value) unless it is read in place, then the
  // copied batches. The pipelined kernel stages the bf16 input only.
  auto register_shared_bytes = [](int K) {
    const size_t value_bytes = sizeof(__nv_bfloat16) + (kWidenInput ? sizeof(float) : 0);
    return (kInputFromGlobal ? 0 : size_t(K) * value_bytes) + kSecondBatchBytes;
  };
  const size_t shared_bytes = pipelined ? size_t(p.K) * sizeof(__nv_bfloat16) : register_shared_bytes(p.K);
  // With the copied batch or the widened input a block may need more than the 48 KB
  // default (allowed once), and what fits an SM depends on K.
  constexpr bool kSharedGrows = kSecondBatchShared || kWidenInput;
  // (Once a process, for the current device: one GPU a process is assumed.)
  static const bool allowed = !kSharedGrows || [&] {
    for (auto instance : {lean_kernel, probed_kernel, lean_split_kernel, probed_split_kernel}) {
      CUDA_CHECK(cudaFuncSetAttribute(instance, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      int(register_shared_bytes(kMaxK))));
    }
    return true;
  }();
  (void)allowed;
  // One wave: as many blocks as fit on the GPU at once (asked once a process, for the
  // current device: one GPU a process is assumed).
  static const int blocks_per_sm_of[5] = {occupancy(lean_kernel), occupancy(probed_kernel),
                                          occupancy(decode_gemv_pipelined_kernel<In, Out, HasBias, kBatch>),
                                          occupancy(lean_split_kernel), occupancy(probed_split_kernel)};
  const int instance = pipelined ? 2 : (probes ? 1 : 0) + (split_first_batch ? 3 : 0);
  const int occupancy_blocks = kSharedGrows && !pipelined ? occupancy_at(register_kernel, p.K, shared_bytes)
                                                                 : blocks_per_sm_of[instance];
  const int blocks_per_sm =
      p.max_blocks_per_sm > 0 ? std::min(occupancy_blocks, p.max_blocks_per_sm) : occupancy_blocks;
  const long long wave_warps = (long long)multiprocessor_count() * blocks_per_sm * kWarps;
  // Long rows (K > 2048) are split over 2, 4 or 8 warps while that still fits one wave,
  // unless p.split_warps forces a count (bench_decode_gemv's sweep: none was faster).
  int split = 1;
  while (p.K > 2048 && split < kWarps && (long long)p.N * split * 2 <= wave_warps) split *= 2;
  if (p.split_warps > 0) split = p.split_warps;
  const long long unit_slots = wave_warps / split;  // units the wave runs side by side
  // The fewest rows a warp for which the grid is one wave, unless p.rows_per_warp asks for
  // fewer (a grid of several waves) or more.
  const int one_wave_rows = int(std::max<long long>(1, (p.N + unit_slots - 1) / unit_slots));
  const int rows_per_warp = p.rows_per_warp > 0 ? p.rows_per_warp : one_wave_rows;
  const int units_per_block = kWarps / split;
  const int blocks = (p.N + units_per_block * rows_per_warp - 1) / (units_per_block * rows_per_warp);
  if (p.argmax.token && blocks > p.argmax.capacity) {
    throw std::invalid_argument("decode_gemv: the folded argmax's block_best holds " +
                                std::to_string(p.argmax.capacity) + " blocks, the grid has " +
                                std::to_string(blocks));
  }
  launch_kernel(pdl, kernel, dim3(blocks), dim3(kThreads), shared_bytes, stream, p, rows_per_warp, split);
}

// kBatch: 16-byte loads per lane per row before the first is used. A gate/up pair of
// Bielik's rows (K = 1536: 6 chunks per lane) fits one batch of 2 x 6; other rows take
// batches of 8.
template <GemvInput In, GemvOutput Out>
void launch(const DecodeGemvParams& p, bool pipelined, bool pdl, cudaStream_t stream) {
  constexpr bool kPair = rows_per_unit<Out>() == 2;
  const bool short_pair = kPair && p.K / 8 <= 6 * 32;
  // Long single rows (the down projection, K = 8960 split over 2 warps: 17.5 loads per
  // lane) in two batches of 9 instead of three of 8: one HBM round trip fewer per warp.
  const bool long_row = !kPair && p.K > 2048;
  with_bias_flag(p.bias, [&](auto has_bias) {
    constexpr bool kBias = decltype(has_bias)::value;
    if (short_pair) {
      // The gate/up form may copy its second row pair into shared memory.
      if constexpr (Out == GemvOutput::kSwiGLU && In == GemvInput::kRmsNorm) {
        if (p.second_batch_in_shared && !pipelined) {
          launch_gemv<In, Out, kBias, 6, true>(p, pipelined, pdl, stream);
          return;
        }
      }
      // QKV's and gate/up's forms may widen their input (DecodeGemvParams::widen_input).
      if constexpr (In == GemvInput::kRmsNorm || In == GemvInput::kRmsNormAddPartials) {
        if (p.widen_input && !pipelined) {
          launch_gemv<In, Out, kBias, 6, false, false, true>(p, pipelined, pdl, stream);
          return;
        }
      }
      launch_gemv<In, Out, kBias, 6>(p, pipelined, pdl, stream);
    } else if (long_row) {
      // The down projection's form may copy its second batch into shared memory.
      if constexpr (Out == GemvOutput::kResidualAdd && In == GemvInput::kPlain) {
        if (p.second_batch_in_shared && !pipelined) {
          if (p.input_from_global) {
            launch_gemv<In, Out, kBias, 9, true, true>(p, pipelined, pdl, stream);
          } else {
            launch_gemv<In, Out, kBias, 9, true>(p, pipelined, pdl, stream);
          }
          return;
        }
        if (p.input_from_global && !pipelined) {
          launch_gemv<In, Out, kBias, 9, false, true>(p, pipelined, pdl, stream);
          return;
        }
      }
      launch_gemv<In, Out, kBias, 9>(p, pipelined, pdl, stream);
    } else {
      // The O projection's form may read its input in place too.
      if constexpr (Out == GemvOutput::kResidualAdd && In == GemvInput::kPlain) {
        if (p.input_from_global && !pipelined) {
          launch_gemv<In, Out, kBias, 8, false, true>(p, pipelined, pdl, stream);
          return;
        }
      }
      // O's and the lm_head's forms may widen their input (DecodeGemvParams::widen_input).
      if constexpr ((Out == GemvOutput::kResidualAdd && In == GemvInput::kPlain) ||
                    (Out == GemvOutput::kF32 &&
                     (In == GemvInput::kRmsNorm || In == GemvInput::kRmsNormAddPartials))) {
        if (p.widen_input && !pipelined) {
          launch_gemv<In, Out, kBias, 8, false, false, true>(p, pipelined, pdl, stream);
          return;
        }
      }
      launch_gemv<In, Out, kBias, kPair ? 4 : 8>(p, pipelined, pdl, stream);
    }
  });
}

}  // namespace register_gemv
}  // namespace bielik
