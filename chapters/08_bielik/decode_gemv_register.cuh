/// @file decode_gemv_register.cuh
/// @brief The register GEMV's compiled forms, as decode_gemv (decode_kernels.cu) calls them.
///
/// The definitions are in decode_gemv_register_kernels.cuh; each form is compiled
/// (explicitly instantiated) in exactly one decode_gemv_register_*.cu file:
///
/// | input | outputs | file |
/// |---|---|---|
/// | kPlain | all five | decode_gemv_register_plain.cu |
/// | kRmsNorm | kSwiGLU, kBf16, kResidualAdd | decode_gemv_register_rmsnorm.cu |
/// | kRmsNorm | kRopeAppend, kF32 | decode_gemv_register_rmsnorm_qkv_lm_head.cu |
/// | kAttentionMerge | kResidualAdd | decode_gemv_register_partials.cu |
/// | kRmsNormAddPartials | kSwiGLU, kRopeAppend, kF32 | decode_gemv_register_partials.cu |
///
/// A form asked for but compiled nowhere is a link error, not a silent fallback.
#pragma once

#include <cuda_runtime.h>

#include "decode_kernels.cuh"

namespace bielik {
namespace register_gemv {

/// Launches the register GEMV for input `In` and output `Out` on `stream`: picks the
/// instance (bias or not, batch size, the options of DecodeGemvParams) and the grid (one
/// wave). `pipelined`: decode_gemv_pipelined_kernel (DecodeGemvKernel::kRegisterPipelined)
/// instead of the default kernel. decode_gemv has checked `p` before.
template <GemvInput In, GemvOutput Out>
void launch(const DecodeGemvParams& p, bool pipelined, bool pdl, cudaStream_t stream);

}  // namespace register_gemv
}  // namespace bielik
