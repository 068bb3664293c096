/// @file prefill_kernels.cuh
/// @brief Chapter 08: the small kernels between the prefill GEMMs of the CUDA backend.
///
/// At prefill sizes the GEMMs run in cuBLASLt (chapter 03 measured it fastest there).
/// What lies between them is memory-bound and short (a few microseconds each), so its
/// cost is mostly one kernel boundary per launch: measured on the H200 for a 512-token
/// prompt, the three launches split q/k/v + RoPE + cache append cost ~11 us a layer,
/// about as much as the QKV GEMM itself. These kernels do each step in one pass, and
/// are launched with programmatic dependent launch (PDL) when the model uses it, so that
/// their launch overlaps the end of the GEMM before them.
///
/// Symbols: T tokens of the chunk, P tokens already in the cache, H / Hkv query / kv
/// heads, D head_dim, F ffn hidden. All pointers are device pointers, bf16 unless said.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "rope.cuh"

namespace bielik {

/// Where qkv_rope_append writes.
struct QkvRopeAppendOut {
  __nv_bfloat16* q = nullptr;        ///< (T, H, D) rotated, token-major (chapter 05's layout)
  __nv_bfloat16* k = nullptr;        ///< (T, Hkv, D) rotated, token-major
  __nv_bfloat16* v = nullptr;        ///< (T, Hkv, D) token-major
  __nv_bfloat16* k_cache = nullptr;  ///< (Hkv, max_context, D) one layer: rotated k at positions P..P+T-1
  __nv_bfloat16* v_cache = nullptr;  ///< (Hkv, max_context, D) one layer: v at positions P..P+T-1
  int max_context = 0;
};

/// The three steps after the QKV GEMM in one pass over its output: split the fused
/// projection qkv (T, (H + 2 Hkv) D) into token-major q, k, v; rotate q and k (RoPE,
/// chapter 04's v3 arithmetic: the same bits) at positions P + t; write k and v into the
/// KV cache at those positions (chapter 07's append). One block per token, 16-byte loads
/// and stores, 8 rotation pairs per thread.
/// A position outside the RoPE table gives NaN q and k rows (chapter 04's contract); a
/// position outside the cache is not written (the host checks room before: KvCache).
/// Throws std::invalid_argument unless D % 16 == 0 and every pointer is 16-byte aligned.
/// `pdl`: launch with programmatic dependent launch (common/pdl.cuh; ignored before sm_90).
void qkv_rope_append(const QkvRopeAppendOut& out, const __nv_bfloat16* qkv, int T, int P, int H, int Hkv,
                     const RopeTable& table, cudaStream_t stream = 0, bool pdl = false);

/// act[t, f] = bf16(silu(gate_up[t, f]) * gate_up[t, F + f]): the SwiGLU of one GEMM's
/// output over the concatenated gate and up weights (rounded as chapter 06 rounds it).
/// Needs F % 8 == 0 and 16-byte aligned pointers (std::invalid_argument otherwise).
/// `pdl` as for qkv_rope_append.
/// @param act     (T, F)
/// @param gate_up (T, 2F)
void swiglu_rows(__nv_bfloat16* act, const __nv_bfloat16* gate_up, int T, int F, cudaStream_t stream = 0,
                 bool pdl = false);

}  // namespace bielik
