/// @file decode_gate_up_side.cuh
/// @brief Chapter 08: the last rows of gate/up, held on chip before O has finished.
///
/// From one layer's down projection to the end of its O projection the decode step is
/// latency-bound (QKV, the attention, O: ~9 us a layer for ~11 MB of weights), and HBM
/// is mostly idle, while gate/up (55 MB) waits its turn. Asking L2 for gate/up's weights
/// in that window lost every time (DECODE_LOG.md, sessions 3, 5, 17, 21, 22): a prefetch
/// must survive in L2 until it is read, and only a fifth to a half did. Shared memory
/// keeps what it is given. So a small kernel on a second stream of the graph (the side
/// kernel) takes the LAST units of gate/up away from the gate/up GEMV:
///
///  1. it starts when the previous layer's down projection has finished (blocks of two
///     warps, each holding units_per_block row pairs, ~6 KB a pair at Bielik's K = 1536),
///     and copies its rows of the gate and up weights into shared memory with the
///     bulk-copy engine, while QKV and the attention run;
///  2. it waits for a tag that the gate/up GEMV's blocks store once their PDL wait has
///     returned (O has finished and its writes are visible: the input is ready);
///  3. it normalizes the residual stream as the GEMV does (every block, from L2), then
///     computes its units' dot products from shared memory, and the SwiGLU epilogue.
///
/// The gate/up GEMV runs N - side units (DecodeGemvParams::pair_stride keeps its up rows
/// at N), and the down projection waits for the side kernel in the graph (an event: a
/// full dependency beside its programmatic one on gate/up).
///
/// Measured on the H200 (2026-12-02, DECODE_LOG.md, twenty-seventh session): slower in
/// every form, 698-880 against 951-956 tokens/s (the fork and the join alone: 949). With
/// PDL every SM always holds the chain's next blocks, so large side blocks find room only
/// as gate/up's leave and small ones take the slots gate/up's late blocks need; their
/// copies slow the attention; and down starts when the side kernel ends instead of when
/// gate/up lets it. CudaModelOptions::gate_up_side_blocks, off.
///
/// A kernel that spins on another one steps outside CUDA's programming model (no two
/// kernels are promised to run at once), and it met one hazard: with lazy module loading
/// (CUDA's default) the model's first eager step hung, the gate/up GEMV's first launch
/// (its module loaded then) never running while the side kernel waited for it (our
/// reading; the CUDA Programming Guide's Lazy Loading chapter describes such hazards).
/// The model's warm-up steps (which load every kernel of the chain) therefore run without
/// the side kernel, and a spinning side kernel gives up after 2 s with a message and a
/// trap instead of hanging the process.
///
/// The tag is the step's own, *d_length + 1 (the committed length, which no kernel of
/// the step changes before its last, the argmax), as for HoldForSignal: a word per layer
/// that the GEMV's blocks store and the side kernel waits for. Tags grow step by step;
/// the model zeroes the words when it resets its cache, so a new sequence cannot find
/// an old sequence's tag of the same length.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "decode_kernels.cuh"

namespace bielik {

struct GateUpSideParams {
  /// The whole gate/up GEMV: y = the SwiGLU output (N), x = the residual stream (K),
  /// norm_weight, W (2N, K), bias (2N) or nullptr, N, K, eps. Only these are read.
  DecodeGemvParams gemv;
  int first_unit = 0;       ///< the side kernel's units: first_unit .. N - 1
  int units_per_block = 0;  ///< row pairs a block holds (the last block may hold fewer)
  /// The layer's hand-over: the word the gate/up GEMV stores its tag in (the same
  /// ReadySignal it is given) and the committed length the tag is made from.
  ReadySignal sync;
};

/// Shared memory a side block needs: its row pairs and the staged input.
size_t decode_gate_up_side_shared_bytes(int units_per_block, int K);

/// Blocks the side kernel runs for `units` units.
inline int decode_gate_up_side_blocks(int units, int units_per_block) {
  return (units + units_per_block - 1) / units_per_block;
}

/// Launches the side kernel on `stream` (sm_90+: bulk copies). Throws
/// std::invalid_argument when it cannot run: before sm_90, K % 8 != 0, K > 4096 (the
/// normalized input), a range of units outside 0..N - 1, more shared memory than a block
/// may have, a missing sync pointer, misaligned pointers.
/// `priority`: the launch's priority (cudaLaunchAttributePriority; 0: the stream's; lower
/// is more urgent, cudaDeviceGetStreamPriorityRange): the block scheduler then places its
/// blocks before the chain's waiting ones.
void decode_gate_up_side(const GateUpSideParams& params, cudaStream_t stream, int priority = 0);

}  // namespace bielik
