/// @file decode_persistent.cuh
/// @brief Chapter 08: the whole decode step as ONE persistent kernel, in two forms
/// (CudaModelOptions::experiments.persistent_decode): register loads per phase
/// (decode_step_persistent), and one continuous bulk-copy weight stream per block
/// across all phases (decode_step_streamed, decode_step_streamed.cu).
///
/// Measured on the H200, one decode GEMV boundary costs ~3-4 us (drain, wait, input
/// from L2, ramp), about as much as the bytes of the QKV or O projection. Here every
/// block of a grid that fills the GPU once runs every phase of every layer, and the
/// phases are separated by a grid-wide barrier (an atomic counter and a generation flag
/// in global memory) instead of a kernel boundary. Before each barrier a warp already
/// loads the first batch of its rows of the NEXT projection (weights never change), so
/// that after the barrier it computes at once.
///
/// Phases per layer: norm + QKV + RoPE + append | attention splits | merge of the
/// splits | O + residual | norm + gate/up + SwiGLU | down + residual; then norm +
/// lm_head and the argmax (block 0), which writes the next token and increments the
/// KV length. Activations written inside the kernel are read through L2 only (L1 is not
/// coherent across blocks). The launch is cooperative: every block is resident, or the
/// launch fails (never a deadlock at a barrier).
///
/// Measured on the H200 (bench_model, 2026-11-29): 580 tokens/s with one block of 256
/// threads per SM, 491 with two, against the graph's 759. Correct, but slower: one block
/// per SM keeps too few loads in flight for the big GEMVs, two spill and make each of
/// the 193 barriers per token wait for 264 blocks. Off by default (DECODE_LOG.md).
/// The streamed form (decode_step_streamed.cu) has one bulk-copy weight stream per warp
/// across all phases; its header says how it measures.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace bielik {

/// One layer's weights and KV cache, as the kernel reads them (a device array of L).
struct PersistentLayer {
  const __nv_bfloat16* input_norm;  ///< (C)
  const __nv_bfloat16* w_qkv;       ///< ((H + 2 Hkv) D, C)
  const __nv_bfloat16* b_qkv;       ///< ((H + 2 Hkv) D) or nullptr
  const __nv_bfloat16* w_o;         ///< (C, H D)
  const __nv_bfloat16* b_o;         ///< (C) or nullptr
  const __nv_bfloat16* post_norm;   ///< (C)
  const __nv_bfloat16* w_gate_up;   ///< (2F, C)
  const __nv_bfloat16* b_gate_up;   ///< (2F) or nullptr
  const __nv_bfloat16* w_down;      ///< (C, F)
  const __nv_bfloat16* b_down;      ///< (C) or nullptr
  __nv_bfloat16* k_cache;           ///< (Hkv, max_context, D)
  __nv_bfloat16* v_cache;           ///< (Hkv, max_context, D)
};

/// Everything one step reads and writes. All pointers are device pointers.
struct PersistentStep {
  const PersistentLayer* layers = nullptr;  ///< (L)
  int L = 0, C = 0, F = 0, H = 0, Hkv = 0, D = 0, V = 0;
  float eps = 0;
  const __nv_bfloat16* embed = nullptr;       ///< (V, C)
  const __nv_bfloat16* final_norm = nullptr;  ///< (C)
  const __nv_bfloat16* lm_head = nullptr;     ///< (V, C)
  __nv_bfloat16* x = nullptr;                 ///< (C) residual stream
  __nv_bfloat16* q = nullptr;                 ///< (H, D) rotated queries
  __nv_bfloat16* attn = nullptr;              ///< (H, D) attention output
  __nv_bfloat16* act = nullptr;               ///< (F) SwiGLU output
  float* logits = nullptr;                    ///< (V)
  int32_t* token = nullptr;                   ///< (1) in: this step's token; out: the argmax (-1 on NaN)
  int* d_length = nullptr;                    ///< (1) tokens in the cache; += 1 at the end
  const float* cos = nullptr;                 ///< (max_positions, D/2)
  const float* sin = nullptr;                 ///< (max_positions, D/2)
  int max_context = 0, max_positions = 0;
  float* partial_acc = nullptr;  ///< (splits, H, D)
  float* partial_ml = nullptr;   ///< (splits, H, 2)
  int splits = 0;                ///< attention splits, 1..256
  unsigned* barrier = nullptr;   ///< (2) zeroed once before the first step
  /// (6 L + 18 + 5 x SMs) or nullptr, zeroed: block 0's %globaltimer (ns) at the start
  /// and after every grid barrier (embedding; per layer QKV, attention, merge, O, gate/up,
  /// down; lm_head), so that bench_model can say which phases take the time; then,
  /// streamed step only, for QKV, O, gate/up, down, lm_head: the SM cycles block 0's
  /// thread 0 waited for weight slots, the cycles it spent requesting the next stages,
  /// and the cycles of those phases, added up over steps; then, streamed step only, for
  /// the same five kinds and every block b (index kind x SMs + b): the ns from the
  /// phase's start in block b to its last output, added up over layers and steps.
  unsigned long long* phase_clock = nullptr;
};

/// True when the device can run it: cooperative launch, and D in {64, 128} with
/// H / Hkv <= 8.
bool decode_step_persistent_supported(int D, int H, int Hkv);

/// Launches one decode step on blocks_per_sm (1 or 2) blocks of 256 threads per SM.
/// Throws std::invalid_argument for an unsupported shape or a grid the device cannot hold.
void decode_step_persistent(const PersistentStep& step, int blocks_per_sm, cudaStream_t stream = 0);

/// True when the streamed step can run: decode_step_persistent_supported and sm_90+
/// (the bulk-copy engine).
bool decode_step_streamed_supported(int D, int H, int Hkv);

/// The shared-memory plan of the streamed step: for each of the block's 8 warps a ring of
/// ring_stages slots of slot_bytes (whole weight rows, or a chunk of a row that does not
/// fit), after the input vector (x_bytes) and the slot barriers.
struct StreamedStepLayout {
  int slot_bytes = 0;
  int ring_stages = 0;
  int x_bytes = 0;
  size_t shared_bytes = 0;  ///< dynamic shared memory per block
};

/// The layout for `step` with ring_stages slots a warp (0: as many as shared memory
/// holds, up to 16; else capped there) of min_slot_bytes rounded up to 128
/// (0: 6 KB; slots smaller than a row stream it in chunks, which the tests use on their
/// tiny models). Computed once per model (host
/// work: kernel attributes, an occupancy query), it also raises the kernel's dynamic
/// shared memory limit. Throws std::invalid_argument for an unsupported device or shape,
/// or when not one slot a warp fits.
StreamedStepLayout decode_step_streamed_layout(const PersistentStep& step, int ring_stages, int min_slot_bytes = 0);

/// Launches one decode step of the streamed kernel: one block of 256 threads per SM,
/// each of whose warps streams its rows of every projection of every layer, in order,
/// through its ring. `layout`: decode_step_streamed_layout of a step with the
/// same shape. Same results as decode_step_persistent (the same epilogues and summation
/// per row, up to the order of the partial sums).
void decode_step_streamed(const PersistentStep& step, const StreamedStepLayout& layout, cudaStream_t stream = 0);

}  // namespace bielik
