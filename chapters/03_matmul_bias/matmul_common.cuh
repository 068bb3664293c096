/// @file matmul_common.cuh
/// @brief Pieces every matmul version shares: the size check, the bias flag, the
/// vector-path test, the epilogue that adds the bias and rounds to bf16.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.cuh"

namespace bielik {

/// The sizes matmul.cuh promises to handle: T >= 0, C_in >= 1, C_out >= 0 (T = 0 or
/// C_out = 0 is an empty product and writes nothing). Anything else is a caller's bug
/// that would otherwise pass silently (a negative C_in made every version store the
/// bias alone; a negative T launched nothing), so every launcher calls this first,
/// before any CUDA call, and it throws std::invalid_argument naming the launcher.
inline void matmul_check_sizes(const char* launcher, int T, int C_in, int C_out) {
  if (T < 0 || C_in < 1 || C_out < 0) {
    throw std::invalid_argument(std::string(launcher) + ": needs T >= 0, C_in >= 1 and C_out >= 0, got T=" +
                                std::to_string(T) + " C_in=" + std::to_string(C_in) +
                                " C_out=" + std::to_string(C_out));
  }
}

/// Throws std::invalid_argument unless 0 <= tile < count (the fixed-tile launchers).
inline void matmul_check_tile(const char* launcher, int tile, int count) {
  if (tile < 0 || tile >= count) {
    throw std::invalid_argument(std::string(launcher) + ": tile " + std::to_string(tile) + " does not exist (0.." +
                                std::to_string(count - 1) + ")");
  }
}

/// Turns the run-time question "is there a bias?" into a compile-time one, once, at the
/// launch: `f` receives std::true_type or std::false_type, whose value, a constant
/// expression, it passes on as the kernel's HasBias template argument. This is the
/// C++ form of a Triton `tl.constexpr` argument: two kernels are compiled, and the
/// one without bias has no bias load, no add and no branch.
template <typename F>
void with_bias_flag(const __nv_bfloat16* bias, F&& f) {
  if (bias) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

/// The vector paths read 16-byte chunks of 8 bf16 along C_in and write pairs of
/// outputs. That needs every row of x and W to start 16-byte aligned (C_in % 8 == 0
/// and 16-byte-aligned base pointers), an even C_out and 4-byte-aligned y and bias.
inline bool matmul_vector_path_ok(const void* y, const void* x, const void* W, const void* bias, int C_in,
                                  int C_out) {
  auto aligned = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return C_in % 8 == 0 && C_out % 2 == 0 && aligned(x, 16) && aligned(W, 16) && aligned(y, 4) && aligned(bias, 4);
}

__device__ __forceinline__ float bf16_to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

/// The bias of output columns col and col + 1 (col even), as fp32; zero past N. The
/// tensor-core epilogues load it once per column pair, before the loop over rows.
/// Paired (the vector path: N even, bias 4-byte aligned) reads both with one load.
template <bool HasBias, bool Paired>
__device__ __forceinline__ float2 load_bias_pair(const __nv_bfloat16* bias,  // (N) or nullptr
                                                 int N, int col) {
  float2 b = make_float2(0.0f, 0.0f);
  if constexpr (HasBias) {
    if constexpr (Paired) {  // N even and col even: col + 1 < N whenever col < N
      if (col < N) b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(bias + col));
    } else {
      if (col < N) b.x = bf16_to_f32(bias[col]);
      if (col + 1 < N) b.y = bf16_to_f32(bias[col + 1]);
    }
  }
  return b;
}

/// Epilogue for the tensor-core versions, whose accumulators come in pairs of adjacent
/// columns (col, col + 1), col even: adds the bias (HasBias only: without it there is
/// not even an add of zero), rounds to bf16 and stores what lies inside the (M, N)
/// output. Paired (N even, y 4-byte aligned) writes both with one 4-byte store.
template <bool HasBias, bool Paired>
__device__ __forceinline__ void store_output_pair(__nv_bfloat16* y,  // (M, N)
                                                  float2 bias, int M, int N, int row, int col, float v0, float v1) {
  if (row >= M || col >= N) return;
  if constexpr (HasBias) {
    v0 += bias.x;
    v1 += bias.y;
  }
  __nv_bfloat16* out = y + size_t(row) * N + col;
  if constexpr (Paired) {
    *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(v0, v1);
  } else {
    out[0] = __float2bfloat16(v0);
    if (col + 1 < N) out[1] = __float2bfloat16(v1);
  }
}

/// Number of SMs of the current GPU (read once: the book uses one GPU per process).
/// Whether an sm_90a kernel (v5, v6) runs on this GPU: sm_90a code runs on compute
/// capability 9.0 exactly, and the attribute query fails when the binary holds no image
/// for this GPU.
template <typename Kernel>
bool sm90a_kernel_runs(Kernel kernel) {
  int device = 0;
  cudaDeviceProp properties{};
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&properties, device) != cudaSuccess) {
    return false;
  }
  cudaFuncAttributes attributes{};
  return properties.major == 9 && properties.minor == 0 && cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess;
}

inline int multiprocessor_count() {
  static const int count = [] {
    int device = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    return sms;
  }();
  return count;
}

/// Picks the output tile shape for an M x N GEMM from `tiles` (each with rows, cols and
/// a relative `efficiency`, the speed of an SM full of such tiles). The kernel ends
/// when its busiest SM does, and that SM runs ceil(tiles / SMs) tiles of rows * cols
/// outputs each: the cost to minimize is that work divided by the efficiency. Big
/// tiles are efficient but few (a 2048 x 1536 output is 96 tiles of 128x256: 36 of 132
/// SMs idle); small tiles balance better. This weighs both ("wave quantization").
template <typename Tile, int Count>
int pick_tile_shape(const Tile (&tiles)[Count], int M, int N) {
  long long sms = multiprocessor_count();
  int best = 0;
  double best_cost = 0;
  for (int i = 0; i < Count; ++i) {
    long long count = (long long)((M + tiles[i].rows - 1) / tiles[i].rows) * ((N + tiles[i].cols - 1) / tiles[i].cols);
    double cost = double((count + sms - 1) / sms) * tiles[i].rows * tiles[i].cols / tiles[i].efficiency;
    if (i == 0 || cost < best_cost) {
      best = i;
      best_cost = cost;
    }
  }
  return best;
}

}  // namespace bielik
