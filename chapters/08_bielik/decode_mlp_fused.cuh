/// @file decode_mlp_fused.cuh
/// @brief Chapter 08: the decode step's whole MLP (norm, gate/up, SwiGLU, down) in ONE
/// kernel, the down projection split over the intermediate dimension and summed by
/// atomics (CudaModelOptions::experiments.fused_mlp).
///
/// Why. In the decode step the MLP is two GEMVs: gate/up (55 MB) writes the 8960 SwiGLU
/// values, and down (27.5 MB) may start only when the last of them is written. On the
/// H200 the stretch between them costs ~2 us a layer: gate/up's last blocks end
/// unevenly, down's blocks start as they leave, and down's first batch goes out after
/// its wait (DECODE_LOG.md's timelines: gate/up ends at 23.2 us, down's last wait returns
/// at 26.3, down ends at 31.6). Together they stream at ~86% of the copy bandwidth.
///
/// How. Intermediate value i needs gate row i and up row i (its two dot products with the
/// normalized input), and then it is used by column i of W_down only: y += h_i W_down[:, i].
/// So a warp can take i from start to end, with no other warp involved: load gate row i,
/// up row i and down COLUMN i together, dot, SwiGLU, and add h_i times the column into
/// its own accumulator of the C outputs. Nothing waits for anything but its own loads:
/// the kernel is one stream of 82.6 MB. Down's columns must be contiguous for that, so
/// with the option on the model keeps W_down transposed, (F, C) (transpose_bf16, once at
/// load; the prefill's GEMM reads the same buffer with the other transpose flag).
///
/// The price. Each warp ends with a partial y over all C outputs. The block sums its
/// warps' partials in shared memory (in warp order), then adds the block's into a global
/// fp32 accumulator with atomics (C / 4 vector atomics a block): the order in which the
/// blocks' sums arrive is not fixed, so the result may differ in the last bits of fp32
/// from run to run (and its bf16 rounding, rarely, by one ulp). The accumulator is not
/// the residual stream: the residual h stays in bf16, and whoever reads it next adds the
/// accumulator in with the down projection's rounding, bf16(h + bf16(acc)) (the next
/// layer's QKV while it stages its input, its O projection in its epilogue, the lm_head's
/// staging: GemvInput::kRmsNormAddPartials, ResidualPartials with count 1).
///
/// What the H200 said (2026-12-03, DECODE_LOG.md, thirty-first session): correct (its
/// test, and the model's decode against the CPU backend), but not faster where it
/// matters. In bench_fused_mlp's graph chain one MLP took 21.9-22.9 us in its best forms
/// against the pair's 22.9-23.1 (87-90% of the copy bandwidth against 85-86%); in the
/// decode step it LOST in three calls: blocks of 8 warps 985 against 995 tokens/s and 983
/// against 986; with the 300 ns pause 967-970 against 983-986; blocks of 4 942-955 against
/// 983. So the model keeps the two GEMVs, and this kernel is an option
/// (CudaModelOptions::experiments.fused_mlp). Against the forty-third session's defaults
/// it lost 5% (961 against 1013), and 4% on 128 blocks (974), which leave four SMs to the
/// next layer's QKV; on fewer SMs it streams slower (bench_fused_mlp: 86% of the copy
/// bandwidth on 128 blocks, 80% on 112, 70% on 88).
///
/// Symbols: C hidden, F intermediate (ffn) size. All pointers are device pointers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace bielik {

/// Arguments of one fused MLP.
struct FusedMlpParams {
  const __nv_bfloat16* x = nullptr;            ///< (C) the residual stream entering the MLP (its norm's input)
  const __nv_bfloat16* norm_weight = nullptr;  ///< (C) the post-attention RMSNorm weight
  const __nv_bfloat16* w_gate_up = nullptr;    ///< (2F, C) gate rows, then up rows
  const __nv_bfloat16* b_gate_up = nullptr;    ///< (2F) or nullptr
  const __nv_bfloat16* w_down_t = nullptr;     ///< (F, C) W_down transposed: row i is column i of W_down
  /// (C) fp32, 16-byte aligned: holds the down bias (or zeros) on entry; the kernel adds
  /// h W_down^T into it. Must not be read or written by anything else while it runs.
  float* accumulator = nullptr;
  /// (C) or nullptr: after its PDL wait, the kernel sets this (another layer's
  /// accumulator, whose readers have all finished) to reset_value, ready for that layer's
  /// next use. The model passes the previous layer's.
  float* reset = nullptr;
  const __nv_bfloat16* reset_value = nullptr;  ///< (C) or nullptr: zeros
  int C = 0, F = 0;
  float eps = 0;
  /// Read the weights with an L2 evict-first hint (as the decode GEMVs do).
  bool stream_evict_first = true;
  /// Intermediate values whose weights (gate row, up row, down column: 3 C bf16) each warp
  /// asks for before the PDL wait: 0, 1 or 2 (two are in flight from then on).
  int units_before_wait = 2;
  /// Warps a block: 8 (one block an SM, all its registers) or 4 (two blocks an SM, each
  /// fitting beside another kernel's block of half an SM's registers).
  int block_warps = 8;
  /// Each block pauses this long before its first weight loads (as the unfused gate/up
  /// and down do: DecodeGemvParams::start_delay_ns). 0: no pause.
  int start_delay_ns = 0;
  /// Blocks in the grid. 0: enough to fill every SM once (8 / block_warps blocks an SM).
  /// Fewer leave whole SMs to the kernel after it (in the decode step the next layer's
  /// QKV), whose blocks can then start and load their weights while the MLP still
  /// streams, instead of only as the MLP's blocks leave; and a count whose warps divide F
  /// (Bielik: 112 blocks of 8 warps, 10 values each) gives every warp the same work.
  /// More than one wave is allowed (blocks never wait for each other), if slow.
  int blocks = 0;
};

/// The fused MLP of one decode token: accumulator += W_down^T-product of
/// bf16(silu(g) * u), with g, u = bf16(W_gate_up . bf16(rmsnorm(x) * norm_weight) + b).
/// Eight warps an SM (FusedMlpParams::block_warps a block; FusedMlpParams::blocks of them,
/// 0: every SM), warp w of the grid takes intermediate values w, w + warps, ... Needs
/// C % 8 == 0, C <= 1536, F >= 1, 16-byte aligned x, norm_weight, the weights and the
/// accumulator (and reset), block_warps 4 or 8, blocks >= 0; throws
/// std::invalid_argument otherwise. `pdl`: launch
/// with programmatic dependent launch (ignored before sm_90): the kernel loads its first
/// weights before its wait.
void decode_mlp_fused(const FusedMlpParams& params, bool pdl, cudaStream_t stream = 0);

/// The largest C decode_mlp_fused takes (1536).
int decode_mlp_fused_max_c();

/// out (cols, rows) = in (rows, cols) transposed, bf16, exact (the model's W_down ->
/// FusedMlpParams::w_down_t, once at load). out and in must not overlap.
void transpose_bf16(__nv_bfloat16* out, const __nv_bfloat16* in, int rows, int cols, cudaStream_t stream = 0);

}  // namespace bielik
