/// @file swiglu.cuh
/// @brief Chapter 06: the SwiGLU MLP, h = silu(x Wg^T + bg) * (x Wu^T + bu), y = h Wd^T + bd.
///
///     g[t, j] = sum_c x[t, c] * Wg[j, c]  (+ bg[j])       t < T, j < F, c < C
///     u[t, j] = sum_c x[t, c] * Wu[j, c]  (+ bu[j])
///     h[t, j] = silu(g[t, j]) * u[t, j]     silu(z) = z / (1 + exp(-z))
///     y[t, c] = sum_j h[t, j] * Wd[c, j]  (+ bd[c])
///
/// Layouts (row-major, HuggingFace's nn.Linear weights as stored, never transposed):
///   x (T, C), Wg (F, C), Wu (F, C), Wd (C, F), bg (F), bu (F), bd (C), h (T, F), y (T, C).
/// Bielik-1.5B: C = 1536, F = 8960, all three biases. SmolLM2-135M: C = 576, F = 1536,
/// no biases (pass nullptr).
///
/// Numerics: bf16 inputs, fp32 accumulation, the biases added and silu(g) * u computed
/// in fp32, h rounded to bf16 once, where it is stored (the model keeps h in bf16
/// between the two halves of the MLP, as HuggingFace does in bf16).
///
/// Biases: bg and bu are both given or both nullptr (a Llama-family MLP has biases on
/// all projections or on none); one without the other throws std::invalid_argument.
/// Inside the kernels the bias is a compile-time flag (`template <bool HasBias>`, the
/// pattern of chapter 03): the instantiation without bias has no bias code at all.
///
/// The gate/up part is where the chapter's versions differ (the down projection is
/// chapter 03's linear layer):
///   v1 unfused            matmul_forward for g, for u, one elementwise kernel, (T, F) x 2
///                         intermediates in global memory
///   v2 epilogue fused     g by matmul_forward; the up GEMM's epilogue reads g and writes
///                         h: one (T, F) intermediate fewer
///   v3 dual GEMM          one tensor-core kernel, two accumulators sharing each x tile;
///                         g and u never leave registers
///   v4 GEMV (T <= 8)      decode: each warp streams row j of Wg and of Wu, writes h[:, j]
///   cublaslt_unfused      the reference: v1 with cuBLASLt at every T
///
/// Sizes: any T >= 0, C >= 1, F >= 1 (std::invalid_argument otherwise, as for a tile
/// index outside a tile table). The fast paths need 16-byte rows (C % 8 == 0) and
/// 16-byte-aligned x, Wg, Wu; paired stores need an even F and 4-byte-aligned h, bg, bu
/// (what cudaMalloc gives). Other shapes or pointers take a scalar path of the same
/// version. All pointers are device pointers; h must not overlap the inputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <climits>

#include "matmul.cuh"

namespace bielik {

// ---------------------------------------------------------------------------------------
// CPU references (plain fp32 loops over fp32 values; bf16 inputs widen exactly)

/// h[i] = silu(g[i]) * u[i] for i < count: the activation product alone.
void swiglu_activation_cpu(float* h, const float* g, const float* u, size_t count);

/// The gate/up half of the MLP, fp32, h not rounded.
/// @param h  (T, F) output
/// @param x  (T, C)
/// @param Wg (F, C)   @param bg (F) or nullptr
/// @param Wu (F, C)   @param bu (F) or nullptr
void swiglu_gate_up_cpu(float* h, const float* x, const float* Wg, const float* bg, const float* Wu,
                        const float* bu, int T, int C, int F);

/// The whole MLP. h is rounded to bf16 before the down projection, as the GPU path (and
/// the model) stores it. Biases are each optional.
/// @param y  (T, C) output
/// @param Wd (C, F)   @param bd (C) or nullptr; the others as in swiglu_gate_up_cpu
void mlp_cpu(float* y, const float* x, const float* Wg, const float* bg, const float* Wu, const float* bu,
             const float* Wd, const float* bd, int T, int C, int F);

// ---------------------------------------------------------------------------------------
// GPU: the elementwise activation (v1's third kernel, and the cuBLASLt baseline's)

/// h[i] = silu(g[i]) * u[i] for i < count, fp32 math, one rounding to bf16. 16-byte
/// vectors when count % 8 == 0 and all three pointers are 16-byte aligned.
/// @param h (count) device, written fully   @param g, u (count) device
void swiglu_activation(__nv_bfloat16* h, const __nv_bfloat16* g, const __nv_bfloat16* u, size_t count,
                       cudaStream_t stream = 0);

// ---------------------------------------------------------------------------------------
// GPU: the gate/up half, one launcher per version (same parameters for all)

/// v1: gate and up through chapter 03's matmul_forward (its GEMV at T = 1, cuBLASLt
/// otherwise), then swiglu_activation. Uses two (T, F) scratch buffers owned by the process
/// (grown on demand, which synchronizes the device): not for CUDA-graph capture. Calls
/// from several host threads or on several streams are safe but serialized: a mutex
/// orders the enqueueing, and each call's stream waits on the GPU for the previous
/// call's kernels to finish with the scratch (an event; swiglu_scratch.cuh).
/// @param h  (T, F) device, written fully
/// @param x  (T, C) device
/// @param Wg (F, C) device   @param bg (F) device or nullptr
/// @param Wu (F, C) device   @param bu (F) device or nullptr (nullptr iff bg is)
void swiglu_v1_unfused(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg, const __nv_bfloat16* bg,
                       const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C, int F,
                       cudaStream_t stream = 0);

/// v2: g = matmul_forward(x, Wg, bg) into one (T, F) scratch buffer (same caveats as v1),
/// then a tensor-core GEMM for x Wu^T whose epilogue reads g and writes silu(g) * (u + bu).
/// Same parameters as v1.
void swiglu_v2_epilogue_fused(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                              const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C,
                              int F, cudaStream_t stream = 0);

/// v2 with a fixed tile shape for its up GEMM (tests and the benchmark).
/// @param tile 0 .. swiglu_v2_tile_count()-1
void swiglu_v2_epilogue_fused_tile(int tile, __nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                                   const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T,
                                   int C, int F, cudaStream_t stream = 0);
int swiglu_v2_tile_count();
const char* swiglu_v2_tile_name(int tile);
int swiglu_v2_pick_tile(int T, int F);

/// v3: one tensor-core kernel (mma.sync m16n8k16, cp.async pipeline): each block loads
/// an x tile once and the matching tiles of Wg and Wu, keeps two sets of fp32
/// accumulators, and its epilogue writes h = silu(g + bg) * (u + bu). No scratch memory.
/// The tile shape is picked per problem (swiglu_v3_pick_tile). Same parameters as v1.
void swiglu_v3_dual_gemm(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                         const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C,
                         int F, cudaStream_t stream = 0);

/// v3 with a fixed tile shape (tests and the benchmark's tile table).
/// @param tile 0 .. swiglu_v3_tile_count()-1
void swiglu_v3_dual_gemm_tile(int tile, __nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                              const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C,
                              int F, cudaStream_t stream = 0);
int swiglu_v3_tile_count();
/// "128x128 (8 warps of 64x32, x2)" etc.: rows of x (T) x columns of h (F) per block.
const char* swiglu_v3_tile_name(int tile);
/// The tile swiglu_v3_dual_gemm uses for this problem on the current device.
int swiglu_v3_pick_tile(int T, int F);

/// Largest T the decode form takes.
inline constexpr int kSwigluGemvMaxTokens = 8;

/// v4, decode (1 <= T <= kSwigluGemvMaxTokens): one warp per output column j reads row
/// j of Wg and row j of Wu with 16-byte streaming loads, all of a lane's loads of both
/// rows in flight at once (C <= 1536: one round), fp32 sums, biases fused, and writes
/// h[t, j] = silu(g) * u for every token. Bandwidth-bound on the 2 * F * C weights.
/// Throws std::invalid_argument for T > kSwigluGemvMaxTokens. Same parameters as v1.
void swiglu_v4_gemv(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg, const __nv_bfloat16* bg,
                    const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C, int F, cudaStream_t stream = 0);

/// The library reference: cuBLASLt for g and for u (bias in its epilogue), then
/// swiglu_activation; v1 with chapter 03's cuBLASLt wrapper forced at every T. On the
/// H200 this is the fastest form from T = 5 up (README.md), so swiglu_gate_up_forward
/// calls it there. Same scratch buffers and caveats as v1. Same parameters as v1.
void swiglu_cublaslt_unfused(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                             const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C,
                             int F, cudaStream_t stream = 0);

/// Every gate/up version, in order, so tests and the benchmark loop over one list.
using SwigluLauncher = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                const __nv_bfloat16*, const __nv_bfloat16*, int, int, int, cudaStream_t);
struct SwigluVersion {
  const char* name;
  SwigluLauncher launch;
  int max_tokens;  ///< largest T it accepts (the GEMV form: kSwigluGemvMaxTokens)
};
inline constexpr SwigluVersion kSwigluVersions[] = {
    {"v1_unfused", swiglu_v1_unfused, INT_MAX},
    {"v2_epilogue_fused", swiglu_v2_epilogue_fused, INT_MAX},
    {"v3_dual_gemm", swiglu_v3_dual_gemm, INT_MAX},
    {"v4_gemv", swiglu_v4_gemv, kSwigluGemvMaxTokens},
    {"cublaslt_unfused", swiglu_cublaslt_unfused, INT_MAX},
};

/// Largest T for which the fused GEMV beats cuBLASLt + elementwise (H200, README.md):
/// its cost grows with T (each weight chunk meets T rows of x), cuBLASLt's barely does.
inline constexpr int kSwigluGemvFasterUpTo = 4;

/// The gate/up half by whatever measured fastest on the H200 (README.md): the fused GEMV
/// (v4) for T <= kSwigluGemvFasterUpTo, i.e. decode, and cuBLASLt gate + up +
/// elementwise above that. Our fused dual GEMM (v3) reaches only 50-93% of cuBLASLt
/// there: fusion saves memory traffic, but mma.sync cannot keep up with cuBLASLt's
/// Hopper (wgmma) kernels once the GEMM is compute-bound.
/// Decode (T <= 4) uses no scratch and is safe to capture in a CUDA graph; larger T
/// uses the process scratch of v1 (swiglu_scratch.cuh: the first call at a new largest
/// T allocates and synchronizes; not capturable). Same parameters as v1.
/// Chapter 08's model does not call it: at prefill it runs ONE GEMM over the
/// concatenated (2F, C) gate/up weights and then its own swiglu_rows (this form's idea
/// in one GEMM, without the scratch); at decode one GEMV with the RMSNorm before it and
/// the SwiGLU in its epilogue (v4's idea, fused further).
inline void swiglu_gate_up_forward(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                                   const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T,
                                   int C, int F, cudaStream_t stream = 0) {
  if (T <= kSwigluGemvFasterUpTo) {
    swiglu_v4_gemv(h, x, Wg, bg, Wu, bu, T, C, F, stream);
  } else {
    swiglu_cublaslt_unfused(h, x, Wg, bg, Wu, bu, T, C, F, stream);
  }
}

/// The whole MLP in one call: h = swiglu_gate_up_forward(...), then chapter 03's
/// matmul_forward for the down projection (bias in its epilogue). The chapter's tests
/// and benchmark use it; chapter 08 builds its MLP from its own fused kernels instead.
/// @param y  (T, C) device, written fully
/// @param h  (T, F) device scratch owned by the caller (the model's activation buffer);
///           holds the bf16 activations afterwards
/// @param Wd (C, F) device   @param bd (C) device or nullptr
/// The other parameters as in swiglu_v1_unfused.
inline void mlp_forward(__nv_bfloat16* y, __nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg,
                        const __nv_bfloat16* bg, const __nv_bfloat16* Wu, const __nv_bfloat16* bu,
                        const __nv_bfloat16* Wd, const __nv_bfloat16* bd, int T, int C, int F,
                        cudaStream_t stream = 0) {
  swiglu_gate_up_forward(h, x, Wg, bg, Wu, bu, T, C, F, stream);
  matmul_forward(y, h, Wd, bd, T, F, C, stream);
}

}  // namespace bielik
