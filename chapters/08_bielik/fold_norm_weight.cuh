/// @file fold_norm_weight.cuh
/// @brief Chapter 08: an RMSNorm's weight folded into the matrix that reads its output
/// (CudaModelOptions::fold_qkv_norm: QKV's input norm; fold_gate_up_norm: gate/up's
/// post-attention norm), once at load.
///
/// Why. QKV reads RMSNorm(x) = x * inverse_rms * g. In the decode step its GEMV must
/// finish that vector before its first dot product: after the PDL wait, the block sums
/// x's squares, meets at a barrier, and rewrites x scaled by inverse_rms * g before a
/// second barrier. On the H200 that stretch cost the step 1.7% (1003 against 1020
/// tokens/s with the fold, three rounds each; DECODE_LOG.md, fortieth session).
///
/// How. Column k of W only ever meets x_k * inverse_rms * g_k, so g can live in W:
/// W'[n][k] = W[n][k] g[k]. What is left of the norm, inverse_rms, is one number for the
/// whole vector, and a dot product is linear: W' (x * inverse_rms) = inverse_rms (W' x).
/// The GEMV then stages x as it is, starts its dot products at once, and scales the dot
/// products in its epilogue (DecodeGemvParams::norm_in_epilogue); on the tensor cores the
/// block's sum of squares meets the dots at the barrier they take anyway, on the register
/// kernel (gate/up) each warp sums x's squares inside its first row's dots, which read all
/// of x (+0.7%, DECODE_LOG.md forty-first session). The norm's weight becomes a
/// vector of ones, so every other path (the prefill's norm kernel, the pipelined and
/// bulk-stream GEMVs, the fused MLP) computes the same model.
///
/// What it costs. Not the values bit for bit: W' is rounded to bf16 (one more rounding
/// of each weight, 2^-9 relative at most), and the decode GEMV no longer rounds the
/// normalized x to bf16 before the dot products (the prefill's norm kernel still does).
/// Both are of the size of the bf16 roundings the model makes everywhere; the model's
/// tests hold it to the same tolerance against the CPU backend, which does not fold.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace bielik {

/// W (rows, cols) row-major, in place: W[n][k] <- bf16(W[n][k] * g[k]) (round to
/// nearest even), for g (cols). Throws std::invalid_argument on a size <= 0 or a null
/// pointer.
void fold_norm_weight_into_columns(__nv_bfloat16* W, const __nv_bfloat16* g, int rows, int cols,
                                   cudaStream_t stream = 0);

}  // namespace bielik
