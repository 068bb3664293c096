// v4: decode (T = 1..8). Fused gate/up GEMV: one warp per feature j streams row j of
// Wg and row j of Wu and writes h[t, j] = silu(g + bg) * (u + bu) for every token.
//
// Why a separate form: at T = 1 the gate/up half reads 2 * F * C bf16 weights (55 MB
// for Bielik) and does 2 FLOPs per weight; a tensor-core tile of 16+ rows would be
// >94% padding, and all that matters is streaming the weights at the full memory
// bandwidth, once. The ceiling is the copy bandwidth: 55 MB at ~4.2 TB/s is ~13 us.
//
// What changed from running chapter 03's GEMV twice (what v1 does at T = 1):
//  * One launch instead of three (gate GEMV, up GEMV, activation): at ~13 us per MLP
//    half, 2-3 us of launch gaps and tails are worth a fifth of the time.
//  * g and u never leave registers: no (T, F) intermediates (tiny at T = 1, but two
//    more kernels' worth of latency).
//  * Twice the bytes in flight per warp: a lane issues all its 16-byte loads of BOTH
//    rows before it uses the first. With C = 1536 a row is 192 chunks, 6 per lane, so
//    a lane has 12 loads (192 bytes) in flight and the warp 6 KB: by Little's law the
//    GPU needs ~4 MB in flight (4.3 TB/s x ~1 us); ~3 warps per SM already suffice,
//    and the whole row is read in one round trip. U (the loads per row per round) is
//    a template parameter picked from C: 2, 4, 6 or 8 (then several rounds).
//  * Weights are read with ld.global.nc.L1::no_allocate (used once; x, which every warp
//    re-reads, stays in L1). Each weight chunk, once in registers, is multiplied with
//    all T rows of x: W is read once for all tokens, so T = 8 costs barely more HBM
//    traffic than T = 1.
//  * fp32 sums per lane, a shuffle reduction of the 2T sums, biases and silu in fp32
//    by lane t for token t, one rounding to bf16.
//
// No row splitting (chapter 03 splits a row over several warps when C_out is small):
// F >= 1536 in every model this book runs gives >= 1536 warps, enough to fill an H200
// with the 12 loads in flight each.
//
// Odd sizes: with C % 8 != 0 or misaligned x/Wg/Wu, the Vector = false instantiation
// loads the same chunks element by element, reading the tail beyond C as zero.
#include <cstdint>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "matmul_common.cuh"
#include "matmul_ptx.cuh"
#include "swiglu.cuh"
#include "swiglu_device.cuh"

namespace bielik {

namespace {

constexpr int kV4Warps = 8;  // warps (features j) per block

// Chunk `chunk` (8 bf16 from k = 8 * chunk) of a row of length K, zeros past K.
// Streaming: weights (no L1 allocation); otherwise x (through L1, re-read by every warp).
template <bool Vector, bool Streaming>
__device__ __forceinline__ uint4 load_chunk(const __nv_bfloat16* row, int chunk, int K) {
  if constexpr (Vector) {
    const void* p = row + size_t(chunk) * 8;
    return Streaming ? ptx::load_streaming_16(p) : __ldg(reinterpret_cast<const uint4*>(p));
  } else {
    uint32_t words[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      int k = chunk * 8 + 2 * i;
      uint32_t lo = k < K ? __bfloat16_as_ushort(row[k]) : 0u;
      uint32_t hi = k + 1 < K ? __bfloat16_as_ushort(row[k + 1]) : 0u;
      words[i] = lo | (hi << 16);
    }
    return make_uint4(words[0], words[1], words[2], words[3]);
  }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace

template <int T, int U, bool HasBias, bool Vector>
__global__ void __launch_bounds__(32 * kV4Warps)
    swiglu_v4_gemv_kernel(__nv_bfloat16* h,          // (T, N) = (T, F)
                          const __nv_bfloat16* x,    // (T, K) = (T, C)
                          const __nv_bfloat16* Wg,   // (N, K)
                          const __nv_bfloat16* bg,   // (N), unused when !HasBias
                          const __nv_bfloat16* Wu,   // (N, K)
                          const __nv_bfloat16* bu,   // (N), unused when !HasBias
                          int N, int K) {
  int lane = threadIdx.x & 31;
  int j = blockIdx.x * kV4Warps + (threadIdx.x >> 5);
  if (j >= N) return;  // whole warps only, and no block-wide barrier below
  const __nv_bfloat16* g_row = Wg + size_t(j) * K;
  const __nv_bfloat16* u_row = Wu + size_t(j) * K;
  int chunks = (K + 7) / 8;

  float acc_g[T], acc_u[T];
#pragma unroll
  for (int t = 0; t < T; ++t) acc_g[t] = acc_u[t] = 0.0f;

  for (int base = lane; base < chunks; base += U * 32) {
    uint4 wg[U], wu[U];
#pragma unroll
    for (int i = 0; i < U; ++i) {  // every load of both rows first...
      int chunk = base + i * 32;
      bool inside = chunk < chunks;
      wg[i] = inside ? load_chunk<Vector, true>(g_row, chunk, K) : make_uint4(0, 0, 0, 0);
      wu[i] = inside ? load_chunk<Vector, true>(u_row, chunk, K) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < U; ++i) {  // ...then the arithmetic
      int chunk = base + i * 32;
      if (chunk >= chunks) break;
      float g8[8], u8[8];
      unpack_bf16x8(g8, wg[i]);
      unpack_bf16x8(u8, wu[i]);
#pragma unroll
      for (int t = 0; t < T; ++t) {
        float x8[8];
        unpack_bf16x8(x8, load_chunk<Vector, false>(x + size_t(t) * K, chunk, K));
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          acc_g[t] += g8[k] * x8[k];
          acc_u[t] += u8[k] * x8[k];
        }
      }
    }
  }

  float bias_g = 0.0f, bias_u = 0.0f;
  if constexpr (HasBias) {
    bias_g = __bfloat162float(bg[j]);
    bias_u = __bfloat162float(bu[j]);
  }
#pragma unroll
  for (int t = 0; t < T; ++t) {
    float g = add_bias<HasBias>(warp_sum(acc_g[t]), bias_g);
    float u = add_bias<HasBias>(warp_sum(acc_u[t]), bias_u);
    if (lane == t) h[size_t(t) * N + j] = __float2bfloat16(silu(g) * u);  // t stays a compile-time index
  }
}

namespace {

template <int T, int U>
void v4_launch(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg, const __nv_bfloat16* bg,
               const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int N, int K, bool vector, cudaStream_t stream) {
  int blocks = (N + kV4Warps - 1) / kV4Warps;
  with_bias_flag(bg, [&](auto has_bias) {
    constexpr bool kHasBias = decltype(has_bias)::value;
    if (vector) {
      swiglu_v4_gemv_kernel<T, U, kHasBias, true><<<blocks, 32 * kV4Warps, 0, stream>>>(h, x, Wg, bg, Wu, bu, N, K);
    } else {  // the scalar path: U = 2 only (its speed does not matter)
      swiglu_v4_gemv_kernel<T, 2, kHasBias, false><<<blocks, 32 * kV4Warps, 0, stream>>>(h, x, Wg, bg, Wu, bu, N, K);
    }
  });
  CUDA_CHECK_LAUNCH();
}

// U = the smallest of 2, 4, 6, 8 that covers a lane's chunks of one row (capped at 8:
// longer rows take several rounds). Bielik C = 1536: 6; SmolLM2 C = 576: 3 -> 4.
template <int T>
void v4_launch_tokens(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg, const __nv_bfloat16* bg,
                      const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int N, int K, bool vector,
                      cudaStream_t stream) {
  int per_lane = ((K + 7) / 8 + 31) / 32;
  if (!vector || per_lane <= 2) {
    v4_launch<T, 2>(h, x, Wg, bg, Wu, bu, N, K, vector, stream);
  } else if (per_lane <= 4) {
    v4_launch<T, 4>(h, x, Wg, bg, Wu, bu, N, K, vector, stream);
  } else if (per_lane <= 6) {
    v4_launch<T, 6>(h, x, Wg, bg, Wu, bu, N, K, vector, stream);
  } else {
    v4_launch<T, 8>(h, x, Wg, bg, Wu, bu, N, K, vector, stream);
  }
}

}  // namespace

void swiglu_v4_gemv(__nv_bfloat16* h, const __nv_bfloat16* x, const __nv_bfloat16* Wg, const __nv_bfloat16* bg,
                    const __nv_bfloat16* Wu, const __nv_bfloat16* bu, int T, int C, int F, cudaStream_t stream) {
  swiglu_check_shape("swiglu_v4_gemv", T, C, F);
  if (T > kSwigluGemvMaxTokens) {
    throw std::invalid_argument("swiglu_v4_gemv: T=" + std::to_string(T) + " > " +
                                std::to_string(kSwigluGemvMaxTokens) + "; use a GEMM form");
  }
  swiglu_has_bias(bg, bu);
  if (T == 0) return;
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool vector = C % 8 == 0 && aligned(x) && aligned(Wg) && aligned(Wu);
  switch (T) {  // T becomes a compile-time constant: the sums live in registers
    case 1: v4_launch_tokens<1>(h, x, Wg, bg, Wu, bu, F, C, vector, stream); break;
    case 2: v4_launch_tokens<2>(h, x, Wg, bg, Wu, bu, F, C, vector, stream); break;
    case 3: v4_launch_tokens<3>(h, x, Wg, bg, Wu, bu, F, C, vector, stream); break;
    case 4: v4_launch_tokens<4>(h, x, Wg, bg, Wu, bu, F, C, vector, stream); break;
    case 5: v4_launch_tokens<5>(h, x, Wg, bg, Wu, bu, F, C, vector, stream); break;
    case 6: v4_launch_tokens<6>(h, x, Wg, bg, Wu, bu, F, C, vector, stream); break;
    case 7: v4_launch_tokens<7>(h, x, Wg, bg, Wu, bu, F, C, vector, stream); break;
    default: v4_launch_tokens<8>(h, x, Wg, bg, Wu, bu, F, C, vector, stream); break;
  }
}

}  // namespace bielik
