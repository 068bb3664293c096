/// @file rmsnorm.cuh
/// @brief Chapter 02: RMSNorm, and the residual add fused into it.
///
///     y[t, c] = x[t, c] / sqrt(mean_c(x[t, :]^2) + eps) * w[c]
///
/// Every Llama-family layer normalizes twice (before attention, before the MLP) and
/// once more before the output head. Each norm follows a residual add, so the decoder
/// calls the fused form:
///
///     residual[t, :] = bf16(residual[t, :] + x[t, :])     (the residual stream, in place)
///     y[t, :]        = rmsnorm(residual[t, :]) * w
///
/// Numerics (docs/conventions.md): bf16 in and out, fp32 math, one rounding to bf16 at
/// the end. The residual stream is kept in bf16 like HuggingFace keeps it, so the sum is
/// rounded to bf16 before it is written back *and* before it is normalized: the norm sees
/// exactly the values the next residual add will read. HuggingFace's LlamaRMSNorm rounds
/// twice (x * rsqrt to bf16, then * w in bf16); we round once, which is at least as
/// accurate and within one bf16 step of it.
///
/// eps is a parameter: Bielik uses 1e-6, SmolLM2 1e-5 (rms_norm_eps in config.json).
/// With eps > 0 an all-zero row gives zeros, never NaN.
///
/// Symbols: T tokens, C hidden size. All GPU pointers are device pointers, bf16 is
/// `__nv_bfloat16`. Outputs must not overlap inputs (except `residual`, which is both).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace bielik {

/// Plain C++ reference: fp32 loops over fp32 values (bf16 inputs widened exactly).
/// @param y      (T, C) output, fp32, not rounded
/// @param x      (T, C) input rows
/// @param weight (C)    per-channel scale
void rmsnorm_cpu(float* y, const float* x, const float* weight, int T, int C, float eps);

/// Reference of the fused op. `residual` is read and written; the new residual values
/// are rounded to bf16 (round_to_bf16) exactly like the GPU stores them.
/// @param y        (T, C) output, fp32, not rounded
/// @param residual (T, C) in: residual stream; out: residual + x rounded to bf16
/// @param x        (T, C) the block output added to the stream
/// @param weight   (C)    per-channel scale
void fused_residual_rmsnorm_cpu(float* y, float* residual, const float* x, const float* weight, int T, int C,
                                float eps);

/// v1: one thread per row, two sequential passes over C. The naive baseline.
/// @param y      (T, C) device, written fully
/// @param x      (T, C) device
/// @param weight (C)    device
void rmsnorm_v1_thread_per_row(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* weight, int T, int C,
                               float eps, cudaStream_t stream = 0);

/// v2: one block per row, shared-memory tree reduction of the sum of squares.
/// Same parameters as v1.
void rmsnorm_v2_block_reduce(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* weight, int T, int C,
                             float eps, cudaStream_t stream = 0);

/// v3: one warp per row, warp-shuffle reduction, 16-byte loads with the row kept in
/// registers (x read once) when C % 8 == 0, C <= 4096 and the pointers are 16-byte
/// aligned; a scalar two-pass loop otherwise. Same parameters as v1.
void rmsnorm_v3_warp_vectorized(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* weight, int T, int C,
                                float eps, cudaStream_t stream = 0);

/// v4: the fused residual add + RMSNorm with v3's technique: one kernel reads x and
/// residual once and writes residual and y.
/// @param y        (T, C) device, written fully
/// @param residual (T, C) device, in: residual stream; out: bf16(residual + x)
/// @param x        (T, C) device
/// @param weight   (C)    device
void rmsnorm_v4_fused_residual(__nv_bfloat16* y, __nv_bfloat16* residual, const __nv_bfloat16* x,
                               const __nv_bfloat16* weight, int T, int C, float eps, cudaStream_t stream = 0);

/// v4, launched with programmatic dependent launch when `pdl` is set and the GPU has it
/// (common/pdl.cuh; chapter 07 explains PDL): the kernel may then be scheduled while the
/// previous kernel in the stream still runs, and waits on the GPU (griddepcontrol.wait)
/// before it reads anything. Chapter 08's prefill uses it between its GEMMs.
void rmsnorm_v4_fused_residual_pdl(__nv_bfloat16* y, __nv_bfloat16* residual, const __nv_bfloat16* x,
                                   const __nv_bfloat16* weight, int T, int C, float eps, cudaStream_t stream,
                                   bool pdl);

/// The size check every GPU version runs first, before any CUDA call: throws
/// std::invalid_argument naming `launcher` for T < 0 or C < 0. (C = -8 passed v3's and
/// v4's `C % 8 == 0` test and wrote nothing; a negative T launched nothing or failed the
/// launch with CUDA's generic message.) T = 0 or C = 0 is an empty call and writes nothing.
void rmsnorm_check_sizes(const char* launcher, int T, int C);

/// Every plain RMSNorm version, in order, so tests and the benchmark loop over one list.
using RmsnormLauncher = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, int, int, float,
                                 cudaStream_t);
struct RmsnormVersion {
  const char* name;
  RmsnormLauncher launch;
};
inline constexpr RmsnormVersion kRmsnormVersions[] = {
    {"v1_thread_per_row", rmsnorm_v1_thread_per_row},
    {"v2_block_reduce", rmsnorm_v2_block_reduce},
    {"v3_warp_vectorized", rmsnorm_v3_warp_vectorized},
};

/// Every fused residual + RMSNorm version (one so far; a new idea gets a new number).
using FusedResidualRmsnormLauncher = void (*)(__nv_bfloat16*, __nv_bfloat16*, const __nv_bfloat16*,
                                              const __nv_bfloat16*, int, int, float, cudaStream_t);
struct FusedResidualRmsnormVersion {
  const char* name;
  FusedResidualRmsnormLauncher launch;
};
inline constexpr FusedResidualRmsnormVersion kFusedResidualRmsnormVersions[] = {
    {"v4_fused_residual", rmsnorm_v4_fused_residual},
};

/// The RMSNorm later chapters call (the fastest one measured: v3).
inline void rmsnorm_forward(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* weight, int T, int C,
                            float eps, cudaStream_t stream = 0) {
  rmsnorm_v3_warp_vectorized(y, x, weight, T, C, eps, stream);
}

/// The fused residual add + RMSNorm the decoder layer calls (v4).
inline void fused_residual_rmsnorm_forward(__nv_bfloat16* y, __nv_bfloat16* residual, const __nv_bfloat16* x,
                                           const __nv_bfloat16* weight, int T, int C, float eps,
                                           cudaStream_t stream = 0, bool pdl = false) {
  rmsnorm_v4_fused_residual_pdl(y, residual, x, weight, T, C, eps, stream, pdl);
}

}  // namespace bielik
