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
/// never leave registers. fp32 CUDA-core math. No workspace (pass nullptr). k 16-byte
/// aligned, v and out 4-byte aligned (std::invalid_argument otherwise).
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

/// v6: v3's 4-warp blocks, with each query block's key tiles split over a thread block
/// cluster of S blocks (S different SMs, sm_90+), whose softmax states are merged
/// through distributed shared memory. S is chosen per launch (attention_v6_default_splits:
/// T = 512 -> 2 on an H200; S = 1 is v3). No workspace (pass nullptr). Same shape rules
/// and alignment as v3.
void attention_v6_cluster_split_keys(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                     const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D, float* workspace,
                                     cudaStream_t stream = 0);
/// The automatic S: the largest of 1, 2, 4, 8 for which every block of the grid is
/// resident at once and the heaviest query block has a tile for each of its S blocks;
/// 1 before sm_90 (no clusters).
int attention_v6_default_splits(int Tq, int Tkv, int H, int D);
/// v6 with the launch options: `pdl` (as v5's), `splits` = S, 1..8 (0: automatic; > 1
/// needs sm_90, else std::invalid_argument). `block_times` (bench_attention's timeline),
/// if not null: 5 values per block of the grid (H, attention_v6_grid_rows), row-major:
/// the SM, then %globaltimer in ns at the block's start, once its first tiles are
/// loaded, after its last tile, and at its end.
void attention_v6_cluster_split_keys_with(__nv_bfloat16* out, const __nv_bfloat16* q, const __nv_bfloat16* k,
                                          const __nv_bfloat16* v, int Tq, int Tkv, int H, int Hkv, int D,
                                          cudaStream_t stream, bool pdl, int splits,
                                          unsigned long long* block_times = nullptr);
/// grid.y of that launch: query blocks x S.
int attention_v6_grid_rows(int Tq, int Tkv, int H, int D, int splits);

/// Checks the shape rules every version shares; throws std::invalid_argument naming `who`.
/// D must be 64 or 128 (the head dims of Llama-family models; template instances).
void attention_check_shapes(const char* who, int Tq, int Tkv, int H, int Hkv, int D);

/// Every GPU version, in order, so tests and the benchmark loop over the same list.
using AttentionLauncher = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                   const __nv_bfloat16*, int, int, int, int, int, float*, cudaStream_t);
struct AttentionVersion {
  const char* name;
  AttentionLauncher launch;
  size_t (*workspace_floats)(int Tq, int Tkv, int H);  ///< nullptr: needs none
  bool (*supported)(int D);                            ///< nullptr: runs on every GPU of the book
};
inline constexpr AttentionVersion kAttentionVersions[] = {
    {"v1_naive", attention_v1_naive, attention_v1_workspace_floats, nullptr},
    {"v2_online_softmax", attention_v2_online_softmax, nullptr, nullptr},
    {"v3_flash_mma", attention_v3_flash_mma, nullptr, nullptr},
    {"v4_flash_two_row_tiles", attention_v4_flash_two_row_tiles, nullptr, nullptr},
    {"v5_flash_split_keys", attention_v5_flash_split_keys, nullptr, attention_v5_supported},
    {"v6_cluster_split_keys", attention_v6_cluster_split_keys, nullptr, nullptr},
};

/// The fastest version without thread block clusters (v5, measured) where the GPU has the
/// shared memory for it, v3 otherwise. Chapter 08's prefill calls it only before sm_90 or with
/// CudaModelOptions::prefill_attention_clusters off: on sm_90+ it runs v6 by default
/// (attention_v6_cluster_split_keys_with, automatic S).
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
