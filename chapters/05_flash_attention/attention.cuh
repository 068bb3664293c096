/// @file attention.cuh
/// @brief Chapter 05: causal self-attention with grouped-query heads (flash attention).
///
///     out[i, h] = sum_j softmax_j(q[i, h] . k[j, g] / sqrt(D)) * v[j, g],   g = h / (H / Hkv)
///     over the visible keys j = 0 .. (Tkv - Tq + i)
///
/// Symbols (docs/conventions.md): Tq query tokens, Tkv key/value tokens, H query heads,
/// Hkv kv heads, D head_dim. Tensors are token-major bf16, exactly as the QKV projection
/// (and RoPE, chapter 04) leave them: q (Tq, H, D), k and v (Tkv, Hkv, D), out (Tq, H, D).
///
/// Causality with a diagonal offset: the Tq queries are the LAST Tq tokens of a context
/// of Tkv tokens (Tq <= Tkv). Query i sits at position Tkv - Tq + i and sees every key up
/// to and including its own position. Tq == Tkv is a fresh prefill; Tq < Tkv is a new
/// chat turn (or a chunk of a long prompt) on top of a KV cache; Tq == 1 is decode.
///
/// Grouped-query attention (GQA): H / Hkv query heads share one kv head; query head h
/// uses kv head h / (H / Hkv) (Bielik: 12 / 2, heads 0-5 -> kv 0, 6-11 -> kv 1; SmolLM2
/// 9 / 3). Hkv == H is plain multi-head attention, Hkv == 1 multi-query attention.
///
/// Numerics: scores and softmax statistics in fp32, scale 1/sqrt(D), output rounded to
/// bf16 once. v3 also rounds the probabilities to bf16 for the tensor-core P.V product.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace bielik {

/// Plain C++ reference in fp32 (two passes: scores with the row max subtracted, then the
/// normalized sum). Throws std::invalid_argument for Tq > Tkv or H % Hkv != 0.
/// @param out (Tq, H, D)
/// @param q   (Tq, H, D)
/// @param k   (Tkv, Hkv, D)
/// @param v   (Tkv, Hkv, D)
void attention_cpu(float* out, const float* q, const float* k, const float* v, int Tq, int Tkv, int H, int Hkv,
                   int D);

/// v1: the textbook three steps with the scores materialized in global memory:
/// S = Q K^T * scale (masked), P = softmax(S) row by row, O = P V. fp32 throughout.
/// Needs a workspace of attention_v1_workspace_floats(Tq, Tkv, H) floats (the scores).
/// @param out       (Tq, H, D) device, written
/// @param q         (Tq, H, D) device
/// @param k         (Tkv, Hkv, D) device
/// @param v         (Tkv, Hkv, D) device
/// @param workspace (H, Tq, Tkv) device fp32 scratch
void attention_v1_naive(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v,
                        int Tq, int Tkv, int H, int Hkv, int D, float* workspace, cudaStream_t stream = 0);
size_t attention_v1_workspace_floats(int Tq, int Tkv, int H);

/// v2: one warp per (query, head); online softmax over chunks of 32 keys, so the scores
/// never leave registers. fp32 CUDA-core math. No workspace (pass nullptr).
void attention_v2_online_softmax(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                 const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D, float* workspace,
                                 cudaStream_t stream = 0);

/// v3: flash attention on tensor cores: 64 queries x 64 keys tiles, mma.sync m16n8k16
/// bf16 with fp32 accumulation, online softmax in registers, K/V tiles double-buffered in
/// shared memory with cp.async. D = 64 or 128; q, k, v, out 16-byte aligned. No workspace.
void attention_v3_flash_mma(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                            const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D, float* workspace,
                            cudaStream_t stream = 0);

/// v4: v3 with two 16-row tiles per warp (128 queries per block): every K/V fragment
/// read from shared memory feeds twice the mma. Measured faster than v3 only at
/// T = 8192 (fewer, bigger blocks). Same parameters and requirements as v3.
void attention_v4_flash_two_row_tiles(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                      const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                      float* workspace, cudaStream_t stream = 0);

/// v5: v3's tiles in 8-warp blocks: two warp groups split the key tiles of the same 64
/// queries and merge their softmax states at the end, so a block finishes its keys in
/// half the time. Same parameters and requirements as v3, plus shared memory: see
/// attention_v5_supported (throws std::runtime_error on a GPU that lacks it).
void attention_v5_flash_split_keys(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                   const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D, float* workspace,
                                   cudaStream_t stream = 0);
/// Whether the current GPU gives one block enough shared memory for v5 at head dim D.
/// D = 128 needs 153 KB: yes on H100/H200 (227 KB) and A100 (163 KB), no on RTX 30xx/40xx
/// (99 KB), where attention_forward uses v3 instead.
bool attention_v5_supported(int D);

/// v5 launched with programmatic dependent launch when `pdl` is set and the GPU has it
/// (common/pdl.cuh; chapter 07 explains PDL): the kernel may be scheduled while the
/// previous kernel in the stream still runs and waits on the GPU before reading q, k, v.
/// Chapter 08's prefill uses it. Same parameters and checks as v5.
void attention_v5_flash_split_keys_pdl(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                       const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                       cudaStream_t stream, bool pdl);

/// v6: v3's 4-warp blocks, with the key tiles of heavy query blocks cut into work items
/// of C tiles, C = ceil(the grid's tiles / the blocks the GPU holds at once), so the
/// causal prompt's work spreads over every SM (T = 512: the heaviest block runs 2 tiles
/// instead of 8). An item that shares its query block parks its softmax state in the
/// workspace; the last item of the block to arrive merges them in item order
/// (deterministic) and writes the rows. The workspace (attention_v6_workspace_floats)
/// must be zero-filled once when it is allocated: v6 uses its start as arrival counters
/// and leaves them at zero. Same shape rules and alignment as v3.
void attention_v6_balanced_splits(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                  const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D, float* workspace,
                                  cudaStream_t stream = 0);
/// Floats of workspace v6 needs for this shape (0: no query block is cut).
size_t attention_v6_workspace_floats(int Tq, int Tkv, int H);
/// Enough workspace for v6 at every shape on this GPU (its plans cap the partial slots at
/// twice the resident blocks: ~18 MB on an H200). Chapter 08 allocates this once.
size_t attention_v6_max_workspace_floats();
/// v6 with the launch options: `pdl` (as v5's), and `tiles_per_item` > 0 to force C
/// (0: the automatic plan). The tests force small C to cut small shapes into many items;
/// a forced plan needs attention_v6_workspace_floats_with(..., tiles_per_item).
void attention_v6_balanced_splits_with(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                       const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                       float* workspace, cudaStream_t stream, bool pdl, int tiles_per_item);
size_t attention_v6_workspace_floats_with(int Tq, int Tkv, int H, int tiles_per_item);

/// Checks the shape rules every version shares; throws std::invalid_argument naming `who`.
/// D must be 64 or 128 (the head dims of Llama-family models; template instances).
void attention_check_shapes(const char* who, int Tq, int Tkv, int H, int Hkv, int D);

/// Every GPU version, in order, so tests and the benchmark loop over the same list.
using AttentionLauncher = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                   const __nv_bfloat16*, int, int, int, int, int, float*, cudaStream_t);
struct AttentionVersion {
  const char* name;
  AttentionLauncher launch;
  size_t (*workspace_floats)(int Tq, int Tkv, int H);  ///< nullptr: needs none; else zero-filled
  bool (*supported)(int D);                            ///< nullptr: runs on every GPU of the book
};
inline constexpr AttentionVersion kAttentionVersions[] = {
    {"v1_naive", attention_v1_naive, attention_v1_workspace_floats, nullptr},
    {"v2_online_softmax", attention_v2_online_softmax, nullptr, nullptr},
    {"v3_flash_mma", attention_v3_flash_mma, nullptr, nullptr},
    {"v4_flash_two_row_tiles", attention_v4_flash_two_row_tiles, nullptr, nullptr},
    {"v5_flash_split_keys", attention_v5_flash_split_keys, nullptr, attention_v5_supported},
    {"v6_balanced_splits", attention_v6_balanced_splits, attention_v6_workspace_floats, nullptr},
};

/// The version later chapters call for prefill: the fastest one measured (v5) where the
/// GPU has the shared memory for it, v3 otherwise.
/// `pdl`: launch v5 with programmatic dependent launch (v3 ignores it).
inline void attention_forward(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                              const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                              cudaStream_t stream = 0, bool pdl = false) {
  if (attention_v5_supported(D)) {
    attention_v5_flash_split_keys_pdl(out, q, k, v, Tq, Tkv, H, Hkv, D, stream, pdl);
  } else {
    attention_v3_flash_mma(out, q, k, v, Tq, Tkv, H, Hkv, D, nullptr, stream);
  }
}

}  // namespace bielik
