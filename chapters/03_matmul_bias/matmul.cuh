/// @file matmul.cuh
/// @brief Chapter 03: the linear layer y = x W^T + b, where the model spends almost all its time.
///
///     y[t, n] = sum_k x[t, k] * W[n, k]  (+ b[n])      t < T, n < C_out, k < C_in
///
/// Layouts (all row-major, exactly as HuggingFace stores them, no transposed copy):
///   x (T, C_in)      activations, one row per token
///   W (C_out, C_in)  nn.Linear.weight: one row per OUTPUT feature
///   b (C_out)        nn.Linear.bias, or nullptr for a layer without bias
///   y (T, C_out)
/// Every output y[t, n] is the dot product of two contiguous rows, x[t, :] and W[n, :].
/// README.md explains why that layout is already the right one for a row-major kernel
/// and how cuBLAS (column-major) sees the same bytes.
///
/// Numerics: bf16 inputs, fp32 accumulation, bias added in fp32, one rounding to bf16 (every
/// kernel of this chapter; cuBLASLt's bias epilogue with a bf16 output rounds twice, as
/// test_matmul_gpu.cpp found on an H100: up to a bf16 step more).
///
/// The bias is a compile-time flag inside every kernel (`template <bool HasBias>`, the
/// C++ counterpart of Triton's `tl.constexpr`): the launcher turns `bias != nullptr`
/// into one of two instantiations, and the one without bias contains no bias code at
/// all, not even a branch.
///
/// Sizes: any T >= 0, C_in >= 1, C_out >= 0 (T = 0 or C_out = 0 writes nothing); every
/// launcher throws std::invalid_argument for other sizes, before any CUDA call. The fast
/// paths need 16-byte rows (C_in % 8 == 0), an even C_out and 16-byte-aligned pointers
/// (what cudaMalloc returns); any other shape or pointer takes a scalar path of the same
/// version (see each file), except where a launcher below says it throws (gemv_v2, v6,
/// matmul_cublaslt_w_in_out).
///
/// Symbols: T tokens; C_in and C_out the layer's input and output features (for Bielik
/// C = 1536, F = 8960, V = 32000, Hkv * D = 256). Inside the kernels the GEMM names are
/// M = T, N = C_out, K = C_in. All pointers are device pointers; y must not overlap x.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

namespace bielik {

/// Plain C++ reference: fp32 loops over fp32 values (bf16 inputs widened exactly).
/// @param y    (T, C_out) output, fp32, not rounded
/// @param x    (T, C_in)
/// @param W    (C_out, C_in)
/// @param bias (C_out), or nullptr
void matmul_cpu(float* y, const float* x, const float* W, const float* bias, int T, int C_in, int C_out);

/// v1: one thread per output, a plain dot-product loop reading global memory.
/// @param y    (T, C_out) device, written fully
/// @param x    (T, C_in) device
/// @param W    (C_out, C_in) device
/// @param bias (C_out) device, or nullptr for no bias
void matmul_v1_naive(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias,
                     int T, int C_in, int C_out, cudaStream_t stream = 0);

/// v2: 32x32 output tiles; the block stages 32x32 tiles of x and W in shared memory so
/// each loaded value is used 32 times. Same parameters as v1.
void matmul_v2_smem_tiling(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                           const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);

/// v3: 128x128 tiles, each thread computes an 8x8 block of outputs from registers.
/// Same parameters as v1.
void matmul_v3_register_blocking(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                                 const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);

/// v4: bf16 tensor cores (mma.sync m16n8k16, fp32 accumulators), ldmatrix from a
/// swizzled shared-memory tile, cp.async 4-stage pipeline; the tile shape is chosen
/// per problem (matmul_v4_tile_count). Same parameters as v1.
void matmul_v4_tensor_cores(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                            const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);

/// v4 with a fixed tile shape, for the benchmark's "which tile" table.
/// @param tile 0 .. matmul_v4_tile_count()-1 (std::invalid_argument otherwise)
void matmul_v4_tensor_cores_tile(int tile, __nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                                 const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);
int matmul_v4_tile_count();
/// "128x256" etc.
const char* matmul_v4_tile_name(int tile);
/// The tile v4 picks for this problem size on the current device.
int matmul_v4_pick_tile(int T, int C_out);

/// v5: Hopper warpgroup MMA (wgmma, sm_90a only), operands read by the tensor cores
/// straight from 128-byte-swizzled shared memory. Falls back to v4 when C_in % 8 != 0
/// or a pointer is not 16-byte aligned. Call only when matmul_v5_available().
/// Same parameters as v1.
void matmul_v5_wgmma(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias,
                     int T, int C_in, int C_out, cudaStream_t stream = 0);
/// True when this build contains the sm_90a kernels and the current GPU is compute 9.0.
bool matmul_v5_available();
/// v5 with a fixed tile shape (benchmark and tests).
/// @param tile 0 .. matmul_v5_tile_count()-1 (std::invalid_argument otherwise)
void matmul_v5_wgmma_tile(int tile, __nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                          const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);
int matmul_v5_tile_count();
const char* matmul_v5_tile_name(int tile);
int matmul_v5_pick_tile(int T, int C_out);

/// The reference GEMM: cuBLASLt, bf16 in/out, fp32 compute, the bias added by its
/// epilogue (CUBLASLT_EPILOGUE_BIAS). One handle, one 32 MiB workspace and one cached
/// plan per (shape, bias, alignment) for the whole process; calls from several host
/// threads are serialized, and two streams must not run it concurrently (one shared
/// workspace). Shapes or alignments cuBLASLt refuses (2-byte-aligned tensors) run on
/// v4 instead. Same parameters as v1.
void matmul_cublaslt(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias,
                     int T, int C_in, int C_out, cudaStream_t stream = 0);

/// The same product with the weights stored the other way round: y = x W + b with
/// W_in_out (C_in, C_out) row-major, which cuBLAS reads as a column-major C_out x C_in
/// matrix, so no operand is transposed (the NN GEMM). Chapter 08 keeps its down
/// projection in that layout when its fused decode MLP needs W_down's columns contiguous
/// (decode_mlp_fused.cuh). Throws std::invalid_argument where cuBLASLt refuses the call
/// (no kernel of ours reads that layout): pass 16-byte aligned tensors.
void matmul_cublaslt_w_in_out(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W_in_out,
                              const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);

/// Largest T the GEMV kernels take.
inline constexpr int kGemvMaxTokens = 8;

/// GEMV for decode (1 <= T <= kGemvMaxTokens): one warp per output row (or a few warps
/// splitting a row when C_out is small), 16-byte streaming loads of W with several in
/// flight, every W value used for all T rows of x. Bandwidth-bound on W.
/// Throws std::invalid_argument for T > kGemvMaxTokens. Same parameters as v1.
void gemv_v1_warp_per_row(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                          const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);

/// Largest T gemv_v2_tensor_cores takes: two 8-token column tiles.
inline constexpr int kGemvV2MaxTokens = 16;

/// Whether gemv_v2_tensor_cores takes this call: 1 <= T <= kGemvV2MaxTokens, C_in % 8 == 0,
/// 16-byte aligned x and W.
bool gemv_v2_supported(const __nv_bfloat16* x, const __nv_bfloat16* W, int T, int C_in);

/// The same product for a few tokens on the tensor cores (mma.sync, sm_80+): a block per 16
/// weight rows, the tokens as the mma's 8 (or 16) columns, every weight read once for all
/// of them. For short prefills, where cuBLASLt's GEMMs read the weights well below the
/// GEMV's rate. Throws std::invalid_argument where gemv_v2_supported says no (T = 0 writes
/// nothing). Same parameters as v1.
void gemv_v2_tensor_cores(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                          const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);

/// Largest T matmul_v6_few_tokens takes: 64 tokens, the widest column tile it has.
inline constexpr int kMatmulV6MaxTokens = 64;

/// Whether this build and GPU can run v6 (sm_90a code on compute capability 9.0).
bool matmul_v6_available();
/// Whether matmul_v6_few_tokens takes this call: 1 <= T <= kMatmulV6MaxTokens,
/// C_in % 8 == 0, 16-byte aligned x and W.
bool matmul_v6_supported(const __nv_bfloat16* x, const __nv_bfloat16* W, int T, int C_in);
/// How many blocks of a cluster v6 splits K over for this call (1..8): as many as keep
/// its grid in one wave of the GPU.
int matmul_v6_splits(int T, int C_in, int C_out);

/// v6: a few tokens on Hopper's wgmma with the operands swapped (64 weight rows as the M
/// side, the tokens as N = 16, 32 or 64) and K split over a thread-block cluster whose
/// partial tiles meet in distributed shared memory. For short prefills, which read the
/// weights once, as decode does. Call only when matmul_v6_available(); throws
/// std::invalid_argument where matmul_v6_supported says no (T = 0 writes nothing). Same
/// parameters as v1.
void matmul_v6_few_tokens(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                          const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);
/// v6's instances (column tile, stages, k tiles a stage), for the tests and the benchmark.
int matmul_v6_config_count();
const char* matmul_v6_config_name(int config);
/// The largest T instance `config` takes (its column tile: 16, 32 or 64).
int matmul_v6_config_max_tokens(int config);
/// v6 on instance `config` with `splits` (0: chosen as matmul_v6_splits does). Throws
/// std::invalid_argument for a config that does not exist or takes fewer than T tokens.
void matmul_v6_few_tokens_config(int config, int splits, __nv_bfloat16* y, const __nv_bfloat16* x,
                                 const __nv_bfloat16* W, const __nv_bfloat16* bias, int T, int C_in, int C_out,
                                 cudaStream_t stream = 0);
/// v6 with a fixed split count (tests and the benchmark). @param splits 1..8, or 0 for
/// matmul_v6_splits' choice
void matmul_v6_few_tokens_splits(int splits, __nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                                 const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0);

/// Every GEMM version, in order, so tests and the benchmark loop over one list.
using MatmulLauncher = void (*)(__nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*, const __nv_bfloat16*,
                                int, int, int, cudaStream_t);
inline bool matmul_always_available() { return true; }
struct MatmulVersion {
  const char* name;
  MatmulLauncher launch;
  bool (*available)();  ///< false: this build or GPU cannot run it (v5 off Hopper)
};
inline constexpr MatmulVersion kMatmulVersions[] = {
    {"v1_naive", matmul_v1_naive, matmul_always_available},
    {"v2_smem_tiling", matmul_v2_smem_tiling, matmul_always_available},
    {"v3_register_blocking", matmul_v3_register_blocking, matmul_always_available},
    {"v4_tensor_cores", matmul_v4_tensor_cores, matmul_always_available},
    {"v5_wgmma", matmul_v5_wgmma, matmul_v5_available},
    {"cublaslt", matmul_cublaslt, matmul_always_available},
};

/// What the model calls, chosen from the H200 measurements in README.md: the GEMV for
/// decode (T = 1), where, launched back to back, it beats cuBLASLt on every Bielik
/// shape; cuBLASLt for T >= 2, where it is the fastest on the large layers (our GEMV
/// re-reads x per row and loses from T = 2 on gate/up/down; our best GEMM, v5, reaches
/// 70-83% of it at T = 2048: bench_h200_v5_tiles.txt, gate/up 70.0% to down 82.6%).
/// Same parameters as v1.
inline void matmul_forward(__nv_bfloat16* y, const __nv_bfloat16* x, const __nv_bfloat16* W,
                           const __nv_bfloat16* bias, int T, int C_in, int C_out, cudaStream_t stream = 0) {
  if (T == 1) {
    gemv_v1_warp_per_row(y, x, W, bias, T, C_in, C_out, stream);
  } else {
    matmul_cublaslt(y, x, W, bias, T, C_in, C_out, stream);
  }
}

}  // namespace bielik
